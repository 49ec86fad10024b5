//! Credentials never appear in anything a command prints — logs at every
//! level, errors, `--help`, `Debug` — whatever form the URL carries them in:
//! userinfo, `password=`, `sslpassword=`, tokens and inline key material in
//! query parameters, a malformed URL, a list of broker nodes.
//!
//! Every command of the production binary runs with such URLs (right and
//! wrong credentials, so both the working and the failing paths print), at
//! `RUST_LOG=trace`, and everything it wrote is searched for the secrets.

use std::process::{Command, Stdio};
use std::time::Duration;

use order_timeout::settings::{SecretUrl, Settings};
use order_timeout_tools::scratch;

use crate::common::TestEnv;

/// A broker user of the test's own, deleted on drop.
struct BrokerUser(String);

impl BrokerUser {
    fn create(vhost: &str, user: &str, password: &str) -> Self {
        let run = |args: &[&str]| {
            scratch::rabbitmqctl(args).unwrap_or_else(|e| panic!("{e}"));
        };
        run(&["add_user", user, password]);
        run(&["set_permissions", "-p", vhost, user, ".*", ".*", ".*"]);
        Self(user.to_owned())
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = scratch::rabbitmqctl(&["delete_user", &self.0]);
    }
}

/// The URL with this userinfo (password `None`: none).
fn with_user(url: &str, user: &str, password: Option<&str>) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_username(user).unwrap();
    url.set_password(password).unwrap();
    url.to_string()
}

/// The URL with these query parameters appended.
fn with_params(url: &str, params: &[(&str, &str)]) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.query_pairs_mut().extend_pairs(params);
    url.to_string()
}

/// One run of the binary: its arguments and the URLs it gets.
struct Run {
    args: Vec<&'static str>,
    amqp: String,
    database: String,
    inventory: String,
    /// Stopped with SIGTERM after this long (for `serve`).
    stop_after: Option<Duration>,
}

