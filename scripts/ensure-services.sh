#!/usr/bin/env bash
# Make sure what order-timeout's demo and tests need is there:
#   - a Rust toolchain (cargo) -- checked only, never installed;
#   - RabbitMQ at AMQP_URL      (default amqp://guest:guest@127.0.0.1:5672/%2f);
#   - PostgreSQL at DATABASE_URL (default postgres://postgres@127.0.0.1:5432/order_timeout);
#   - MariaDB/MySQL at DATABASE_URL when it is mysql://, and at MYSQL_URL (default
#     mysql://root@127.0.0.1:3306/mysql) with --mysql (the tests run every store case
#     on both dialects);
#   - with --ops-tools: `promtool` (Debian's `prometheus` package; the alert rules and the
#     dashboard's queries are checked and unit-tested with it) and headless Chromium
#     (`chromium`; the console's browser test drives it) -- installed with apt-get when
#     missing, nothing started; and kubernetes-validate (PyPI, a pinned version with the
#     Kubernetes schemas it bundles; the Kubernetes manifests are validated with it offline)
#     in a virtualenv at $KUBERNETES_VALIDATE_VENV
#     (default ~/.cache/order-timeout/kubernetes-validate-<version>);
#   - with --publishers: what the publishers in clients/ need to run in the tests -- a JDK
#     and the RabbitMQ Java client, PHP with php-amqplib, Go with amqp091-go, Debian's
#     python3 with pika (Debian packages, apt-get), Node.js and amqplib (npm ci in
#     clients/node, from its package-lock.json);
#   - with --rabbitmq4: a private RabbitMQ 4.x test node beside the machine's broker
#     (scripts/rabbitmq4.sh start: Debian trixie's rabbitmq-server in a debootstrapped root
#     cached under /var/cache/order-timeout, made once in ~2 minutes; the node on 127.0.0.1:5673
#     with every deprecated feature denied and Khepri on). Needs root.
#
# When a URL points at this machine (127.0.0.1 / localhost / ::1) and nothing answers, the
# server is installed from the Debian archive if missing (apt-get) and started without
# systemd (works in containers and CI). When a URL points elsewhere, the host is only
# checked, nothing is installed. Idempotent; well under a second when all is up.
#
# Usage: scripts/ensure-services.sh [--no-rabbitmqctl] [--mysql] [--ops-tools] [--publishers]
#                                   [--rabbitmq4]
#   --no-rabbitmqctl  don't require a working `rabbitmqctl`. The integration tests need it
#                     (they create and delete a vhost per test); the demo does not.
#   --mysql           also make sure MariaDB answers at MYSQL_URL (the tests need it).
#   --ops-tools       also make sure promtool, chromium and kubernetes-validate are installed
#                     (the tests need them).
#   --publishers      also make sure each publisher in clients/ can run (the tests run them).
#   --rabbitmq4       also make sure the RabbitMQ 4.x test node runs (the tests run the broker
#                     fault tests and an end-to-end set on it, `rabbitmq4::`).
set -euo pipefail

# rabbitmq-server / rabbitmqctl live in /usr/sbin, which is not on a normal user's PATH.
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

NEED_RABBITMQCTL=1
NEED_MYSQL=0
NEED_OPS_TOOLS=0
NEED_PUBLISHERS=0
NEED_RABBITMQ4=0
for arg in "$@"; do
    case $arg in
    --no-rabbitmqctl) NEED_RABBITMQCTL=0 ;;
    --mysql) NEED_MYSQL=1 ;;
    --ops-tools) NEED_OPS_TOOLS=1 ;;
    --publishers) NEED_PUBLISHERS=1 ;;
    --rabbitmq4) NEED_RABBITMQ4=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
        exit 0
        ;;
    *)
        echo "usage: $0 [--no-rabbitmqctl] [--mysql] [--ops-tools] [--publishers] [--rabbitmq4]" >&2
        exit 2
        ;;
    esac
done

