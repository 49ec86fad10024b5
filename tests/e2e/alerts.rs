//! The monitoring files in `deploy/`, checked with Prometheus's own
//! `promtool` (Debian's `prometheus` package; `scripts/ensure-services.sh
//! --ops-tools` installs it): the alert rules are valid and their unit
//! tests pass (each alert fires on the series that should fire it and
//! stays silent otherwise), the Grafana dashboard's queries are valid
//! PromQL over metrics the service serves, and the compose stack's
//! Prometheus configuration loads the rules.

use std::path::{Path, PathBuf};
use std::process::Command;

use order_timeout::testing::metrics::Metrics;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file)
}

/// Runs `promtool ARGS`, failing the test with its output unless it
/// succeeds.
fn promtool(args: &[&str]) -> String {
    let binary = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let out = crate::bounds::output_within(
        Command::new(&binary).args(args),
        std::time::Duration::from_secs(120),
        &format!(
            "{binary} {args:?} (scripts/ensure-services.sh --ops-tools installs Debian's prometheus package)"
        ),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

fn read(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The alert names a rules file defines.
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

#[test]
fn every_alert_is_valid_and_tested_firing_and_silent() {
    let rules = deploy("prometheus-alerts.yml");
    let tests = deploy("prometheus-alerts.test.yml");
    promtool(&["check", "rules", rules.to_str().unwrap()]);
    let out = promtool(&["test", "rules", tests.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");

    // Which alerts the unit tests expect firing (exp_alerts with items) and
    // silent (exp_alerts: []).
    let text = read(&tests);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut firing = Vec::new();
    let mut silent = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("alertname:") {
            let expected = lines[i + 1..]
                .iter()
                .find(|l| l.starts_with("exp_alerts:"))
                .expect("exp_alerts after alertname");
            let name = name.trim().to_owned();
            if *expected == "exp_alerts: []" {
                silent.push(name);
            } else {
                firing.push(name);
            }
        }
    }
    let names = alert_names(&read(&rules));
    assert!(names.len() >= 8, "{names:?}");
    for name in &names {
        assert!(firing.contains(name), "no test where {name} fires");
        assert!(silent.contains(name), "no test where {name} stays silent");
    }
}

/// Every `"expr"` of the dashboard, in panel order.
fn dashboard_queries() -> Vec<String> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&deploy("grafana-dashboard.json"))).expect("dashboard is JSON");
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

#[test]
fn the_dashboard_queries_are_valid_promql_over_served_metrics() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    // Each query as a recording rule: `promtool check rules` parses it.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        assert!(
            !q.contains('$'),
            "no Grafana variables in queries (promtool cannot check them): {q}"
        );
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(q).unwrap()
        ));
    }
    let file = std::env::temp_dir().join(format!(
        "order-timeout-dashboard-{}.yml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, rules).unwrap();
    let checked =
        std::panic::catch_unwind(|| promtool(&["check", "rules", file.to_str().unwrap()]));
    let _ = std::fs::remove_file(&file);
    let out = checked.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{out}"
    );

    // Every metric a query reads is on /metrics.
    let served = Metrics::with_every_series().render();
    for q in &queries {
        for (at, _) in q.match_indices("order_timeout_") {
            let rest = &q[at..];
            let name = &rest[..rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len())];
            assert!(
                served
                    .lines()
                    .any(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{'])),
                "the dashboard reads {name}, which /metrics does not serve"
            );
        }
    }
}

#[test]
fn the_compose_prometheus_loads_the_rules() {
    let out = promtool(&[
        "check",
        "config",
        deploy("prometheus.yml").to_str().unwrap(),
    ]);
    let alerts = alert_names(&read(&deploy("prometheus-alerts.yml"))).len();
    assert!(
        out.contains(&format!("SUCCESS: {alerts} rules found")),
        "{out}"
    );
    let compose = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("docker-compose.yml"));
    for mount in [
        "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml",
        "./deploy/prometheus-alerts.yml:/etc/prometheus/prometheus-alerts.yml",
    ] {
        assert!(compose.contains(mount), "docker-compose.yml lacks {mount}");
    }
}
