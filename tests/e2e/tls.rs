//! TLS end to end, against private servers with TLS listeners and
//! certificates made by the test (rcgen): a CA, a server certificate for
//! `localhost` and `127.0.0.1`, a client certificate, and a second CA that
//! signed nothing the servers present.
//!
//! Each test starts its own server: PostgreSQL 15 (`initdb`, `pg_ctl`, as
//! user `postgres`), MariaDB 10.11 (`mariadb-install-db`, `mariadbd`) or a
//! one-node RabbitMQ (`scripts/rabbitmq-cluster.sh` through the tools'
//! `PrivateCluster`), on free ports, in a
//! directory of its own; none is the machine's shared server. Each is
//! stopped and its directory removed when the test ends, also when it fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use order_timeout::RunningService;
use order_timeout::message::OrderId;
use order_timeout::settings::{SecretUrl, Settings};
use order_timeout::testing::broker::connect_amqp;
use order_timeout::testing::store::{OrderState, ShopSchema, Store, StoreError, connect_lazy};
use order_timeout_tools::private_broker::{ClusterConfig, PrivateCluster};
use order_timeout_tools::shop;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::common::TestEnv;

const LEASE: Duration = Duration::from_secs(15);

// ---- Scratch directories, ports, certificates ----

/// A directory removed (with everything in it) when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("ot-tls-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The test's certificates, as PEM files in a directory of their own.
struct Pki {
    dir: TempDir,
    /// The CA that signed the server and client certificates.
    ca: PathBuf,
    /// A CA that signed nothing here: trusting only it must fail.
    other_ca: PathBuf,
    /// Server certificate for `localhost` and `127.0.0.1`, and its key.
    server_cert: PathBuf,
    server_key: PathBuf,
    /// Client certificate (CN `order-timeout`) and its key.
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn new_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

fn new_leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    common_name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    fn new() -> Self {
        let dir = TempDir::new("pki");
        let (ca_pem, ca) = new_ca("order-timeout test CA");
        let (other_pem, _) = new_ca("some other CA");
        let (server_pem, server_key_pem) = new_leaf(
            &ca,
            &["localhost", "127.0.0.1"],
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_pem, client_key_pem) = new_leaf(
            &ca,
            &[],
            "order-timeout",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Self {
            ca: write("ca.pem", &ca_pem),
            other_ca: write("other-ca.pem", &other_pem),
            server_cert: write("server.pem", &server_pem),
            server_key: write("server.key", &server_key_pem),
            client_cert: write("client.pem", &client_pem),
            client_key: write("client.key", &client_key_pem),
            dir,
        }
    }
}

/// Runs a command to completion; panics with its output if it fails.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = crate::bounds::output_within(cmd, Duration::from_secs(120), what);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Waits until something accepts TCP connections on `port`, or panics with
/// `log`'s tail after `limit` (or at once when `alive` says the server
/// process is gone).
fn wait_listening(port: u16, limit: Duration, log: &Path, mut alive: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        let tail = || std::fs::read_to_string(log).unwrap_or_default();
        assert!(alive(), "the server exited:\n{}", tail());
        assert!(
            Instant::now() < end,
            "nothing listens on {port} after {limit:?}:\n{}",
            tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---- PostgreSQL ----

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A private PostgreSQL 15 that accepts TCP connections only with TLS
/// (`hostssl ... trust`, `host ... reject`), on 127.0.0.1 and a free port.
struct PrivatePostgres {
    dir: TempDir,
    port: u16,
}

impl PrivatePostgres {
    fn start(pki: &Pki) -> Self {
        let dir = TempDir::new("pg");
        let data = dir.path().join("data");
        let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
        std::fs::copy(&pki.server_cert, &cert).unwrap();
        std::fs::copy(&pki.server_key, &key).unwrap();
        // initdb refuses root, and the server wants its key 0600 and its own.
        run(
            Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(dir.path()),
            "chown",
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        run(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(format!("{PG_BIN}/initdb"))
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
                .arg(&data),
            "initdb",
        );
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all all 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        let port = free_port();
        let options = format!(
            "-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c ssl=on \
             -c ssl_cert_file={cert} -c ssl_key_file={key} -c fsync=off",
            dir = dir.path().display(),
            cert = cert.display(),
            key = key.display(),
        );
        let server = Self { dir, port };
        run(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(format!("{PG_BIN}/pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(server.dir.path().join("log"))
                .args(["-w", "-t", "60", "-o", &options, "start"]),
            "pg_ctl start",
        );
        server
    }

    /// `postgres://` to its `db`, over TCP, with `params`.
    fn url(&self, db: &str, params: &str) -> SecretUrl {
        SecretUrl::new(format!(
            "postgres://postgres@127.0.0.1:{}/{db}{params}",
            self.port
        ))
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{PG_BIN}/pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// An UNPAID order overdue by a minute, inserted as the shop would.
async fn insert_overdue_pg(pool: &sqlx::PgPool, id: &str) {
    sqlx::query("INSERT INTO orders (id, status, expires_at) VALUES ($1, 'UNPAID', $2)")
        .bind(id)
        .bind(Utc::now() - chrono::Duration::seconds(60))
        .execute(pool)
        .await
        .unwrap();
}

/// `cancel_due` for one order cancels it.
async fn assert_cancels(store: &Store, id: &str) {
    let states = store
        .cancel_due(&[OrderId::parse(id).unwrap()], LEASE)
        .await
        .expect("the cancel transaction over TLS");
    assert_eq!(states.len(), 1, "{states:?}");
    assert!(
        matches!(states[0].1, OrderState::Cancelled(_)),
        "{:?}",
        states[0]
    );
}

#[tokio::test]
async fn postgres_over_tls_verifies_the_server_and_plaintext_is_refused() {
    let pki = Pki::new();
    let pg = PrivatePostgres::start(&pki);
    let tls = format!("?sslmode=verify-full&sslrootcert={}", pki.ca.display());
    let url = pg.url("ot_tls", &tls);

    // The service's migrations (creating the database) and the reference
    // shop schema, then the store's own work, all over verified TLS.
    let pool = shop::prepare_database(&url, 2)
        .await
        .expect("migrate over TLS");
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(encrypted, "the tools' pool is on TLS");
    let store = connect_lazy(&url, 2, &ShopSchema::default()).unwrap();
    store.prepare().await.expect("schema check over TLS");
    insert_overdue_pg(&pool, "tls-pg-1").await;
    assert_cancels(&store, "tls-pg-1").await;
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = 'tls-pg-1'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "CANCELLED");

    // The same URL without sslmode is plaintext (the default), which this
    // server refuses.
    let plain = connect_lazy(&pg.url("ot_tls", ""), 1, &ShopSchema::default()).unwrap();
    let err = plain.ping().await.expect_err("plaintext is refused");
    assert!(err.to_string().contains("no encryption"), "{err}");

    // A CA that did not sign the server's certificate: the handshake fails.
    let wrong = format!(
        "?sslmode=verify-full&sslrootcert={}",
        pki.other_ca.display()
    );
    let other = connect_lazy(&pg.url("ot_tls", &wrong), 1, &ShopSchema::default()).unwrap();
    let err = other
        .ping()
        .await
        .expect_err("an unknown issuer is refused");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );

    // A CA file that is not there stops the store before any connection,
    // naming the parameter.
    let missing = pki.dir.path().join("missing.pem");
    let err = connect_lazy(
        &pg.url(
            "ot_tls",
            &format!("?sslmode=verify-full&sslrootcert={}", missing.display()),
        ),
        1,
        &ShopSchema::default(),
    )
    .expect_err("a missing CA file is a configuration error");
    assert!(err.is_config(), "{err}");
    assert!(
        err.to_string()
            .starts_with("DATABASE_URL sslrootcert: cannot read"),
        "{err}"
    );
    pool.close().await;
}

// ---- MariaDB ----

/// A private MariaDB 10.11 with `require_secure_transport`, on 127.0.0.1
/// and a free port; `root` without a password.
struct PrivateMariaDb {
    /// Its data, removed after the server is killed (fields drop after
    /// `Drop::drop`).
    _dir: TempDir,
    port: u16,
    server: Child,
}

impl PrivateMariaDb {
    fn start(pki: &Pki) -> Self {
        let dir = TempDir::new("mariadb");
        run(
            Command::new("mariadb-install-db")
                .arg("--no-defaults")
                .arg(format!("--datadir={}", dir.path().join("data").display()))
                .args([
                    "--auth-root-authentication-method=normal",
                    "--user=root",
                    "--skip-test-db",
                ]),
            "mariadb-install-db",
        );
        let port = free_port();
        let log = dir.path().join("server.log");
        let server = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--user=root")
            .arg(format!("--ssl-ca={}", pki.ca.display()))
            .arg(format!("--ssl-cert={}", pki.server_cert.display()))
            .arg(format!("--ssl-key={}", pki.server_key.display()))
            .arg("--require-secure-transport=ON")
            .args([
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        let mut db = Self {
            _dir: dir,
            port,
            server,
        };
        wait_listening(port, Duration::from_secs(60), &log, || {
            matches!(db.server.try_wait(), Ok(None))
        });
        db
    }

    /// `mysql://` to its `db` as `root`, via `localhost`, with `params`.
    fn url(&self, db: &str, params: &str) -> SecretUrl {
        SecretUrl::new(format!("mysql://root@localhost:{}/{db}{params}", self.port))
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        // Its own child, by its own pid.
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[tokio::test]
async fn mariadb_over_tls_verifies_the_server_and_plaintext_is_refused() {
    let pki = Pki::new();
    let db = PrivateMariaDb::start(&pki);
    let tls = format!("?ssl-mode=VERIFY_IDENTITY&ssl-ca={}", pki.ca.display());
    let url = db.url("ot_tls", &tls);

    let pool = shop::prepare_mysql_database(&url, 2)
        .await
        .expect("migrate over TLS");
    let (_, version): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_version'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(version.starts_with("TLS"), "Ssl_version {version:?}");
    let store = connect_lazy(&url, 2, &ShopSchema::default()).unwrap();
    store.prepare().await.expect("schema check over TLS");
    sqlx::query("INSERT INTO orders (id, status, expires_at) VALUES (?, 'UNPAID', ?)")
        .bind("tls-my-1")
        .bind(Utc::now() - chrono::Duration::seconds(60))
        .execute(&pool)
        .await
        .unwrap();
    assert_cancels(&store, "tls-my-1").await;
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = 'tls-my-1'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "CANCELLED");

    // The same user without ssl-mode: plaintext (the default), which the
    // server refuses (it answers, so this is its refusal, not a network
    // error; MariaDB words it "Access denied").
    let plain = connect_lazy(&db.url("ot_tls", ""), 1, &ShopSchema::default()).unwrap();
    let err = plain.ping().await.expect_err("plaintext is refused");
    assert!(
        matches!(err, StoreError::Sql(sqlx::Error::Database(_))),
        "{err:?}"
    );

    // A CA that did not sign the server's certificate.
    let wrong = format!(
        "?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        pki.other_ca.display()
    );
    let other = connect_lazy(&db.url("ot_tls", &wrong), 1, &ShopSchema::default()).unwrap();
    let err = other
        .ping()
        .await
        .expect_err("an unknown issuer is refused");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    pool.close().await;
}

// ---- RabbitMQ ----

/// A private one-node RabbitMQ (`scripts/rabbitmq-cluster.sh`, through the
/// tools' [`PrivateCluster`]) with a TLS listener that requires a client
/// certificate signed by the test's CA.
struct PrivateRabbit {
    _node: PrivateCluster,
    tls_port: u16,
}

/// rabbitmqctl's own distribution ports: a listener there could get in the
/// way of the CLI calls the cluster script makes.
const CLI_DIST_PORTS: std::ops::RangeInclusive<u16> = 35_672..=35_682;

impl PrivateRabbit {
    async fn start(pki: &Pki) -> Self {
        let tls_port = std::iter::repeat_with(free_port)
            .find(|p| !CLI_DIST_PORTS.contains(p))
            .unwrap();
        let mut config = ClusterConfig::nodes(1);
        config.extra_conf = Some(format!(
            "listeners.ssl.default = 127.0.0.1:{tls_port}\n\
             ssl_options.cacertfile = {ca}\n\
             ssl_options.certfile = {cert}\n\
             ssl_options.keyfile = {key}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = true\n",
            ca = pki.ca.display(),
            cert = pki.server_cert.display(),
            key = pki.server_key.display(),
        ));
        let node = PrivateCluster::start(config)
            .await
            .expect("start a private RabbitMQ node with a TLS listener");
        Self {
            _node: node,
            tls_port,
        }
    }

    /// `amqps://` to the TLS listener's default vhost, with `params`.
    fn url(&self, params: &str) -> SecretUrl {
        SecretUrl::new(format!(
            "amqps://guest:guest@localhost:{}/%2f{params}",
            self.tls_port
        ))
    }
}

#[tokio::test]
async fn the_service_runs_over_amqps_with_a_private_ca_and_a_client_certificate() {
    let pki = Pki::new();

    // A CA file that is not there stops the service at start-up, naming the
    // parameter (no broker needed for that).
    let missing = pki.dir.path().join("missing.pem");
    let settings = Settings {
        amqp_url: SecretUrl::new(format!(
            "amqps://guest:guest@localhost:1/%2f?cacertfile={}",
            missing.display()
        )),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        ..Settings::default()
    };
    let err = RunningService::start(settings)
        .await
        .err()
        .expect("a missing CA file stops the service");
    assert!(
        format!("{err:#}").starts_with("AMQP_URL cacertfile: cannot read"),
        "{err:#}"
    );

    let rabbit = PrivateRabbit::start(&pki).await;
    let with_ca = format!("?cacertfile={}", pki.ca.display());
    let identity = format!(
        "&certfile={}&keyfile={}",
        pki.client_cert.display(),
        pki.client_key.display()
    );

    // Refused: the bundled public roots alone do not know the test's CA; a
    // CA that did not sign the broker's certificate; no client certificate
    // (the broker requires one).
    let err = connect_amqp(&rabbit.url(&format!("?{}", &identity[1..])), "test")
        .await
        .expect_err("the public roots do not trust the test CA");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    let wrong = format!("?cacertfile={}{identity}", pki.other_ca.display());
    let err = connect_amqp(&rabbit.url(&wrong), "test")
        .await
        .expect_err("another CA is not trusted");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    let err = connect_amqp(&rabbit.url(&with_ca), "test")
        .await
        .expect_err("the broker requires a client certificate");
    // In TLS 1.3 the client's handshake ends before the broker judges its
    // (missing) certificate: the client reads the broker's alert, or, when
    // the broker has already closed the socket, a reset (seen in CI).
    let refused = err.to_string();
    assert!(
        [
            "CertificateRequired",
            "reset by peer",
            "UnexpectedEof",
            "unexpected end of file",
            "Broken pipe",
        ]
        .iter()
        .any(|why| refused.contains(why)),
        "{refused}"
    );

    // Accepted: the test's CA and the client certificate. The whole service
    // runs on it: topology, consumer, publisher, and an order cancelled end
    // to end (the database is the shared plaintext one).
    let env = TestEnv::on_broker(rabbit.url(&format!("{with_ca}{identity}"))).await;
    env.stock_skus(1).await;
    let mut events = env.subscribe_events().await;
    let _service = env.service().await;
    let order = env
        .create_order("tls-amqp-1", Duration::from_secs(1), &[(0, 2)])
        .await;
    env.publish_timeout(&order).await;
    let (status, _, _) = env.wait_settled(&order.id, Duration::from_secs(30)).await;
    assert_eq!(status, "CANCELLED");
    let got = TestEnv::read_events(&mut events, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "the cancelled event arrives over amqps");
    env.assert_stock_exact(1).await;

    // The binary too (its own process, its own crypto provider).
    let out = env.cli(&["topology", "check"]).await;
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
}