log() { printf '[ensure-services] %s\n' "$*" >&2; }
die() {
    printf '[ensure-services] ERROR: %s\n' "$*" >&2
    exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

# Run a command as root: directly when we are root, else through sudo if there is one.
SUDO=()
if [[ $(id -u) -ne 0 ]] && have sudo; then
    SUDO=(sudo)
fi
as_root() {
    if [[ $(id -u) -ne 0 && ${#SUDO[@]} -eq 0 ]]; then
        die "need root (or sudo) to run: $*"
    fi
    "${SUDO[@]}" "$@"
}

# reachable HOST PORT: does something accept TCP connections there? (bash /dev/tcp, 2 s max)
reachable() {
    # shellcheck disable=SC2016 # $1/$2 expand in the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# url_host URL / url_port URL DEFAULT_PORT / url_db URL: minimal URL parsing
# (scheme://[user[:password]@]host[:port][/path][?query]; IPv6 hosts in brackets).
url_authority() {
    local rest=${1#*://}
    rest=${rest%%[/?#]*}
    printf '%s' "${rest##*@}"
}
url_host() {
    local auth host
    auth=$(url_authority "$1")
    if [[ $auth == \[* ]]; then
        host=${auth#\[}
        host=${host%%]*}
    else
        host=${auth%%:*}
    fi
    printf '%s' "${host:-127.0.0.1}"
}
url_port() {
    local auth port=
    auth=$(url_authority "$1")
    if [[ $auth == \[* ]]; then
        [[ $auth == *]:* ]] && port=${auth##*]:}
    elif [[ $auth == *:* ]]; then
        port=${auth##*:}
    fi
    printf '%s' "${port:-$2}"
}
url_db() {
    local rest=${1#*://}
    rest=${rest%%[?#]*}
    [[ $rest == */* ]] || return 0
    printf '%s' "${rest#*/}"
}
is_local() {
    case $1 in
    127.* | localhost | ::1) return 0 ;;
    *) return 1 ;;
    esac
}

APT_UPDATED=0
apt_install() {
    have apt-get || die "apt-get not found: install $* yourself (this script only knows Debian/Ubuntu)"
    if [[ $APT_UPDATED -eq 0 ]]; then
        log "apt-get update"
        as_root apt-get update -q >&2
        APT_UPDATED=1
    fi
    log "installing $* (apt-get)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2
}

# ---------------------------------------------------------------------------------------
# Rust toolchain
# ---------------------------------------------------------------------------------------
ensure_cargo() {
    if have cargo; then
        return 0
    fi
    if [[ -x ${HOME:-/nonexistent}/.cargo/bin/cargo ]]; then
        die "cargo is installed in ~/.cargo/bin but not on PATH; run: . \"\$HOME/.cargo/env\""
    fi
    die "no Rust toolchain (cargo) found. Install one with rustup (https://rustup.rs):
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
    . \"\$HOME/.cargo/env\"
    rustup component add rustfmt clippy
then run this again."
}

# ---------------------------------------------------------------------------------------
# RabbitMQ
# ---------------------------------------------------------------------------------------
rabbitmq_diagnostics_hint() {
    local f
    for f in /var/log/rabbitmq/startup_err /var/log/rabbitmq/startup_log /var/log/rabbitmq/rabbit@*.log; do
        if [[ -s $f ]]; then
            log "--- last lines of $f:"
            tail -n 15 "$f" >&2 || true
        fi
    done
}

# Debian's rabbitmq-server wrapper switches to the rabbitmq user with su, whose PAM session
# resets the open-file limit to 1024: the broker then allows ~900 file handles, each vhost
# with the service's quorum queues holds ~100, and once they run out creating a vhost hangs
# (the test suite creates one per test). As root, start the node as the rabbitmq user
# directly, with the hard limit as the soft one.
start_rabbitmq_detached() {
    if [[ $(id -u) -eq 0 ]] && have start-stop-daemon && id rabbitmq >/dev/null 2>&1 &&
        [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
        (
            ulimit -S -n 65536 2>/dev/null || ulimit -S -n "$(ulimit -H -n)"
            cd /var/lib/rabbitmq &&
                HOME=/var/lib/rabbitmq exec start-stop-daemon --start --chuid rabbitmq \
                    --chdir /var/lib/rabbitmq --exec /usr/lib/rabbitmq/bin/rabbitmq-server -- -detached
        )
    else
        as_root rabbitmq-server -detached
    fi
}

# Warns when a running broker allows few file handles (see start_rabbitmq_detached).
check_rabbitmq_file_handles() {
    local limit
    limit=$(rabbitmqctl -q eval 'proplists:get_value(total_limit, file_handle_cache:info([total_limit])).' 2>/dev/null) || return 0
    if [[ $limit =~ ^[0-9]+$ ]] && ((limit < 4000)); then
        log "warning: RabbitMQ allows only $limit file handles (open-file limit ~1024); the tests
    create a vhost per test, ~100 handles each, and vhost creation hangs when they run out.
    Restart the broker with a higher limit, e.g. as root:
      rabbitmqctl stop; cd /var/lib/rabbitmq && (ulimit -S -n 65536; HOME=/var/lib/rabbitmq \\
        start-stop-daemon --start --chuid rabbitmq --exec /usr/lib/rabbitmq/bin/rabbitmq-server -- -detached)
    or set LimitNOFILE for the rabbitmq-server systemd unit."
    fi
}

start_local_rabbitmq() {
    if ! have rabbitmq-server; then
        apt_install rabbitmq-server
        # The package may have started the broker itself (systemd, or an allowing policy-rc.d).
        reachable 127.0.0.1 5672 && return 0
    fi

    log "starting RabbitMQ"
    local started=0
    if [[ -d /run/systemd/system ]] && have systemctl; then
        as_root systemctl start rabbitmq-server >&2 && started=1
    fi
    if [[ $started -eq 0 ]]; then
        # Debian's wrapper drops to the rabbitmq user when run as root. It fails if a node is
        # already booting; that's fine, we wait for the port below either way. The daemon's
        # stdio goes to a file, never to our stdout/stderr: an inherited pipe would keep
        # e.g. `scripts/test.sh | tee log` waiting forever.
        local out
        out=$(mktemp)
        if ! start_rabbitmq_detached </dev/null >"$out" 2>&1; then
            cat "$out" >&2
            log "rabbitmq-server -detached failed (node already starting?); waiting anyway"
        fi
        rm -f "$out"
    fi

    local deadline=$((SECONDS + 90))
    until reachable 127.0.0.1 5672; do
        if ((SECONDS >= deadline)); then
            rabbitmq_diagnostics_hint
            die "RabbitMQ did not open 127.0.0.1:5672 within 90 s"
        fi
        sleep 1
    done
    local left=$((deadline - SECONDS))
    ((left >= 5)) || left=5
    as_root rabbitmqctl -q await_startup --timeout "$left" >&2 ||
        log "rabbitmqctl await_startup failed; checking rabbitmqctl status next"
}

# The tests run `rabbitmqctl add_vhost / set_permissions / delete_vhost`, as the user
# running them, so check exactly that: plain `rabbitmqctl status`, no sudo.
check_rabbitmqctl() {
    local host=$1 out
    if ! have rabbitmqctl; then
        die "rabbitmqctl not found. The integration tests create a fresh vhost per test with
    rabbitmqctl, so they need a RabbitMQ node that rabbitmqctl on this machine can manage:
    unset AMQP_URL (this script then installs and starts RabbitMQ locally), or install the
    RabbitMQ CLI tools and point them at the broker (RABBITMQ_NODENAME + Erlang cookie)."
    fi
    local deadline=$((SECONDS + 30))
    until out=$(rabbitmqctl -q status 2>&1); do
        if ((SECONDS >= deadline)); then
            printf '%s\n' "$out" | tail -n 10 >&2
            local hint="make sure rabbitmqctl can reach the node (same Erlang cookie, RABBITMQ_NODENAME)"
            if [[ $(id -u) -ne 0 ]]; then
                hint="Debian's rabbitmqctl only works as root or as the rabbitmq user: run the tests as root, or $hint"
            fi
            if ! is_local "$host"; then
                hint="AMQP_URL points to $host: rabbitmqctl must manage that same broker; $hint"
            fi
            die "RabbitMQ answers on AMQP but 'rabbitmqctl status' fails; the integration tests
    need rabbitmqctl (add_vhost/set_permissions/delete_vhost). $hint.
    (Use --no-rabbitmqctl to skip this check when you only run the demo.)"
        fi
        sleep 2
    done
    if ! is_local "$host"; then
        log "note: AMQP_URL points to $host; rabbitmqctl must manage that same broker for the tests"
    fi
    log "rabbitmqctl works"
    check_rabbitmq_file_handles
}

ensure_rabbitmq() {
    local url=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
    local default_port=5672
    [[ $url == amqps://* ]] && default_port=5671
    local host port
    host=$(url_host "$url")
    port=$(url_port "$url" "$default_port")

    if reachable "$host" "$port"; then
        log "RabbitMQ reachable on $host:$port"
    elif ! is_local "$host"; then
        die "RabbitMQ not reachable on $host:$port (from AMQP_URL; remote host, so nothing is installed)"
    elif [[ $port != 5672 ]]; then
        die "RabbitMQ not reachable on $host:$port (from AMQP_URL); only the default port 5672 is managed by this script"
    else
        start_local_rabbitmq
        log "RabbitMQ reachable on 127.0.0.1:5672 (started)"
    fi

    if [[ $NEED_RABBITMQCTL -eq 1 ]]; then
        # ~0.6 s of Erlang VM start-up: run it while PostgreSQL is being checked.
        check_rabbitmqctl "$host" &
        RABBITMQCTL_PID=$!
    fi
}
RABBITMQCTL_PID=

# ---------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------
PG_VERSION=

pg_ctl() { as_root pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" main "$@"; }

# Dev/test machines only: let anyone on the loopback interface connect as any role without
# a password (the service's default DATABASE_URL has none). Our two lines go before every
# other host rule; rewrites the file only when that is not already so, then reloads.
ensure_trust_hba() {
    local hba=/etc/postgresql/$PG_VERSION/main/pg_hba.conf tmp
    [[ -f $hba ]] || die "$hba not found"
    tmp=$(mktemp)
    # shellcheck disable=SC2016 # awk program, not shell
    as_root cat "$hba" | awk '
        BEGIN {
            c  = "# added by order-timeout scripts/ensure-services.sh: DEV/TEST MACHINE ONLY"
            l1 = "host    all             all             127.0.0.1/32            trust"
            l2 = "host    all             all             ::1/128                 trust"
        }
        function ours() {
            return $0 == c || ($1 == "host" && $2 == "all" && $3 == "all" && $5 == "trust" &&
                               NF == 5 && ($4 == "127.0.0.1/32" || $4 == "::1/128"))
        }
        ours() { next }
        !done && $1 ~ /^host/ { print c; print l1; print l2; done = 1 }
        { print }
        END { if (!done) { print c; print l1; print l2 } }
    ' >"$tmp"
    if ! as_root cat "$hba" | cmp -s - "$tmp"; then
        log "pg_hba.conf: trusting 127.0.0.1/::1 (dev/test machine only) and reloading"
        as_root tee "$hba" <"$tmp" >/dev/null
        pg_ctl reload >&2
    fi
    rm -f "$tmp"
}

wait_pg_isready() {
    local host=$1 port=$2 deadline=$((SECONDS + 60))
    have pg_isready || return 0
    until pg_isready -q -h "$host" -p "$port" -t 2; do
        if ((SECONDS >= deadline)); then
            pg_isready -h "$host" -p "$port" >&2 || true
            die "PostgreSQL on $host:$port not ready within 60 s"
        fi
        sleep 1
    done
}

start_local_postgres() {
    local installed=0 created=0 v
    local servers=(/usr/lib/postgresql/*/bin/postgres)
    if [[ ! -x ${servers[0]} ]]; then
        apt_install postgresql
        installed=1
    fi

    # Newest version that has a "main" cluster; else create one with the newest server.
    local clusters=(/etc/postgresql/*/main/postgresql.conf)
    if [[ -f ${clusters[0]} ]]; then
        PG_VERSION=$(printf '%s\n' "${clusters[@]}" | cut -d/ -f4 | sort -V | tail -n1)
    else
        servers=(/usr/lib/postgresql/*/bin/postgres)
        [[ -x ${servers[0]} ]] || die "no PostgreSQL server binary in /usr/lib/postgresql after installing"
        v=$(printf '%s\n' "${servers[@]}" | cut -d/ -f5 | sort -V | tail -n1)
        log "creating PostgreSQL cluster $v/main on port 5432"
        as_root pg_createcluster -p 5432 "$v" main >&2
        PG_VERSION=$v
        created=1
    fi

    if pg_ctl status >/dev/null 2>&1; then
        log "PostgreSQL $PG_VERSION/main already running"
    else
        log "starting PostgreSQL $PG_VERSION/main"
        # stdio to a file, not our pipes (see start_local_rabbitmq).
        local out
        out=$(mktemp)
        if ! pg_ctl start </dev/null >"$out" 2>&1; then
            cat "$out" >&2
            tail -n 20 "/var/log/postgresql/postgresql-$PG_VERSION-main.log" >&2 2>/dev/null || true
            die "pg_ctlcluster $PG_VERSION main start failed"
        fi
        rm -f "$out"
    fi

    local deadline=$((SECONDS + 60))
    until reachable 127.0.0.1 5432; do
        if ((SECONDS >= deadline)); then
            pg_lsclusters >&2 || true
            die "PostgreSQL $PG_VERSION/main is not listening on 127.0.0.1:5432 after 60 s (other port? see pg_lsclusters above)"
        fi
        sleep 1
    done
    wait_pg_isready 127.0.0.1 5432

    # We installed/created this cluster: make it accept the password-less default URL.
    # If we only started an existing cluster, touch pg_hba.conf only when that URL fails.
    if [[ $installed -eq 1 || $created -eq 1 ]] ||
        ! psql_ok "postgres://postgres@127.0.0.1:5432/postgres"; then
        ensure_trust_hba
    fi
}

# psql_ok URL: can we log in (no password prompt) and run a query?
psql_ok() { psql -X -w -q -tA -d "$1" -c 'select 1' >/dev/null 2>&1; }

# Connect with the configured URL (to its server's "postgres" database) and create the
# configured database if it does not exist yet. Only for a server on this machine.
ensure_database() {
    local url=$1 host=$2 base db maint out
    have psql || {
        log "psql not found; skipping the login check"
        return 0
    }
    base=${url%%[?#]*} # psql does not know sqlx-only query parameters
    db=$(url_db "$base")
    if [[ $base == *://*/* ]]; then
        maint=${base%/*}/postgres
    else
        maint=$base/postgres
    fi
    if ! out=$(psql -X -w -q -tA -d "$maint" -c 'select 1' 2>&1 >/dev/null); then
        printf '%s\n' "$out" >&2
        if is_local "$host"; then
            die "cannot log in to PostgreSQL with DATABASE_URL ($maint); the service and the tests need password-less (or URL-password) access"
        fi
        log "warning: psql cannot log in with DATABASE_URL ($maint); the service may not either"
        return 0
    fi
    is_local "$host" || return 0
    [[ -n $db && $db =~ ^[A-Za-z0-9_]+$ ]] || return 0
    if [[ -z $(psql -X -w -q -tA -d "$maint" -c "select 1 from pg_database where datname = '$db'") ]]; then
        log "creating database $db"
        psql -X -w -q -d "$maint" -c "create database \"$db\"" >/dev/null
    fi
}

ensure_postgres() {
    local url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/order_timeout}
    local host port
    host=$(url_host "$url")
    port=$(url_port "$url" 5432)

    if reachable "$host" "$port"; then
        wait_pg_isready "$host" "$port"
        log "PostgreSQL reachable on $host:$port"
    elif ! is_local "$host"; then
        die "PostgreSQL not reachable on $host:$port (from DATABASE_URL; remote host, so nothing is installed)"
    elif [[ $port != 5432 ]]; then
        die "PostgreSQL not reachable on $host:$port (from DATABASE_URL); only the default port 5432 is managed by this script"
    else
        start_local_postgres
        log "PostgreSQL reachable on 127.0.0.1:5432 (started)"
    fi
    ensure_database "$url" "$host"
}

# ---------------------------------------------------------------------------------------
# MariaDB (MySQL dialect)
# ---------------------------------------------------------------------------------------

# Start the local MariaDB without systemd, installing it first if needed, and let root
# log in over TCP from this machine with the URL's (empty) password, as the tests do.
start_local_mariadb() {
    if ! have mariadbd && [[ ! -x /usr/sbin/mariadbd ]]; then
        apt_install mariadb-server
    fi
    as_root install -d -o mysql -g mysql /run/mysqld
    if [[ ! -d /var/lib/mysql/mysql ]]; then
        log "initialising the MariaDB data directory"
        as_root mariadb-install-db --user=mysql --datadir=/var/lib/mysql >&2
    fi
    log "starting MariaDB"
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    local _
    for _ in $(seq 1 60); do
        reachable 127.0.0.1 3306 && break
        sleep 0.5
    done
    reachable 127.0.0.1 3306 || die "MariaDB did not start listening on 127.0.0.1:3306"
    # Debian's root logs in through the unix socket only; allow the empty password too.
    as_root mariadb -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')" >&2 || true
}

ensure_mysql_at() {
    local url=$1 what=$2 host port
    host=$(url_host "$url")
    port=$(url_port "$url" 3306)
    if reachable "$host" "$port"; then
        log "MariaDB/MySQL reachable on $host:$port ($what)"
    elif ! is_local "$host"; then
        die "MariaDB/MySQL not reachable on $host:$port ($what; remote host, so nothing is installed)"
    elif [[ $port != 3306 ]]; then
        die "MariaDB/MySQL not reachable on $host:$port ($what); only the default port 3306 is managed by this script"
    else
        start_local_mariadb
        log "MariaDB reachable on 127.0.0.1:3306 (started)"
    fi
}

# ---------------------------------------------------------------------------------------
# promtool and headless Chromium (tests of the alert rules, the dashboard and the console)
# ---------------------------------------------------------------------------------------
# Debian's `prometheus` package brings promtool; its daemon is not started here (the tests
# only run `promtool check rules` / `promtool test rules`). `chromium` is the browser the
# console test drives headless over the DevTools protocol. No recommends: no node exporter,
# no fonts beyond what chromium depends on.
ensure_ops_tools() {
    local missing=()
    have promtool || missing+=(prometheus)
    [[ -x ${CHROMIUM:-/usr/bin/chromium} ]] || missing+=(chromium)
    if [[ ${#missing[@]} -gt 0 ]]; then
        apt_install --no-install-recommends "${missing[@]}"
    fi
    have promtool || die "promtool not found after installing prometheus"
    [[ -x ${CHROMIUM:-/usr/bin/chromium} ]] || die "${CHROMIUM:-/usr/bin/chromium} not found after installing chromium"
    log "promtool and chromium present"
}

# ---------------------------------------------------------------------------------------
# The publishers in clients/ (tests/e2e/publishers.rs runs each against the broker)
# ---------------------------------------------------------------------------------------
# Debian's packages for Java, PHP, Go and Python (no recommends), one apt-get run for
# whatever is missing; amqplib from npm into clients/node/node_modules, exactly as its
# package-lock.json says, only when that is not already so. Checks are file tests: well
# under a second when everything is there.
ensure_publishers() {
    local missing=()
    have javac || missing+=(default-jdk-headless)
    [[ -f /usr/share/java/amqp-client.jar ]] || missing+=(librabbitmq-client-java)
    have php || missing+=(php-cli)
    [[ -f /usr/share/php/PhpAmqpLib/autoload.php ]] || missing+=(php-amqplib)
    have go || missing+=(golang-go)
    [[ -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go ]] ||
        missing+=(golang-github-rabbitmq-amqp091-go-dev)
    [[ -d /usr/lib/python3/dist-packages/pika ]] || missing+=(python3-pika)
    if ! have node || ! have npm; then
        missing+=(nodejs npm)
    fi
    if [[ ${#missing[@]} -gt 0 ]]; then
        apt_install --no-install-recommends "${missing[@]}"
    fi
    local dir
    dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../clients/node" && pwd)
    # npm ci records what it installed in node_modules/.package-lock.json: run it only when
    # a package there differs from package-lock.json.
    # shellcheck disable=SC2016 # a JavaScript program, not shell
    if ! node -e '
        const read = (f) => { try { return require(f).packages || {}; } catch { return {}; } };
        const want = read(process.argv[1]), have = read(process.argv[2]);
        const same = Object.keys(want).filter((k) => k !== "").every(
            (k) => have[k] && have[k].integrity === want[k].integrity);
        process.exit(same ? 0 : 1);' "$dir/package-lock.json" "$dir/node_modules/.package-lock.json"; then
        log "npm ci in clients/node (amqplib)"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
    fi
    [[ -f $dir/node_modules/amqplib/package.json ]] || die "amqplib not in clients/node/node_modules after npm ci"
    log "publishers' toolchains present (java, php, go, python3-pika, node + amqplib)"
}

# kubernetes-validate (PyPI) in a virtualenv of its own: the Kubernetes manifests'
# offline validation (tests/e2e/kubernetes.rs). Pinned, with the Kubernetes versions its
# bundled schemas cover; the test looks for it at the same path.
KUBERNETES_VALIDATE_VERSION=1.37.0
KUBERNETES_VALIDATE_VENV=${KUBERNETES_VALIDATE_VENV:-${HOME:-/root}/.cache/order-timeout/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION}
ensure_kubernetes_validate() {
    local venv=$KUBERNETES_VALIDATE_VENV
    if [[ -x $venv/bin/kubernetes-validate ]] &&
        [[ $("$venv/bin/kubernetes-validate" --version 2>/dev/null) == "$KUBERNETES_VALIDATE_VERSION" ]]; then
        log "kubernetes-validate $KUBERNETES_VALIDATE_VERSION present ($venv)"
        return 0
    fi
    have python3 || apt_install --no-install-recommends python3
    # Debian's python3 needs python3-venv (ensurepip) to make a virtualenv.
    python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install --no-install-recommends python3-venv
    log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $venv (pip)"
    # A half-made virtualenv fails the version check above, so it is made again next time.
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2
    [[ $("$venv/bin/kubernetes-validate" --version 2>/dev/null) == "$KUBERNETES_VALIDATE_VERSION" ]] ||
        die "kubernetes-validate $KUBERNETES_VALIDATE_VERSION did not install into $venv"
    log "kubernetes-validate $KUBERNETES_VALIDATE_VERSION installed"
}

# ---------------------------------------------------------------------------------------
# RabbitMQ 4.x (scripts/rabbitmq4.sh), beside the machine's broker
# ---------------------------------------------------------------------------------------
# debootstrap comes from apt here, before anything else runs apt-get; the root (a download
# of 115 packages the first time) and the node are then made in the background while the
# rest is checked or installed.
RABBITMQ4=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/rabbitmq4.sh
start_rabbitmq4() {
    if [[ $(id -u) -ne 0 ]]; then
        [[ ${#SUDO[@]} -gt 0 ]] || die "--rabbitmq4 needs root (debootstrap, chroot): run as root or with sudo"
    fi
    if ! as_root "$RABBITMQ4" version >/dev/null 2>&1 && ! have debootstrap &&
        [[ ! -x /usr/sbin/debootstrap ]]; then
        apt_install --no-install-recommends debootstrap
    fi
    as_root "$RABBITMQ4" start </dev/null >&2 &
    RABBITMQ4_PID=$!
}
RABBITMQ4_PID=

ensure_cargo
ensure_rabbitmq
if [[ $NEED_RABBITMQ4 -eq 1 ]]; then
    start_rabbitmq4
fi
case ${DATABASE_URL:-} in
mysql://* | mariadb://*) ensure_mysql_at "$DATABASE_URL" DATABASE_URL ;;
*) ensure_postgres ;;
esac
if [[ $NEED_MYSQL -eq 1 ]]; then
    # The tests need PostgreSQL as well (the reference inventory server keeps its stock there).
    [[ ${DATABASE_URL:-} == mysql://* ]] && (DATABASE_URL='' ensure_postgres)
    ensure_mysql_at "${MYSQL_URL:-mysql://root@127.0.0.1:3306/mysql}" MYSQL_URL
fi
if [[ $NEED_OPS_TOOLS -eq 1 ]]; then
    ensure_ops_tools
    ensure_kubernetes_validate
fi
if [[ $NEED_PUBLISHERS -eq 1 ]]; then
    ensure_publishers
fi
if [[ -n $RABBITMQCTL_PID ]]; then
    wait "$RABBITMQCTL_PID" || exit 1
fi
if [[ -n $RABBITMQ4_PID ]]; then
    wait "$RABBITMQ4_PID" || die "the RabbitMQ 4.x test node is not running (scripts/rabbitmq4.sh start failed, see above)"
fi
