#!/usr/bin/env bash
# RabbitMQ 4.x beside the machine's own broker, for the test suite: Debian trixie's
# rabbitmq-server (4.0.5, Erlang 27) in a root of its own, made once with debootstrap and
# cached, and a private test node run from it on its own ports, with every deprecated
# feature denied and Khepri (the 4.x metadata store) on. The machine's broker (5672, epmd
# on 4369) is never touched: the 4.x nodes have their own names, ports, data, cookie and
# epmd (4390). Needs root (debootstrap, chroot, mount namespaces) and, the first time,
# the Debian archive (115 packages downloaded, 370 MB on disk).
#
# Usage: scripts/rabbitmq4.sh [COMMAND]
#   start (default)  prepare the root (if needed), then start the test node unless it runs
#                    already (a running one is left alone); prints how to reach it. Idempotent.
#   prepare          only make sure the root is there (installs debootstrap from the Debian
#                    archive if missing); prints the root's path. A root is used only once a
#                    marker file says it is complete; an interrupted one is made again.
#   stop             stop the test node (graceful, then kill -9 by its own pid) and delete its
#                    data directory.
#   status           the test node's status line (scripts/rabbitmq-cluster.sh status); exit 0
#                    only when it runs.
#   url              the test node's AMQP URL (default vhost, guest/guest from 127.0.0.1).
#   admin            what joining the test node as an Erlang node takes, one KEY=VALUE a line:
#                    url, node, cookie_home (the HOME whose .erlang.cookie is its cookie) and
#                    epmd_port (the tests make their vhosts through it: tools/src/broker_admin.rs).
#   ctl ARGS...      rabbitmqctl ARGS against the test node, run from the root (e.g.
#                    `scripts/rabbitmq4.sh ctl list_vhosts`).
#   cluster ARGS...  scripts/rabbitmq-cluster.sh ARGS with nodes of the root (CLUSTER_* as
#                    there; the 4.x epmd port). `cluster start` also denies the deprecated
#                    features (prepended to CLUSTER_CONF_EXTRA) and turns Khepri on once the
#                    cluster has formed. The other commands go to the script as they are (the
#                    cluster's directory remembers its root). With CLUSTER_NETNS and
#                    CLUSTER_HOSTS each node runs in a network namespace of its own, with
#                    an epmd of the root there on the 4.x epmd port (a partition test's
#                    cluster: tools/src/partition/).
#   version          the root's rabbitmq-server and Erlang versions.
#
# Environment (defaults):
#   RABBITMQ4_ROOT (/var/cache/order-timeout/rabbitmq4-trixie)  the root.
#   RABBITMQ4_SUITE (trixie), RABBITMQ4_MIRROR (http://deb.debian.org/debian)  what
#                    debootstrap installs from (only when the root is made).
#   RABBITMQ4_PORT (5673)       the test node's AMQP port; Erlang distribution on PORT+10000.
#   RABBITMQ4_EPMD_PORT (4390)  the epmd of the 4.x nodes (ERL_EPMD_PORT).
#   RABBITMQ4_DIR (/var/lib/order-timeout/rabbitmq4)  the test node's config, data, logs and
#                    cookie (scripts/rabbitmq-cluster.sh's CLUSTER_DIR).
# The test node is `ot-rabbitmq4-1@localhost`.
set -euo pipefail

PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER_SCRIPT=$SCRIPT_DIR/rabbitmq-cluster.sh

