//! The worked configurations in `config/examples/` are documentation users
//! copy: each must parse, validate and describe the timers it says it does,
//! so a typo in one fails here and not in a shop's deployment.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Release, Settings, StatusValue, Timer};

/// Every file in `config/examples/`, by name.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "litemall-mysql.toml",
        include_str!("../../config/examples/litemall-mysql.toml"),
    ),
    (
        "litemall-timers-mysql.toml",
        include_str!("../../config/examples/litemall-timers-mysql.toml"),
    ),
    (
        "mall-mysql.toml",
        include_str!("../../config/examples/mall-mysql.toml"),
    ),
    (
        "mall-timers-mysql.toml",
        include_str!("../../config/examples/mall-timers-mysql.toml"),
    ),
    (
        "reference.toml",
        include_str!("../../config/examples/reference.toml"),
    ),
    (
        "saleor-postgres.toml",
        include_str!("../../config/examples/saleor-postgres.toml"),
    ),
    (
        "yudao-timers-postgres.toml",
        include_str!("../../config/examples/yudao-timers-postgres.toml"),
    ),
];

fn example(name: &str) -> Settings {
    let (_, text) = EXAMPLES
        .iter()
        .find(|(file, _)| *file == name)
        .unwrap_or_else(|| panic!("{name} is not in EXAMPLES"));
    let settings: Settings = toml::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
    settings
        .validate()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    settings
}

/// What one timer of an example must be: name, table, status column,
/// from, to, event and watch window.
struct Expected {
    name: &'static str,
    table: &'static str,
    status: &'static str,
    from: StatusValue,
    to: StatusValue,
    event: &'static str,
    watch: Option<Duration>,
}

const MINUTE: Option<Duration> = Some(Duration::from_secs(60));

fn int(code: i64) -> StatusValue {
    StatusValue::Int(code)
}

fn text(code: &str) -> StatusValue {
    StatusValue::Text(code.to_owned())
}

fn check(file: &str, expected: &[Expected]) -> Vec<Timer> {
    let timers = example(file).timers().unwrap();
    let names: Vec<&str> = timers.iter().map(|t| t.name.as_str()).collect();
    let wanted: Vec<&str> = expected.iter().map(|e| e.name).collect();
    assert_eq!(names, wanted, "{file}: timers");
    for (timer, e) in timers.iter().zip(expected) {
        let got = (
            timer.table.as_str(),
            timer.status.as_str(),
            &timer.from,
            &timer.to,
            timer.event.as_str(),
            timer.watch,
        );
        let want = (e.table, e.status, &e.from, &e.to, e.event, e.watch);
        assert_eq!(got, want, "{file}: timer {}", e.name);
        assert!(!timer.deadline.trim().is_empty(), "{file}: {}", e.name);
    }
    timers
}

#[test]
fn every_example_is_listed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples");
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    let listed: BTreeSet<String> = EXAMPLES.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(on_disk, listed, "add new examples to EXAMPLES");
}

#[test]
fn every_example_parses_and_validates() {
    for (file, _) in EXAMPLES {
        let settings = example(file);
        let timers = settings.timers().unwrap();
        assert_eq!(timers[0].name.as_str(), "cancel_unpaid", "{file}");
        assert_eq!(timers[0].event, "order.cancelled", "{file}");
    }
}

#[test]
fn also_statements_use_their_dialects_placeholder() {
    for (file, _) in EXAMPLES {
        let (mine, other) = if file.contains("-mysql") {
            ("?", "$1")
        } else if file.contains("-postgres") {
            ("$1", "?")
        } else {
            continue;
        };
        for timer in example(file).timers().unwrap() {
            for statement in &timer.also {
                assert!(
                    statement.contains(mine) && !statement.contains(other),
                    "{file}: timer {}: an `also` statement takes the id as {mine}: {statement}",
                    timer.name
                );
            }
        }
    }
}