/// Runs the binary and returns everything it wrote.
async fn output_of(run: &Run, config: &std::path::Path) -> String {
    let child = Command::new(env!("CARGO_BIN_EXE_order-timeout"))
        .args(&run.args)
        .env("AMQP_URL", &run.amqp)
        .env("DATABASE_URL", &run.database)
        .env("INVENTORY_URL", &run.inventory)
        .env("HTTP_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "trace")
        .env("ORDER_TIMEOUT_CONFIG", config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start order-timeout");
    if let Some(after) = run.stop_after {
        tokio::time::sleep(after).await;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_prints_a_credential_in_any_url_form() {
    let env = TestEnv::new().await;
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let secret = |tag: &str| format!("{tag}S3cret{suffix}");
    let (amqp_pw, wrong_pw) = (secret("Amqp"), secret("Wrong"));
    let user = format!("ot_secrets_{suffix}");
    let _user = BrokerUser::create(&env.name, &user, &amqp_pw);

    let amqp = env.settings.amqp_url.expose();
    let db = env.settings.database_url.expose();
    let amqp_ok = with_user(amqp, &user, Some(&amqp_pw));
    let amqp_wrong = with_user(amqp, &user, Some(&wrong_pw));
    let amqp_forms = [
        amqp_ok.clone(),
        amqp_wrong.clone(),
        // A token in a parameter the AMQP client does not read.
        with_params(&amqp_ok, &[("access_token", &secret("Token"))]),
        // Several nodes: a refusing one first, then the right one.
        format!("amqp://{user}:{wrong_pw}@127.0.0.1:1/x,{amqp_ok}"),
        // Malformed: no `//`, so no host part.
        format!("amqp:{user}:{}@127.0.0.1", secret("Malformed")),
    ];
    // PostgreSQL trusts local connections: any password connects.
    let db_forms = [
        with_user(db, "postgres", Some(&secret("DbUser"))),
        with_params(
            &with_user(db, "postgres", None),
            &[("password", &secret("DbParam"))],
        ),
        with_params(db, &[("sslpassword", &secret("SslPw"))]),
        with_params(
            db,
            &[
                ("api_token", &secret("DbToken")),
                ("application_name", "secrets-test"),
            ],
        ),
        with_params(
            db,
            &[(
                "sslkey",
                &format!("-----BEGIN PRIVATE KEY-----{}", secret("Pem")),
            )],
        ),
        // MariaDB's root has no password: these are refused, and say so.
        format!(
            "mysql://root:{}@127.0.0.1:3306/{}",
            secret("MyUser"),
            env.name
        ),
        format!(
            "mysql://root@127.0.0.1:3306/{}?password={}",
            env.name,
            secret("MyParam")
        ),
    ];
    let inventory = with_user(
        env.settings.inventory_url.expose(),
        "inv",
        Some(&secret("Inventory")),
    );
    let secrets: Vec<String> = [
        "Amqp",
        "Wrong",
        "Token",
        "Malformed",
        "DbUser",
        "DbParam",
        "SslPw",
        "DbToken",
        "Pem",
        "MyUser",
        "MyParam",
        "Inventory",
    ]
    .iter()
    .map(|tag| secret(tag))
    .collect();

    // `Debug` and `Display` of the settings, whatever the form.
    for (amqp, database) in amqp_forms.iter().zip(db_forms.iter().cycle()) {
        let mut settings = Settings::default();
        settings
            .apply_env(|name| match name {
                "AMQP_URL" => Some(amqp.clone()),
                "DATABASE_URL" => Some(database.clone()),
                "INVENTORY_URL" => Some(inventory.clone()),
                _ => None,
            })
            .unwrap();
        let shown = format!(
            "{settings:?} {} {}",
            settings.amqp_url,
            SecretUrl::new(database.as_str())
        );
        for s in &secrets {
            assert!(!shown.contains(s.as_str()), "{s} in {shown}");
        }
    }

    // Every command, each URL form used by several of them.
    let commands: Vec<(Vec<&'static str>, Option<Duration>)> = vec![
        (vec!["--help"], None),
        (vec!["serve", "--help"], None),
        (vec!["migrate"], None),
        (vec!["schema", "check"], None),
        (vec!["topology", "check"], None),
        (
            vec!["schedule", "--order-id", "secret-1", "--in", "1h"],
            None,
        ),
        (vec!["parked", "list"], None),
        (vec!["parked", "replay", "--order-id", "none-such"], None),
        (vec!["parked", "purge", "--older-than", "3650d"], None),
        (vec!["backfill"], None),
        (vec!["serve"], Some(Duration::from_secs(4))),
    ];
    let config = std::env::temp_dir().join(format!("{}-secrets.toml", env.name));
    std::fs::write(
        &config,
        format!("cascade_shards = {}\n", env.settings.cascade_shards.get()),
    )
    .unwrap();
    // Every command with every form: run k of a command gets AMQP form
    // k mod 5 and database form k mod 7, so 7 runs cover both lists.
    let forms = amqp_forms.len().max(db_forms.len());
    let mut runs = Vec::new();
    for (args, stop_after) in &commands {
        let needs_urls = !args.contains(&"--help");
        for k in 0..if needs_urls { forms } else { 1 } {
            runs.push(Run {
                args: args.clone(),
                amqp: amqp_forms[k % amqp_forms.len()].clone(),
                database: db_forms[k % db_forms.len()].clone(),
                inventory: inventory.clone(),
                stop_after: *stop_after,
            });
        }
    }
    // Which forms some run printed, redacted.
    let mut redacted: std::collections::BTreeSet<String> = Default::default();
    for run in &runs {
        let text = output_of(run, &config).await;
        for s in &secrets {
            assert!(
                !text.contains(s.as_str()),
                "{:?} with AMQP_URL={} DATABASE_URL={} printed a credential ({s}):\n{text}",
                run.args,
                run.amqp,
                run.database
            );
        }
        for form in [&run.amqp, &run.database] {
            if text.contains(&SecretUrl::new(form.as_str()).to_string()) {
                redacted.insert(form.clone());
            }
        }
    }
    // Each form was printed, as its redacted display, by some command (a
    // connection error names the URL it used): else this test would prove
    // little about that form.
    let missing: Vec<String> = amqp_forms
        .iter()
        .chain(&db_forms)
        .filter(|form| !redacted.contains(*form))
        .map(|form| SecretUrl::new(form.as_str()).to_string())
        .collect();
    assert!(missing.is_empty(), "never printed, redacted: {missing:#?}");
    let _ = std::fs::remove_file(&config);
}
