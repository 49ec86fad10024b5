#!/usr/bin/env bash
# The project's test command (README and CI run exactly this):
# services, formatting, lints, then the unit and integration tests.
# The integration tests need RabbitMQ (with a working rabbitmqctl), a RabbitMQ 4.x test node
# (scripts/rabbitmq4.sh), PostgreSQL and MariaDB; they
# create and drop their own vhosts and databases. Extra arguments go to `cargo test`,
# e.g. scripts/test.sh cascade
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# rustup puts cargo in ~/.cargo/bin; non-login shells (CI, sudo) often miss it.
if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/nonexistent}/.cargo/bin/cargo ]]; then
    PATH=$HOME/.cargo/bin:$PATH
fi

export RUST_BACKTRACE=1
export RUST_LOG=${RUST_LOG:-warn}

START=$SECONDS
section() { printf '\n==== [%4ds] %s\n' "$((SECONDS - START))" "$*"; }

# A full build of the workspace and its tests takes a few gigabytes under target/.
avail_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [[ -n $avail_kb && $avail_kb -lt 6000000 ]]; then
    echo "warning: only $((avail_kb / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }'); the build needs a few GiB" >&2
fi

section "services: scripts/ensure-services.sh --mysql --ops-tools --publishers --rabbitmq4"
scripts/ensure-services.sh --mysql --ops-tools --publishers --rabbitmq4
# Every publisher in clients/ was just made runnable: its test must run, not skip.
export ORDER_TIMEOUT_REQUIRE_PUBLISHERS=1
# The RabbitMQ 4.x test node was just started: the `rabbitmq4::` tests must run on it, and
# fail if it is not there.
export ORDER_TIMEOUT_REQUIRE_RABBITMQ4=1

section "format: cargo fmt --all -- --check"
cargo fmt --all -- --check

section "lint: cargo clippy --locked --workspace --all-targets -- -D warnings"
cargo clippy --locked --workspace --all-targets -- -D warnings
# The service as production builds it, on its own (no dependency's features
# unified with the tools crate's or the tests'): `unreachable_pub` and
# `dead_code` see what is unused or needlessly pub. Everything beyond the
# public API that the tools and the tests use is re-exported by
# `order_timeout::testing`, always compiled, so it is linted here too.
section "lint: cargo clippy --locked -p order-timeout --bins --lib -- -D warnings (production build)"
cargo clippy --locked -p order-timeout --bins --lib -- -D warnings

section "previous release: scripts/previous-release.sh (the rolling-upgrade test's, cached under target/)"
scripts/previous-release.sh
# The MariaDB upgrade case starts from 0.1.0 (its kept marker and contraction).
scripts/previous-release.sh 0.1.0

section "test: cargo test --locked --workspace $*"
cargo test --locked --workspace "$@"

section "all checks passed"