#[test]
fn mall_runs_the_four_clocks_of_oms_order_setting() {
    let timers = check(
        "mall-timers-mysql.toml",
        &[
            Expected {
                name: "cancel_unpaid",
                table: "oms_order",
                status: "status",
                from: int(0),
                to: int(4),
                event: "order.cancelled",
                watch: None,
            },
            Expected {
                name: "auto_receive",
                table: "oms_order",
                status: "status",
                from: int(2),
                to: int(3),
                event: "order.received",
                watch: MINUTE,
            },
            Expected {
                name: "auto_complete",
                table: "oms_order",
                status: "finish_status",
                from: int(0),
                to: int(1),
                event: "order.completed",
                watch: MINUTE,
            },
            Expected {
                name: "default_review",
                table: "oms_order",
                status: "comment_status",
                from: int(0),
                to: int(1),
                event: "order.reviewed",
                watch: MINUTE,
            },
        ],
    );
    for timer in &timers {
        assert_eq!(timer.time_zone.as_deref(), Some("+08:00"), "{}", timer.name);
        assert_eq!(timer.release, Release::None, "{}", timer.name);
    }
    // Stock, coupon and points back on cancel; one review row per line.
    assert_eq!(timers[0].also.len(), 3);
    assert!(timers[0].also[0].contains("lock_stock"));
    assert_eq!(timers[1].set["confirm_status"], "1");
    assert!(timers[1].set.contains_key("receive_time"));
    assert!(timers[1].deadline.contains("auto_confirm_day"));
    assert!(timers[3].also[0].contains("INSERT INTO pms_comment"));
}

#[test]
fn litemall_replaces_its_delay_queue_and_cron_jobs() {
    let timers = check(
        "litemall-timers-mysql.toml",
        &[
            Expected {
                name: "cancel_unpaid",
                table: "litemall_order",
                status: "order_status",
                from: int(101),
                to: int(103),
                event: "order.cancelled",
                watch: None,
            },
            Expected {
                name: "auto_receive",
                table: "litemall_order",
                status: "order_status",
                from: int(301),
                to: int(402),
                event: "order.received",
                watch: MINUTE,
            },
            Expected {
                name: "coupon_expiry",
                table: "litemall_coupon_user",
                status: "status",
                from: int(0),
                to: int(2),
                event: "coupon.expired",
                watch: MINUTE,
            },
            Expected {
                name: "coupon_rule_expiry",
                table: "litemall_coupon",
                status: "status",
                from: int(0),
                to: int(1),
                event: "coupon.rule_expired",
                watch: MINUTE,
            },
        ],
    );
    // litemall's optimistic lock compares update_time: every flip moves it.
    for timer in &timers {
        assert!(timer.set.contains_key("update_time"), "{}", timer.name);
    }
    assert_eq!(timers[0].also.len(), 2);
    assert_eq!(timers[1].set["confirm_time"], "NOW()");
}

#[test]
fn yudao_replaces_its_trade_and_coupon_jobs() {
    let timers = check(
        "yudao-timers-postgres.toml",
        &[
            Expected {
                name: "cancel_unpaid",
                table: "trade_order",
                status: "status",
                from: int(0),
                to: int(40),
                event: "order.cancelled",
                watch: None,
            },
            Expected {
                name: "auto_receive",
                table: "trade_order",
                status: "status",
                from: int(20),
                to: int(30),
                event: "order.received",
                watch: MINUTE,
            },
            Expected {
                name: "auto_comment",
                table: "trade_order",
                status: "comment_status",
                from: text("false"),
                to: text("true"),
                event: "order.reviewed",
                watch: MINUTE,
            },
            Expected {
                name: "coupon_expiry",
                table: "promotion_coupon",
                status: "status",
                from: int(1),
                to: int(3),
                event: "coupon.expired",
                watch: MINUTE,
            },
        ],
    );
    assert_eq!(timers[0].set["cancel_type"], "10");
    assert!(timers[0].guard.contains("pay_order"));
    // Every row the service inserts takes its id from yudao's sequence and
    // the order's tenant.
    for timer in &timers {
        for statement in timer.also.iter().filter(|s| s.contains("INSERT")) {
            assert!(statement.contains("nextval('"), "{statement}");
            assert!(statement.contains("tenant_id"), "{statement}");
        }
    }
    assert_eq!(timers[2].also.len(), 3);
}
