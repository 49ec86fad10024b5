//! What `order-timeout-tools reference-schema` prints never holds the
//! database password, whatever form `DATABASE_URL` gives it in (the URL is
//! printed, redacted). Runs against the local PostgreSQL (trust
//! authentication: any password connects) in a database of its own,
//! dropped however the test ends.

use std::process::Command;

use order_timeout_tools::scratch;

#[test]
fn reference_schema_prints_the_url_without_its_password() {
    let scratch = scratch::ScratchDatabase::on_test_server("ot_tools_secrets");
    let database = scratch.name().to_owned();
    let secret = format!("ToolsS3cret_{database}");
    let url = url::Url::parse(scratch.url().unwrap().expose()).unwrap();
    let mut with_userinfo = url.clone();
    with_userinfo.set_password(Some(&secret)).unwrap();
    let mut with_param = url.clone();
    with_param
        .query_pairs_mut()
        .append_pair("password", &secret);
    for database_url in [with_userinfo.to_string(), with_param.to_string()] {
        let out = Command::new(env!("CARGO_BIN_EXE_order-timeout-tools"))
            .arg("reference-schema")
            .env("DATABASE_URL", &database_url)
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains(&database), "the URL is printed:\n{text}");
        assert!(!text.contains(&secret), "the password leaked:\n{text}");
    }
}