ROOT=${RABBITMQ4_ROOT:-/var/cache/order-timeout/rabbitmq4-trixie}
SUITE=${RABBITMQ4_SUITE:-trixie}
MIRROR=${RABBITMQ4_MIRROR:-http://deb.debian.org/debian}
PORT=${RABBITMQ4_PORT:-5673}
EPMD_PORT=${RABBITMQ4_EPMD_PORT:-4390}
DIR=${RABBITMQ4_DIR:-/var/lib/order-timeout/rabbitmq4}
NAME=ot-rabbitmq4
NODE=$NAME-1@localhost
MARKER=$ROOT/.order-timeout-rabbitmq4-complete

# RabbitMQ 4.0's deprecated features, all denied (`rabbitmqctl list_deprecated_features`;
# classic_queue_mirroring is removed in 4.0, so denied already). The e2e test
# broker_versions::the_rabbitmq4_node_denies_every_deprecated_feature_and_runs_khepri fails when the root's
# version deprecates one more that is not listed here.
DENY_DEPRECATED='deprecated_features.permit.amqp_address_v1 = false
deprecated_features.permit.global_qos = false
deprecated_features.permit.queue_master_locator = false
deprecated_features.permit.ram_node_type = false
deprecated_features.permit.transient_nonexcl_queues = false'

log() { printf '[rabbitmq4] %s\n' "$*" >&2; }
die() {
    printf '[rabbitmq4] ERROR: %s\n' "$*" >&2
    exit 1
}
usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
    exit "${1:-2}"
}
need_root() {
    [[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot and mount namespaces); run it as root or with sudo"
}

if ! [[ $PORT =~ ^[0-9]{4,5}$ ]] || ((PORT > 55535)) || ((PORT == 5672)); then
    die "RABBITMQ4_PORT must be 1024..55535 and not 5672 (the machine's broker), got '$PORT'"
fi
if ! [[ $EPMD_PORT =~ ^[0-9]{4,5}$ ]] || ((EPMD_PORT > 65535)) || ((EPMD_PORT == 4369)); then
    die "RABBITMQ4_EPMD_PORT must be 1024..65535 and not 4369 (the machine's epmd), got '$EPMD_PORT'"
fi

# ---------------------------------------------------------------------------- the root

root_complete() { [[ -f $MARKER && -x $ROOT/usr/lib/rabbitmq/bin/rabbitmq-server ]]; }

ensure_debootstrap() {
    command -v debootstrap >/dev/null && [[ -f /usr/share/debootstrap/scripts/$SUITE ]] && return 0
    command -v apt-get >/dev/null || die "debootstrap is missing and there is no apt-get to install it"
    log "installing debootstrap (apt-get)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2; then
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
    fi
    [[ -f /usr/share/debootstrap/scripts/$SUITE ]] ||
        die "this debootstrap does not know the suite '$SUITE' (/usr/share/debootstrap/scripts/$SUITE)"
}

# unmount_under DIR: what an interrupted debootstrap left mounted in DIR (/proc, /sys),
# deepest first, so that DIR can be removed (rm --one-file-system never crosses a mount).
unmount_under() {
    local m
    awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r |
        while IFS= read -r m; do
            umount -l -- "$m" || true
        done
}

# Makes the root in ROOT.partial and renames it to ROOT only once it is complete, with the
# marker (package versions) written last: an interrupted run leaves no root that looks
# usable. One at a time (flock), so parallel runs do not build it twice.
cmd_prepare() {
    need_root
    if root_complete; then
        printf '%s\n' "$ROOT"
        return 0
    fi
    mkdir -p "$(dirname "$ROOT")"
    exec 9>"$ROOT.lock"
    if ! flock -n 9; then
        log "another run is making $ROOT; waiting for it"
        flock 9
    fi
    if root_complete; then
        printf '%s\n' "$ROOT"
        return 0
    fi
    ensure_debootstrap
    local partial=$ROOT.partial t0=$SECONDS
    if [[ -e $ROOT ]]; then
        log "removing the incomplete root $ROOT (no marker)"
        unmount_under "$ROOT"
        rm -rf --one-file-system -- "$ROOT"
    fi
    unmount_under "$partial"
    rm -rf --one-file-system -- "$partial"
    log "debootstrap --variant=minbase --include=rabbitmq-server $SUITE $partial $MIRROR (about a minute or two)"
    if ! debootstrap --variant=minbase --include=rabbitmq-server "$SUITE" "$partial" "$MIRROR" \
        >"$ROOT.debootstrap.log" 2>&1; then
        tail -n 20 "$ROOT.debootstrap.log" >&2
        [[ ! -f $partial/debootstrap/debootstrap.log ]] || tail -n 20 "$partial/debootstrap/debootstrap.log" >&2
        die "debootstrap failed (log: $ROOT.debootstrap.log); nothing is used from $partial"
    fi
    # The package's own node is never started from the root (no init runs there), and its
    # default config is not read: the nodes get their own files (scripts/rabbitmq-cluster.sh).
    [[ -x $partial/usr/lib/rabbitmq/bin/rabbitmq-server && -x $partial/usr/bin/epmd ]] ||
        die "debootstrap finished but $partial has no rabbitmq-server or epmd"
    local versions
    # shellcheck disable=SC2016 # dpkg-query fields, not shell
    versions=$(chroot "$partial" dpkg-query -W -f '${Package} ${Version}\n' rabbitmq-server erlang-base)
    mv -- "$partial" "$ROOT"
    printf '%s\n' "$versions" >"$MARKER"
    log "root ready in $((SECONDS - t0)) s: $ROOT ($(tr '\n' ',' <"$MARKER" | sed 's/,$//; s/,/, /g'))"
    printf '%s\n' "$ROOT"
}

cmd_version() {
    root_complete || die "no complete root in $ROOT (run: $0 prepare)"
    cat "$MARKER"
}

# ---------------------------------------------------------------------------- nodes

# cluster ARGS...: scripts/rabbitmq-cluster.sh with nodes of the root.
cluster() {
    CLUSTER_ROOT=$ROOT CLUSTER_EPMD_PORT=$EPMD_PORT "$CLUSTER_SCRIPT" "$@"
}

# The test node's own scripts/rabbitmq-cluster.sh settings.
node() {
    CLUSTER_DIR=$DIR CLUSTER_NODES=1 CLUSTER_PORT=$PORT CLUSTER_NAME=$NAME cluster "$@"
}

url() { printf 'amqp://guest:guest@127.0.0.1:%s/%%2f\n' "$PORT"; }
admin() {
    printf 'url=%s\nnode=%s\ncookie_home=%s\nepmd_port=%s\n' "$(url)" "$NODE" "$DIR/home" "$EPMD_PORT"
}

# turn_on_khepri DIR: Khepri (in RabbitMQ 4.0 an opt-in feature flag) on for the cluster of
# CLUSTER_DIR DIR (through its node 1), and checked.
turn_on_khepri() {
    local dir=$1 state
    CLUSTER_DIR=$dir "$CLUSTER_SCRIPT" ctl 1 -q enable_feature_flag --opt-in khepri_db >&2 ||
        die "could not enable the khepri_db feature flag (cluster in $dir)"
    state=$(CLUSTER_DIR=$dir "$CLUSTER_SCRIPT" ctl 1 -q list_feature_flags name state |
        awk '$1 == "khepri_db" { print $2 }')
    [[ $state == enabled ]] || die "khepri_db is '$state' after enabling it (cluster in $dir)"
}

# A file with the deprecated-feature denials followed by the caller's CLUSTER_CONF_EXTRA.
conf_extra() {
    local f
    f=$(mktemp)
    {
        echo "# scripts/rabbitmq4.sh: every deprecated feature denied"
        printf '%s\n' "$DENY_DEPRECATED"
        if [[ -n ${CLUSTER_CONF_EXTRA:-} ]]; then
            cat -- "$CLUSTER_CONF_EXTRA"
        fi
    } >"$f"
    printf '%s\n' "$f"
}

cmd_cluster() {
    need_root
    root_complete || die "no complete RabbitMQ 4.x root in $ROOT; run: scripts/rabbitmq4.sh prepare (scripts/ensure-services.sh --rabbitmq4 does)"
    if [[ ${1:-} != start ]]; then
        cluster "$@"
        return
    fi
    local extra out rc=0 dir
    extra=$(conf_extra)
    out=$(CLUSTER_CONF_EXTRA=$extra cluster start) || rc=$?
    rm -f -- "$extra"
    ((rc == 0)) || exit "$rc"
    dir=$(realpath -m -- "${CLUSTER_DIR:-/tmp/order-timeout-rabbitmq-cluster}")
    if ! (turn_on_khepri "$dir"); then
        CLUSTER_DIR=$dir "$CLUSTER_SCRIPT" stop || true
        exit 1
    fi
    printf '%s\n' "$out"
}

cmd_start() {
    need_root
    cmd_prepare >/dev/null
    if node pid 1 >/dev/null 2>&1; then
        if CLUSTER_TIMEOUT=30 node ctl 1 -q await_startup >/dev/null 2>&1; then
            log "RabbitMQ $(ver) test node $NODE already runs (left alone)"
            reach
            return 0
        fi
        die "the test node $NODE runs but does not answer; \`$0 stop\` then \`$0 start\`"
    fi
    local t0=$SECONDS extra rc=0
    extra=$(conf_extra)
    CLUSTER_CONF_EXTRA=$extra node start >/dev/null || rc=$?
    rm -f -- "$extra"
    ((rc == 0)) || die "the test node did not start (logs in $DIR)"
    if ! (turn_on_khepri "$DIR"); then
        node stop || true
        exit 1
    fi
    log "RabbitMQ $(ver) test node $NODE started in $((SECONDS - t0)) s"
    reach
}

ver() { awk '$1 == "rabbitmq-server" { print $2 }' "$MARKER" 2>/dev/null || true; }

reach() {
    log "AMQP:        $(url) (guest/guest, from 127.0.0.1)"
    log "rabbitmqctl: $0 ctl ARGS   (node $NODE, epmd 127.0.0.1:$EPMD_PORT, data $DIR)"
    log "stop:        $0 stop"
}

CMD=${1:-start}
[[ $# -eq 0 ]] || shift
case $CMD in
start) cmd_start ;;
prepare) cmd_prepare ;;
stop)
    need_root
    node stop
    ;;
status)
    need_root
    [[ -d $DIR ]] || {
        log "the test node is not running ($DIR does not exist)"
        exit 1
    }
    node status
    ;;
url) url ;;
admin) admin ;;
ctl)
    need_root
    root_complete || die "no complete RabbitMQ 4.x root in $ROOT (run: $0 start)"
    node ctl 1 "$@"
    ;;
cluster) cmd_cluster "$@" ;;
version) cmd_version ;;
-h | --help | help) usage 0 ;;
*) usage ;;
esac
