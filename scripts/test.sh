#!/usr/bin/env bash
# The project's test command (README and CI run exactly this), against real RabbitMQ
# (3.10 and a private 4.x node), PostgreSQL and MariaDB servers (docs/testing.md).
#
# Usage:
#   scripts/test.sh              everything, as CI runs it: the services, formatting, both
#                                lints, the earlier releases' binaries, then every test (the
#                                library's, the tools', the end-to-end suites', the doc tests),
#                                the slowest tests and where the time went
#   scripts/test.sh GROUP...     only these groups, with only the services and builds they need:
#                                lint, unit (the service's own unit tests), tools, doc, or an
#                                end-to-end suite (a file of tests/e2e: store, service,
#                                failures, ...); `scripts/test.sh --list` lists them
#   scripts/test.sh FILTER...    (not a group name) every test whose name contains a FILTER,
#                                e.g. `scripts/test.sh cascade`, with every service
#   scripts/test.sh --list       the groups
#
# The tests run under cargo-nextest, each in a process of its own, ORDER_TIMEOUT_TEST_JOBS
# (default 4) at a time (.config/nextest.toml); it is installed with `cargo install` when
# missing. What is built once and reused across runs and checkouts on this machine -- the
# build directory (CARGO_TARGET_DIR, unless set) and the earlier releases' binaries -- lives
# in ORDER_TIMEOUT_CACHE (scripts/cache-dir.sh: /var/cache/order-timeout for root). Runs on
# one machine take turns: they share that build directory and the machine's broker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# rustup puts cargo in ~/.cargo/bin; non-login shells (CI, sudo) often miss it.
if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/nonexistent}/.cargo/bin/cargo ]]; then
    PATH=$HOME/.cargo/bin:$PATH
fi

export RUST_BACKTRACE=1
export RUST_LOG=${RUST_LOG:-warn}

# The end-to-end suites: the files (and folders) of tests/e2e but its harness.
e2e_suites() {
    local f
    for f in tests/e2e/*.rs; do
        f=${f##*/}
        f=${f%.rs}
        [[ $f == main ]] || echo "$f"
    done
}
# Suites with tests on the RabbitMQ 4.x test node (`rabbitmq4` cells, private 4.x nodes).
RABBITMQ4_SUITES=" service failures operations permanent_failures safety_net timers broker_versions broker_faults partitions "
# Suites that run promtool, headless Chromium or kubernetes-validate.
OPS_TOOLS_SUITES=" alerts browser kubernetes "
OTHER_GROUPS="lint unit tools doc"

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    exit "${1:-0}"
}

# What to run: everything, some groups, or the tests matching some filters.
all=true groups=() filters=()
for arg in "$@"; do
    case $arg in
    -h | --help) usage ;;
    --list)
        echo "groups: $OTHER_GROUPS"
        echo "end-to-end suites: $(e2e_suites | tr '\n' ' ')"
        exit 0
        ;;
    -*)
        echo "scripts/test.sh: unknown option $arg" >&2
        usage 2 >&2
        ;;
    *)
        all=false
        if [[ " $OTHER_GROUPS " == *" $arg "* ]] || e2e_suites | grep -qx -- "$arg"; then
            groups+=("$arg")
        else
            filters+=("$arg")
        fi
        ;;
    esac
