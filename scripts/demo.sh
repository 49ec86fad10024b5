#!/usr/bin/env bash
# Run the demo: make sure RabbitMQ and PostgreSQL are up (installing them on a fresh
# Debian machine), then build and run `order-timeout-tools demo` in release mode.
# Arguments go to the demo subcommand, e.g.: scripts/demo.sh --help
#   scripts/demo.sh --database mysql    # the same demo with the orders in MariaDB
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# rustup puts cargo in ~/.cargo/bin; non-login shells (CI, sudo) often miss it.
if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/nonexistent}/.cargo/bin/cargo ]]; then
    PATH=$HOME/.cargo/bin:$PATH
fi

# The demo talks AMQP only; it does not need rabbitmqctl (the tests do). With
# `--database mysql` the orders live in MariaDB (installed and started if needed).
services=(--no-rabbitmqctl)
prev=
for arg in "$@"; do
    if [[ $arg == --database=mysql || ($prev == --database && $arg == mysql) ]]; then
        services+=(--mysql)
    fi
    prev=$arg
done
scripts/ensure-services.sh "${services[@]}"

# exec: the script's exit status is the demo's, and Ctrl-C goes straight to it.
exec cargo run --release --locked -p order-timeout-tools --bin order-timeout-tools -- demo "$@"