done
if [[ ${#groups[@]} -gt 0 && ${#filters[@]} -gt 0 ]]; then
    echo "scripts/test.sh: give groups or filters, not both (groups: ${groups[*]}; not a group: ${filters[*]})" >&2
    exit 2
fi
wants() { $all || [[ " ${groups[*]} " == *" $1 "* ]] || [[ ${#filters[@]} -gt 0 && $1 != lint && $1 != doc ]]; }
wants_any_of() {
    local s
    for s in $1; do wants "$s" && return 0; done
    return 1
}
e2e_groups=()
for g in "${groups[@]}"; do
    [[ " $OTHER_GROUPS " == *" $g "* ]] || e2e_groups+=("$g")
done

START=$SECONDS
section_start=$START
section_name=
breakdown=()
# section NAME: starts a timed section (the previous one ends); `section` alone ends the last.
section() {
    local now=$SECONDS
    if [[ -n $section_name ]]; then
        breakdown+=("$(printf '%6ds  %s' "$((now - section_start))" "$section_name")")
    fi
    section_start=$now
    section_name=${1:-}
    [[ -z $section_name ]] || printf '\n==== [%4ds] %s\n' "$((now - START))" "$section_name"
}

# shellcheck source=scripts/cache-dir.sh
source scripts/cache-dir.sh
CACHE=$(cache_dir)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}

# One run at a time on this machine: runs share the build directory (a build of another
# checkout would replace the binaries this run's tests start) and the machine's broker.
exec 8>"$CACHE/test.lock"
if ! flock -n 8; then
    echo "scripts/test.sh: another run holds $CACHE/test.lock ($(cat "$CACHE/test.owner" 2>/dev/null || echo '?')); waiting for it" >&2
    flock 8
fi
echo "pid $$, $PWD, since $(date -u +%FT%TZ)" >"$CACHE/test.owner"

# A full build of the workspace and its tests takes a few gigabytes.
avail_kb=$(df -Pk "$CARGO_TARGET_DIR" 2>/dev/null | awk 'NR == 2 { print $4 }' || true)
if [[ -n $avail_kb && $avail_kb -lt 6000000 ]]; then
    echo "warning: only $((avail_kb / 1024)) MiB free for $CARGO_TARGET_DIR; the build needs a few GiB" >&2
fi

# --- services -----------------------------------------------------------------------------
services=()
needs_broker=false
if $all || [[ ${#filters[@]} -gt 0 ]]; then
    services=(--mysql --ops-tools --publishers --rabbitmq4)
    needs_broker=true
else
    for g in "${e2e_groups[@]}"; do
        needs_broker=true
        if [[ $RABBITMQ4_SUITES == *" $g "* ]]; then services+=(--rabbitmq4); fi
        if [[ $OPS_TOOLS_SUITES == *" $g "* ]]; then services+=(--ops-tools); fi
        if [[ $g == publishers ]]; then services+=(--publishers); fi
    done
    if wants tools; then needs_broker=true; fi
    if $needs_broker; then services+=(--mysql); fi
fi
if $needs_broker; then
    # Each flag once.
    read -r -a services <<<"$(printf '%s\n' "${services[@]}" | sort -u | tr '\n' ' ')"
    section "services: scripts/ensure-services.sh ${services[*]}"
    # Without the lock's descriptor: a server it starts (the 4.x test node) outlives this
    # run, and would hold the lock for ever, keeping every later run waiting.
    scripts/ensure-services.sh "${services[@]}" 8>&-
    # The publishers' toolchains and the 4.x test node were just made ready: their tests
    # must run, not skip.
    if [[ " ${services[*]} " == *" --publishers "* ]]; then export ORDER_TIMEOUT_REQUIRE_PUBLISHERS=1; fi
    if [[ " ${services[*]} " == *" --rabbitmq4 "* ]]; then export ORDER_TIMEOUT_REQUIRE_RABBITMQ4=1; fi
fi

if ! cargo nextest --version >/dev/null 2>&1; then
    section "tools: cargo install --locked cargo-nextest (once per machine)"
    cargo install --locked cargo-nextest
fi

# --- lints --------------------------------------------------------------------------------
if wants lint; then
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
fi

# --- earlier releases (the upgrade suite's) -------------------------------------------------
if wants upgrade; then
    section "previous releases: scripts/previous-release.sh (built once per machine and commit, in $CACHE)"
    scripts/previous-release.sh
    # The MariaDB upgrade case starts from 0.1.0 (its kept marker and contraction).
    scripts/previous-release.sh 0.1.0
fi

# --- tests ----------------------------------------------------------------------------------
# What nextest runs: a filterset over the workspace's test binaries.
exprs=()
if $all; then
    exprs=("all()")
elif [[ ${#filters[@]} -gt 0 ]]; then
    for f in "${filters[@]}"; do exprs+=("test(~$f)"); done
else
    wants unit && exprs+=("package(order-timeout) & (kind(lib) | kind(bin))")
    wants tools && exprs+=("package(order-timeout-tools)")
    for g in "${e2e_groups[@]}"; do exprs+=("binary(e2e) & test(/^$g::/)"); done
fi
junit=target/nextest/default/junit.xml
if [[ ${#exprs[@]} -gt 0 ]]; then
    filterset=$(printf ' | (%s)' "${exprs[@]}")
    filterset=${filterset:3}
    section "build: cargo nextest run --no-run (the tests' binaries)"
    cargo nextest run --locked --workspace --no-run
    section "test: cargo nextest run --workspace -E '$filterset'"
    rm -f "$junit"
    status=0
    cargo nextest run --locked --workspace --no-tests=pass -j "${ORDER_TIMEOUT_TEST_JOBS:-4}" \
        -E "$filterset" || status=$?
    test_section=$section_name
fi

if wants doc; then
    section "doc tests: cargo test --locked --workspace --doc"
    cargo test --locked --workspace --doc
fi
section

# --- where the time went --------------------------------------------------------------------
if [[ -f $junit ]] && command -v python3 >/dev/null 2>&1; then
    python3 - "$junit" <<'EOF'
import collections, sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), c.get("classname", ""), c.get("name", ""))
         for c in ET.parse(sys.argv[1]).iter("testcase")]
print("\n==== the 15 slowest tests")
for time, binary, name in sorted(cases, reverse=True)[:15]:
    print(f"{time:8.1f}s  {binary} {name}")
groups = collections.defaultdict(lambda: [0, 0.0])
for time, binary, name in cases:
    group = name.split("::")[0] if binary.endswith("::e2e") else binary
    groups[group][0] += 1
    groups[group][1] += time
print("\n==== test time by group (tests, summed time; they run side by side)")
for group, (n, total) in sorted(groups.items(), key=lambda g: -g[1][1]):
    print(f"{total:8.1f}s  {n:4d}  {group}")
EOF
fi
printf '\n==== where the time went (%d s in all)\n' "$((SECONDS - START))"
printf '%s\n' "${breakdown[@]}"
if [[ ${status:-0} -ne 0 ]]; then
    printf '\n==== FAILED: cargo nextest run (%s) exited %s; the failing tests are listed above\n' \
        "${test_section:-tests}" "$status"
    exit "$status"
fi
printf '\n==== all checks passed\n'
