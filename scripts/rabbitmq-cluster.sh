#!/usr/bin/env bash
# Run an N-node RabbitMQ cluster of private nodes on this machine: for trying cluster
# failover locally, and for the Rust tests (which call it through std::process::Command).
# Needs the Debian/Ubuntu `rabbitmq-server` package (its scripts in /usr/lib/rabbitmq/bin);
# runs as any user that can write CLUSTER_DIR.
#
# Usage: scripts/rabbitmq-cluster.sh COMMAND [I]        (nodes are numbered 1..CLUSTER_NODES)
#   start         start CLUSTER_NODES nodes, join them into one cluster and wait until
#                 node 1 sees all of them running; the last stdout line is the AMQP URL
#                 list (as `urls` prints it). A stale CLUSTER_DIR (nothing running) is wiped
#                 first; fails if a node of CLUSTER_DIR still runs. On failure the started
#                 nodes are killed and CLUSTER_DIR is kept for its logs.
#   stop          stop every node of CLUSTER_DIR (`rabbitmqctl stop`, ~15 s limit, then
#                 kill -9 by its own pid), then delete CLUSTER_DIR. Idempotent.
#   status        one line per node, space-separated:
#                   I NODE AMQP_PORT PID|down app=running|stopped|booting|unreachable|down
#                   running=A,B,.. members=A,B,.. partitions=A,B,..|-
#                 where running/members/partitions are that node's own view (node indexes
#                 of this cluster, else full node names; `-` for none). app=stopped covers
#                 stop_app and a pause_minority pause. Exit 0 only if every node runs, sees
#                 all CLUSTER_NODES nodes running and no partition; else 1.
#   urls          comma-separated AMQP URLs of all nodes:
#                   amqp://guest:guest@127.0.0.1:5681/%2f,amqp://guest:guest@127.0.0.1:5682/%2f,...
#   pid I         OS pid of node I's Erlang VM (beam.smp), from its pid file; exit 1 if down
#   kill-node I   kill -9 node I's VM (by that pid) and wait until it is gone; data kept
#   start-node I  (re)start node I with its data (after kill-node/stop-node) and wait until
#                 it runs; it rejoins the cluster by itself
#   stop-node I   graceful `rabbitmqctl stop`, wait until the VM is gone; data kept
#   stop-app I    `rabbitmqctl stop_app` (the VM stays up)
#   start-app I   `rabbitmqctl start_app`, wait until the app runs
#   form          join every running node that is outside node 1's cluster to node 1 (stop_app,
#                 reset, join_cluster, start_app) and wait until node 1 sees all nodes
#                 running; `start` does the same after booting the nodes
#   ctl I ARGS... `rabbitmqctl ARGS` against node I (its cookie, its root if any), its output
#                 and exit code as they are; bounded by CLUSTER_TIMEOUT
# kill-node/stop-node on a node that is down and start-node on one that runs succeed
# (nothing to do). Exit codes: 0 ok, 1 failure, 2 usage error. Progress and errors go to
# stderr; stdout only carries results (start/urls/status/pid). Waits are bounded by
# CLUSTER_TIMEOUT; on a timeout the node's log tail is printed to stderr.
#
# Environment (defaults):
#   CLUSTER_NODES (3)       number of nodes; 1 gives a single private node.
#   CLUSTER_PORT (5681)     node I listens for AMQP on 127.0.0.1:CLUSTER_PORT+I-1 and for
#                           Erlang distribution on 127.0.0.1:CLUSTER_PORT+I-1+10000 (its
#                           CLUSTER_HOSTS address instead of 127.0.0.1 with CLUSTER_NETNS); start
#                           fails when one of them is taken.
#   CLUSTER_NAME (ot-cluster)  node I is ${CLUSTER_NAME}-I@localhost (@ADDRESS_I with
#                           CLUSTER_NETNS); letters, digits, - and _.
#   CLUSTER_DIR (/tmp/order-timeout-rabbitmq-cluster)  everything of the cluster: per-node
#                           config, data, logs and pid files, and the HOME holding the
#                           cluster's own Erlang cookie. `stop` deletes it.
#   CLUSTER_ADVANCED_CONFIG (deploy/rabbitmq/advanced.config of this repo)  copied as every
#                           node's advanced.config.
#   CLUSTER_CONF_EXTRA      optional file appended to every node's rabbitmq.conf, with @I@
#                           replaced by the node index and @PORT@ by its AMQP port (e.g.
#                           `listeners.ssl.default = 56@I@1`).
#   CLUSTER_TIMEOUT (240)   seconds any single wait may take.
#   CLUSTER_VIEW_TIMEOUT (20)  seconds `status` waits for one node's view (app=unreachable past
#                           it; a node in a partition's minority may take long to answer).
#   CLUSTER_RABBITMQ_BIN (/usr/lib/rabbitmq/bin)  where rabbitmq-server and rabbitmqctl are
#                           (inside CLUSTER_ROOT when that is set).
#   CLUSTER_ROOT            optional: a Debian root holding another RabbitMQ and its Erlang
#                           (scripts/rabbitmq4.sh makes one with Debian trixie's 4.x). Every
#                           rabbitmq-server, rabbitmqctl and epmd of the cluster then runs
#                           chrooted there (as root), each in a private mount namespace with
#                           /proc, /dev and CLUSTER_DIR bind-mounted at the same paths, so paths
#                           and pids read the same inside and out; the mounts go away with the
#                           process. Needs root, unshare and chroot.
#   CLUSTER_EPMD_PORT       optional: the epmd port of the cluster's nodes and CLI calls
#                           (ERL_EPMD_PORT). With CLUSTER_ROOT, an epmd of the root is started
#                           on it (127.0.0.1) when nothing listens there, and left running like
#                           the shared one. Default: Erlang's 4369, the machine's own epmd.
#   CLUSTER_NETNS, CLUSTER_HOSTS  optional, together: comma-separated network namespaces
#                           (`ip netns`, made by the caller) and IPv4 addresses, one of each per
#                           node. Node I then runs in namespace I with every command about it
#                           (`ip netns exec`, as root), is named ${CLUSTER_NAME}-I@ADDRESS_I
#                           (long names: RABBITMQ_USE_LONGNAME=true, the CLI too), listens for
#                           AMQP and Erlang distribution on ADDRESS_I only (guest allowed from
#                           anywhere: loopback_users.guest = false), and has an epmd of its own in
#                           its namespace, listening on 127.0.0.1 and ADDRESS_I, started by
#                           `start`/`start-node` and left running (it goes with the namespace).
#                           The nodes must reach each other's addresses (e.g. the namespaces on
#                           one bridge: tools/src/netns.rs `Bridge`); cutting one namespace off
#                           is then a real partition of that node. URLs use the addresses.
# `start` records CLUSTER_NODES, CLUSTER_PORT, CLUSTER_NAME, CLUSTER_ROOT,
# CLUSTER_EPMD_PORT, CLUSTER_NETNS and CLUSTER_HOSTS in CLUSTER_DIR/cluster.env; the other commands take them from there, so
# only CLUSTER_DIR has to match.
#
# The generated rabbitmq.conf (CLUSTER_DIR/nodeI/rabbitmq.conf): AMQP on 127.0.0.1 only,
# guest/guest (allowed from loopback, the default), no plugins (no management UI),
# cluster_name = CLUSTER_NAME, and cluster_partition_handling = pause_minority when there
# are 3 or more nodes (with 1 or 2 nodes the default, ignore: with 2 nodes pause_minority
# would pause the survivor whenever the other node dies). Cluster formation: `start` boots
# all nodes in parallel; node 1 founds the cluster and nodes 2..N join it through classic
# config peer discovery that lists node 1 only (so blank nodes never pair up among
# themselves; they retry until node 1 is ready). A restarted node (start-node) rejoins from
# its own data. After ALL nodes were stopped, start the node that stopped last first
# (RabbitMQ waits for it, up to CLUSTER_TIMEOUT here).
#
# It never touches the machine's own broker (rabbit@localhost, 5672/25672) or anyone else's
# node: its nodes have their own names, ports, data, config, cookie and HOME; the caller's
# RABBITMQ_* and ERL_FLAGS are ignored (/etc/rabbitmq/rabbitmq-env.conf too); rabbitmqctl
# always gets `-n` with one of its node names; and it only ever kills a pid read from one of
# its nodes' pid files, after checking that the process is a beam.smp started with that very
# pid file. epmd is shared and left running.
set -euo pipefail

# chroot lives in /usr/sbin, not on every user's PATH.
PATH=$PATH:/usr/sbin:/sbin

PROG=scripts/rabbitmq-cluster.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)

# Nothing from the caller's RabbitMQ/Erlang environment may reach the private nodes or the
# CLI (RABBITMQ_NODENAME, RABBITMQ_MNESIA_BASE, ... would point them elsewhere).
while IFS= read -r var; do
    unset "$var"
done < <(compgen -e | grep -E '^(RABBITMQ_|ERL_(FLAGS|AFLAGS|ZFLAGS|LIBS|EPMD_PORT)$)' || true)
# If epmd is not running yet the first node starts it: on loopback only.
export ERL_EPMD_ADDRESS=${ERL_EPMD_ADDRESS:-127.0.0.1}

ENV_NODES=${CLUSTER_NODES-}
ENV_PORT=${CLUSTER_PORT-}
ENV_NAME=${CLUSTER_NAME-}
ENV_ROOT=${CLUSTER_ROOT-}
ENV_EPMD_PORT=${CLUSTER_EPMD_PORT-}
ENV_NETNS=${CLUSTER_NETNS-}
NODES=${CLUSTER_NODES:-3}
PORT=${CLUSTER_PORT:-5681}
NAME=${CLUSTER_NAME:-ot-cluster}
DIR=${CLUSTER_DIR:-/tmp/order-timeout-rabbitmq-cluster}
ADVANCED_CONFIG=${CLUSTER_ADVANCED_CONFIG:-$REPO_DIR/deploy/rabbitmq/advanced.config}
CONF_EXTRA=${CLUSTER_CONF_EXTRA:-}
TIMEOUT=${CLUSTER_TIMEOUT:-240}
BIN=${CLUSTER_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
ROOT=${CLUSTER_ROOT:-}
EPMD_PORT=${CLUSTER_EPMD_PORT:-}
NETNS=${CLUSTER_NETNS:-}
HOSTS=${CLUSTER_HOSTS:-}
NETNS_OF=() # node I's namespace is NETNS_OF[I-1] (CLUSTER_NETNS)
HOST_OF=()  # and its address HOST_OF[I-1] (CLUSTER_HOSTS)
STOP_LIMIT=15 # seconds for a graceful stop in `stop` before kill -9
VIEW_TIMEOUT=${CLUSTER_VIEW_TIMEOUT:-20} # seconds one node's view (status) may take

log() { printf '[rabbitmq-cluster %s] %s\n' "$NAME" "$*" >&2; }
die() {
    printf '[rabbitmq-cluster %s] ERROR: %s\n' "$NAME" "$*" >&2
    exit 1
}
usage() { # [EXIT_CODE]: the header comment as help, on stderr
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
    exit "${1:-2}"
}
is_uint() { [[ $1 =~ ^[0-9]{1,9}$ ]]; }
in_range() { is_uint "$1" && ((10#$1 >= $2 && 10#$1 <= $3)); } # VALUE MIN MAX
now() { date +%s; }

# ---------------------------------------------------------------------------- settings

# The directory: absolute and canonical (the pid check compares paths), never "/".
[[ -n $DIR ]] || die "CLUSTER_DIR is empty"
DIR=$(realpath -m -- "$DIR")
[[ $DIR != / ]] || die "CLUSTER_DIR must not be /"
MARKER=$DIR/.rabbitmq-cluster-dir
STATE=$DIR/cluster.env

# Values recorded by `start` win over the environment for every other command.
load_state() {
    [[ -f $STATE ]] || return 0
    local key value
    while IFS='=' read -r key value; do
        case $key in
        NODES)
            [[ -n $ENV_NODES && $ENV_NODES != "$value" ]] &&
                log "note: CLUSTER_NODES=$ENV_NODES ignored, $DIR was started with $value"
            NODES=$value
            ;;
        PORT)
            [[ -n $ENV_PORT && $ENV_PORT != "$value" ]] &&
                log "note: CLUSTER_PORT=$ENV_PORT ignored, $DIR was started with $value"
            PORT=$value
            ;;
        NAME)
            [[ -n $ENV_NAME && $ENV_NAME != "$value" ]] &&
                log "note: CLUSTER_NAME=$ENV_NAME ignored, $DIR was started with $value"
            NAME=$value
            ;;
        ROOT)
            [[ -n $ENV_ROOT && $ENV_ROOT != "$value" ]] &&
                log "note: CLUSTER_ROOT=$ENV_ROOT ignored, $DIR was started with ${value:-none}"
            ROOT=$value
            ;;
        EPMD_PORT)
            [[ -n $ENV_EPMD_PORT && $ENV_EPMD_PORT != "$value" ]] &&
                log "note: CLUSTER_EPMD_PORT=$ENV_EPMD_PORT ignored, $DIR was started with ${value:-4369}"
            EPMD_PORT=$value
            ;;
        NETNS)
            [[ -n $ENV_NETNS && $ENV_NETNS != "$value" ]] &&
                log "note: CLUSTER_NETNS=$ENV_NETNS ignored, $DIR was started with ${value:-none}"
            NETNS=$value
            ;;
        HOSTS) HOSTS=$value ;;
        esac
    done <"$STATE"
    return 0
}

validate() {
    in_range "$NODES" 1 50 || die "CLUSTER_NODES must be 1..50, got '$NODES'"
    NODES=$((10#$NODES))
    in_range "$PORT" 1024 $((65535 - 10000 - NODES + 1)) ||
        die "CLUSTER_PORT must leave room for ports PORT..PORT+NODES-1+10000 (1024..65535), got '$PORT'"
    PORT=$((10#$PORT))
    [[ $NAME =~ ^[A-Za-z0-9_-]+$ ]] || die "CLUSTER_NAME may only hold letters, digits, - and _: '$NAME'"
    [[ $NAME != rabbit ]] || die "CLUSTER_NAME must not be 'rabbit'"
    in_range "$TIMEOUT" 1 86400 || die "CLUSTER_TIMEOUT must be a number of seconds, got '$TIMEOUT'"
    in_range "$VIEW_TIMEOUT" 1 3600 || die "CLUSTER_VIEW_TIMEOUT must be a number of seconds, got '$VIEW_TIMEOUT'"
    TIMEOUT=$((10#$TIMEOUT))
    if [[ -n $EPMD_PORT ]]; then
        in_range "$EPMD_PORT" 1024 65535 || die "CLUSTER_EPMD_PORT must be 1024..65535, got '$EPMD_PORT'"
        EPMD_PORT=$((10#$EPMD_PORT))
    fi
    if [[ -n $ROOT ]]; then
        ROOT=$(realpath -m -- "$ROOT")
        [[ $ROOT != / ]] || die "CLUSTER_ROOT must not be /"
        case $DIR/ in
        "$ROOT"/*) die "CLUSTER_DIR must not be inside CLUSTER_ROOT" ;;
        esac
    fi
    validate_netns
    set_runner
}

# CLUSTER_NETNS and CLUSTER_HOSTS: one namespace and one address per node, or neither.
validate_netns() {
    NETNS_OF=()
    HOST_OF=()
    [[ -n $NETNS || -n $HOSTS ]] || return 0
    [[ -n $NETNS && -n $HOSTS ]] || die "CLUSTER_NETNS and CLUSTER_HOSTS go together"
    IFS=, read -r -a NETNS_OF <<<"$NETNS"
    IFS=, read -r -a HOST_OF <<<"$HOSTS"
    ((${#NETNS_OF[@]} == NODES && ${#HOST_OF[@]} == NODES)) ||
        die "CLUSTER_NETNS and CLUSTER_HOSTS must list $NODES entries each, got '$NETNS' and '$HOSTS'"
    local k
    for k in "${!HOST_OF[@]}"; do
        [[ ${HOST_OF[k]} =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || die "CLUSTER_HOSTS: not an IPv4 address: '${HOST_OF[k]}'"
        [[ ${NETNS_OF[k]} =~ ^[A-Za-z0-9_.-]+$ ]] || die "CLUSTER_NETNS: not a namespace name: '${NETNS_OF[k]}'"
    done
}
netns_mode() { ((${#NETNS_OF[@]} > 0)); }

# NSP: the prefix that runs a command in node I's namespace (nothing without CLUSTER_NETNS).
NSP=()
set_nsp() {
    NSP=()
    netns_mode || return 0
    NSP=(ip netns exec "${NETNS_OF[$1 - 1]}")
}

# ------------------------------------------------------------------- the root, if any

# RUN: the command prefix every rabbitmq-server and rabbitmqctl runs under. Without
# CLUSTER_ROOT nothing; with it, a private mount namespace in which the root gets /proc, /dev
# and CLUSTER_DIR (at the same path), then chroot into it. The namespace, and its mounts,
# end with the process; the host's mounts are never changed.
# shellcheck disable=SC2016 # a program for the inner bash
IN_ROOT='root=$1 dir=$2
shift 2
mount -t proc proc "$root/proc" &&
    mount --rbind /dev "$root/dev" &&
    mount --bind "$dir" "$root$dir" || exit 1
exec chroot "$root" /usr/bin/env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"'
RUN=()
set_runner() {
    RUN=()
    [[ -n $ROOT ]] || return 0
    RUN=(unshare --mount --propagation private -- bash -c "$IN_ROOT" in-root "$ROOT" "$DIR")
}

# The root's side of CLUSTER_DIR's bind mount is an empty directory in the root; `start`
# makes it and notes the first directory it had to create, which `stop` removes again
# (empty directories only).
MOUNTPOINT_NOTE=root-mountpoint
make_mountpoint() {
    [[ -n $ROOT ]] || return 0
    local d=$ROOT$DIR first=
    while [[ ! -e $d ]]; do
        first=$d
        d=$(dirname -- "$d")
    done
    mkdir -p -- "$ROOT$DIR"
    [[ -z $first ]] || printf '%s\n' "$first" >"$DIR/$MOUNTPOINT_NOTE"
}
remove_mountpoint() { # FIRST: the directory make_mountpoint created first
    [[ -n $ROOT && -n $1 && $1 == "$ROOT"/* && -d $1 ]] || return 0
    find "$1" -depth -type d -empty -delete 2>/dev/null || true
}

# epmd: the root's own on CLUSTER_EPMD_PORT (a node would start one itself, inside its
# mount namespace, which would then stay with the epmd).
ensure_epmd() { # [I]: with CLUSTER_NETNS, the epmd of node I's namespace (all without I)
    if netns_mode; then
        local i
        for i in ${1:-$(seq 1 "$NODES")}; do ensure_ns_epmd "$i"; done
        return 0
    fi
    [[ -n $ROOT ]] || return 0
    local port=${EPMD_PORT:-4369} deadline
    port_in_use "$port" && return 0
    log "starting the root's epmd on 127.0.0.1:$port"
    ERL_EPMD_ADDRESS=127.0.0.1 chroot "$ROOT" /usr/bin/epmd -daemon -port "$port" </dev/null >/dev/null 2>&1 || true
    deadline=$(($(now) + 10))
    until port_in_use "$port"; do
        (($(now) < deadline)) || die "the root's epmd did not listen on 127.0.0.1:$port"
        sleep 0.1
    done
}

# ensure_ns_epmd I: an epmd in node I's namespace on 127.0.0.1 and node I's address (the
# root's with CLUSTER_ROOT), unless one listens there.
ensure_ns_epmd() {
    local i=$1 port=${EPMD_PORT:-4369} deadline epmd=(/usr/bin/epmd)
    set_nsp "$i"
    "${NSP[@]}" ss -Htln "sport = :$port" 2>/dev/null | grep -q . && return 0
    [[ -z $ROOT ]] || epmd=(chroot "$ROOT" /usr/bin/epmd)
    log "starting an epmd in namespace ${NETNS_OF[i - 1]} on ${HOST_OF[i - 1]}:$port"
    "${NSP[@]}" env ERL_EPMD_ADDRESS="127.0.0.1,${HOST_OF[i - 1]}" "${epmd[@]}" -daemon -port "$port" \
        </dev/null >/dev/null 2>&1 || true
    deadline=$(($(now) + 10))
    until "${NSP[@]}" ss -Htln "sport = :$port" 2>/dev/null | grep -q .; do
        (($(now) < deadline)) || die "no epmd listens on $port in namespace ${NETNS_OF[i - 1]}"
        sleep 0.1
    done
}

node_host() { if netns_mode; then printf '%s' "${HOST_OF[$1 - 1]}"; else printf localhost; fi; }
node_ip() { if netns_mode; then printf '%s' "${HOST_OF[$1 - 1]}"; else printf 127.0.0.1; fi; }
ip_tuple() { printf '{%s}' "${1//./,}"; } # 10.0.0.1 -> {10,0,0,1}
node_name() { printf '%s-%s@%s' "$NAME" "$1" "$(node_host "$1")"; }
amqp_port() { echo $((PORT + $1 - 1)); }
dist_port() { echo $((PORT + $1 - 1 + 10000)); }
node_dir() { printf '%s/node%s' "$DIR" "$1"; }
pid_file() { printf '%s/node%s/rabbitmq.pid' "$DIR" "$1"; }
node_url() { printf 'amqp://guest:guest@%s:%s/%%2f' "$(node_ip "$1")" "$(amqp_port "$1")"; }

urls() {
    local i out=
    for ((i = 1; i <= NODES; i++)); do
        out+=${out:+,}$(node_url "$i")
    done
    printf '%s\n' "$out"
}

check_index() {
    [[ -n ${1:-} ]] || usage
    in_range "$1" 1 "$NODES" || die "node index must be 1..$NODES, got '$1'"
    [[ -f $MARKER ]] || die "no cluster in $DIR (run start first)"
}

# -------------------------------------------------------------------- processes and CLI

# pid_alive PID: the process exists and is not a zombie.
pid_alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != [ZX] ]]
}

# pid_is_node PID I: PID is a live beam.smp started with node I's pid file (so pids from a
# stale pid file that were reused by another process are never touched).
pid_is_node() {
    local comm environ
    pid_alive "$1" || return 1
    comm=$(cat "/proc/$1/comm" 2>/dev/null) || return 1
    [[ $comm == beam.smp ]] || return 1
    environ=$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null) || return 1
    grep -qxF "RABBITMQ_PID_FILE=$(pid_file "$2")" <<<"$environ"
}

# node_pid I: print the pid of node I's VM, or fail when it does not run.
node_pid() {
    local pid
    pid=$(tr -dc '0-9' 2>/dev/null <"$(pid_file "$1")") || return 1
    [[ -n $pid ]] || return 1
    pid_is_node "$pid" "$1" || return 1
    printf '%s\n' "$pid"
}

# wait_gone PID SECONDS
wait_gone() {
    local deadline=$(($(now) + $2))
    while pid_alive "$1"; do
        (($(now) < deadline)) || return 1
        sleep 0.2
    done
}

# common_env I: the environment every rabbitmq-server and rabbitmqctl of node I runs with.
common_env() {
    printf '%s\n' \
        "HOME=$DIR/home" \
        "RABBITMQ_CONF_ENV_FILE=$DIR/rabbitmq-env.conf" \
        "RABBITMQ_CTL_ERL_ARGS=-kernel inet_dist_use_interface $(ip_tuple "$(node_ip "$1")")"
    if netns_mode; then
        printf '%s\n' "RABBITMQ_USE_LONGNAME=true" "ERL_EPMD_ADDRESS=127.0.0.1,$(node_ip "$1")"
    fi
    if [[ -n $EPMD_PORT ]]; then
        printf '%s\n' "ERL_EPMD_PORT=$EPMD_PORT"
    fi
}

# ctl SECONDS I ARGS...: rabbitmqctl against node I, bounded in time.
ctl() {
    local secs=$1 i=$2 env=() nsp=()
    shift 2
    mapfile -t env < <(common_env "$i")
    ! netns_mode || nsp=(ip netns exec "${NETNS_OF[i - 1]}")
    timeout -k 5 "$secs" env "${env[@]}" "${nsp[@]}" "${RUN[@]}" "$BIN/rabbitmqctl" -n "$(node_name "$i")" "$@"
}

# Boot node I in the background, detached from this script (own session, no inherited
# stdio), with output in its console.log.
launch_node() {
    local i=$1 dir env=()
    dir=$(node_dir "$i")
    mapfile -t env < <(common_env "$i")
    set_nsp "$i"
    env+=(
        "RABBITMQ_NODENAME=$(node_name "$i")"
        "RABBITMQ_NODE_PORT=$(amqp_port "$i")"
        "RABBITMQ_DIST_PORT=$(dist_port "$i")"
        "RABBITMQ_MNESIA_BASE=$dir/data"
        "RABBITMQ_LOG_BASE=$dir/log"
        "RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf"
        "RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config"
        "RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/enabled_plugins"
        "RABBITMQ_PID_FILE=$(pid_file "$i")"
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface $(ip_tuple "$(node_ip "$i")")"
        "ERL_CRASH_DUMP=$dir/log/erl_crash.dump"
    )
    rm -f "$(pid_file "$i")"
    printf '\n==== %s: starting %s\n' "$(date '+%F %T')" "$(node_name "$i")" >>"$dir/console.log"
    (
        cd "$dir"
        # The open-file limit a node gets is its soft limit: raise it to the hard one (a soft
        # 1024 leaves a node ~900 handles, fewer than a few vhosts of quorum queues need).
        ulimit -S -n "$(ulimit -H -n)" 2>/dev/null || true
        exec setsid env "${env[@]}" "${NSP[@]}" "${RUN[@]}" "$BIN/rabbitmq-server" >>"$dir/console.log" 2>&1 </dev/null
    ) &
    echo $! >"$dir/server.pid"
}

# log_tail I: what tells why node I failed, on stderr, in under 30 lines: from its console
# output of this boot the first error lines and the last lines, then the end of its log.
log_tail() {
    local i=$1 dir run f
    dir=$(node_dir "$i")
    if [[ -s $dir/console.log ]]; then
        # this boot's part: from the last "==== ...: starting" line written by launch_node
        run=$(awk '/^==== .*: starting /{buf=""; next} {buf=buf $0 "\n"} END{printf "%s", buf}' "$dir/console.log")
        if grep -qF '[error]' <<<"$run"; then
            printf -- '---- %s, first errors of this boot:\n' "$dir/console.log" >&2
            grep -m 8 -F '[error]' <<<"$run" >&2
        fi
        printf -- '---- %s, last lines of this boot:\n' "$dir/console.log" >&2
        if [[ -n $run ]]; then tail -n 5 <<<"$run" >&2; else echo "(no output yet)" >&2; fi
    fi
    f=$dir/log/$(node_name "$i").log
    if [[ -s $f ]]; then
        printf -- '---- %s, last lines:\n' "$f" >&2
        tail -n 10 "$f" >&2
    fi
    printf -- '----\n' >&2
}

# node_fail I MESSAGE: node I's log tail, then the error (last, so a caller that keeps
# only the end of stderr sees it).
node_fail() {
    local i=$1
    shift
    log_tail "$i"
    printf '[rabbitmq-cluster %s] ERROR: node %s (%s): %s\n' "$NAME" "$i" "$(node_name "$i")" "$*" >&2
    return 1
}

# wait_up I DEADLINE: wait until node I's rabbit app runs (fail early when its VM exits).
wait_up() {
    local i=$1 deadline=$2 spid left
    spid=$(cat "$(node_dir "$i")/server.pid" 2>/dev/null || true)
    while :; do
        left=$((deadline - $(now)))
        ((left > 0)) || { node_fail "$i" "not running after ${TIMEOUT}s"; return 1; }
        if node_pid "$i" >/dev/null; then
            # await_startup fails at once while the node is not reachable yet: retry.
            ctl "$((left < 15 ? left : 15))" "$i" await_startup >/dev/null 2>&1 && return 0
        elif [[ -n $spid ]] && ! pid_alive "$spid"; then
            node_fail "$i" "the node exited while starting"
            return 1
        fi
        sleep 0.3
    done
}

# nodes_list NAME,NAME,..|-: this cluster's nodes as their indexes (numerically sorted),
# other nodes by their full names.
nodes_list() {
    local n out=()
    [[ $1 != - ]] || { echo -; return; }
    local IFS=,
    for n in $1; do
        if [[ $n =~ ^${NAME}-([0-9]+)@[^@]+$ ]]; then out+=("${BASH_REMATCH[1]}"); else out+=("$n"); fi
    done
    printf '%s\n' "${out[@]}" | sort -n | paste -sd,
}

# view I: node I's own view, "app=... running=... members=... partitions=...".
view() {
    local out app running members partitions
    out=$(ctl "$VIEW_TIMEOUT" "$1" -q eval '
        F = fun([]) -> "-"; (Ns) -> lists:join(",", [atom_to_list(N) || N <- Ns]) end,
        A = case rabbit:is_running() of
                true -> running;
                false -> case catch rabbit:is_booting() of true -> booting; _ -> stopped end
            end,
        P = case catch rabbit_node_monitor:partitions() of Ps when is_list(Ps) -> Ps; _ -> [] end,
        %% Members: rabbit_nodes:list_members/0 on 3.13+ (with Khepri, Mnesia knows none).
        M = case catch rabbit_nodes:list_members() of
                Ms when is_list(Ms) -> Ms;
                _ -> rabbit_mnesia:cluster_nodes(all)
            end,
        io:format("view: ~s ~s ~s ~s~n",
                  [A, F(rabbit_nodes:all_running()), F(M), F(P)]).' \
        2>/dev/null) || return 1
    out=$(grep -m1 '^view: ' <<<"$out") || return 1
    read -r _ app running members partitions <<<"$out"
    printf 'app=%s running=%s members=%s partitions=%s\n' "$app" "$(nodes_list "$running")" \
        "$(nodes_list "$members")" "$(nodes_list "$partitions")"
}

all_indexes() {
    local i out=
    for ((i = 1; i <= NODES; i++)); do out+=${out:+,}$i; done
    printf '%s' "$out"
}

# in_list I LIST: node index I is in the comma-separated LIST.
in_list() { [[ ,$2, == *",$1,"* ]]; }

# join_strays: every node I >= 2 that runs outside node 1's cluster (it booted alone: peer
# discovery on RabbitMQ 4.0 may still pick a seed node of its own, rabbitmq-server#12681,
# seen once in CI as "running=1,3 members=1,3" for four minutes) is reset and joined to
# node 1 by hand: stop_app, reset, join_cluster, start_app. A node that is a member but not
# running yet is left alone (it is still booting or reconnecting).
join_strays() {
    local v1 members i vi mine
    v1=$(view 1) || return 0
    members=${v1#*members=}
    members=${members%% *}
    for ((i = 2; i <= NODES; i++)); do
        ! in_list "$i" "$members" || continue
        vi=$(view "$i") || continue
        [[ $vi == app=running* ]] || continue
        mine=${vi#*members=}
        mine=${mine%% *}
        ! in_list 1 "$mine" || continue
        log "node $i runs outside node 1's cluster (its view: $vi): resetting it and joining it to node 1"
        ctl "$TIMEOUT" "$i" stop_app >&2 &&
            ctl "$TIMEOUT" "$i" reset >&2 &&
            ctl "$TIMEOUT" "$i" join_cluster "$(node_name 1)" >&2 &&
            ctl "$TIMEOUT" "$i" start_app >&2 ||
            log "node $i: joining it by hand failed; trying again"
    done
}

# wait_formed DEADLINE: node 1 sees all nodes running; strays are joined by hand.
wait_formed() {
    local want v
    want="running=$(all_indexes) "
    while :; do
        v=$(view 1 || true)
        [[ $v == *"$want"* ]] && return 0
        join_strays
        if (($(now) >= $1)); then
            die "the cluster did not form within ${TIMEOUT}s; node 1 reports: ${v:-nothing}"
        fi
        sleep 0.5
    done
}

# graceful_stop I SECONDS: `rabbitmqctl stop` and wait for the VM to exit.
graceful_stop() {
    local i=$1 secs=$2 pid
    pid=$(node_pid "$i") || return 0
    ctl "$secs" "$i" stop "$(pid_file "$i")" >/dev/null 2>&1 || true
    wait_gone "$pid" 2 || return 1
    rm -f "$(pid_file "$i")"
}

# kill_node I: kill -9 node I's VM (pid from its own pid file) and wait until it is gone.
kill_node() {
    local i=$1 pid
    pid=$(node_pid "$i") || return 0
    kill -9 "$pid"
    wait_gone "$pid" 15 || { log "node $i: pid $pid did not exit after kill -9"; return 1; }
    rm -f "$(pid_file "$i")"
}

port_in_use() {
    if command -v ss >/dev/null 2>&1; then
        "${NSP[@]}" ss -Htln "sport = :$1" 2>/dev/null | grep -q .
    else
        # shellcheck disable=SC2016 # $1 expands in the inner bash
        timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
    fi
}

name_registered() { # SHORTNAME: known to epmd (some node of that name runs)
    local epmd=(epmd)
    [[ -z $ROOT ]] || epmd=(chroot "$ROOT" /usr/bin/epmd)
    [[ -z $EPMD_PORT ]] || epmd+=(-port "$EPMD_PORT")
    "${NSP[@]}" "${epmd[@]}" -names 2>/dev/null | grep -q "^name $1 at port "
}

# check_free I: node I's ports and name are not taken (waits briefly for epmd to notice a
# node that was just killed).
check_free() {
    local i=$1 p short deadline
    set_nsp "$i" # with CLUSTER_NETNS: in node I's namespace
    for p in "$(amqp_port "$i")" "$(dist_port "$i")"; do
        ! port_in_use "$p" || die "port $p (node $i) is already in use: $("${NSP[@]}" ss -Htlnp "sport = :$p" 2>/dev/null | head -1)"
    done
    short=$(node_name "$i")
    short=${short%@*}
    deadline=$(($(now) + 5))
    while name_registered "$short"; do
        (($(now) < deadline)) || die "a node named $short@$(node_host "$i") already runs (epmd -names)"
        sleep 0.2
    done
    NSP=()
}

# ------------------------------------------------------------------------------ start

write_files() {
    local i dir conf
    mkdir -p "$DIR/home"
    chmod 700 "$DIR" "$DIR/home"
    touch "$MARKER"
    printf 'NODES=%s\nPORT=%s\nNAME=%s\nROOT=%s\nEPMD_PORT=%s\nNETNS=%s\nHOSTS=%s\n' \
        "$NODES" "$PORT" "$NAME" "$ROOT" "$EPMD_PORT" "$NETNS" "$HOSTS" >"$STATE"
    make_mountpoint
    : >"$DIR/rabbitmq-env.conf" # replaces /etc/rabbitmq/rabbitmq-env.conf (NODENAME=...)
    echo '[].' >"$DIR/enabled_plugins"
    # The cluster's own cookie, shared by its nodes and its rabbitmqctl calls.
    (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -dc '0-9a-f' >"$DIR/home/.erlang.cookie")
    chmod 400 "$DIR/home/.erlang.cookie"
    for ((i = 1; i <= NODES; i++)); do
        dir=$(node_dir "$i")
        mkdir -p "$dir/data" "$dir/log"
        cp "$ADVANCED_CONFIG" "$dir/advanced.config"
        conf=$dir/rabbitmq.conf
        {
            echo "# Generated by $PROG: node $i of $NODES ($(node_name "$i"))."
            echo "listeners.tcp.default = $(node_ip "$i"):$(amqp_port "$i")"
            if netns_mode; then
                # The clients come over the namespace's link, not its loopback.
                echo "loopback_users.guest = false"
            fi
            echo "cluster_name = $NAME"
            if ((NODES >= 3)); then
                echo "cluster_partition_handling = pause_minority"
            fi
            if ((i >= 2)); then
                # Node 1 founds the cluster; a blank node I >= 2 joins node 1 (and only
                # node 1, so nodes booting side by side never pair up on their own), and
                # keeps trying for up to four minutes while node 1 boots (a minute was not
                # always enough for three Erlang 27 nodes booting side by side on a busy
                # 2-core machine: nodes 2 and 3 gave up and booted alone, and the cluster
                # never formed).
                echo "cluster_formation.peer_discovery_backend = classic_config"
                echo "cluster_formation.classic_config.nodes.1 = $(node_name 1)"
                echo "cluster_formation.classic_config.nodes.2 = $(node_name "$i")"
                echo "cluster_formation.discovery_retry_limit = 480"
                echo "cluster_formation.discovery_retry_interval = 500"
            fi
            if [[ -n $CONF_EXTRA ]]; then
                echo "# from CLUSTER_CONF_EXTRA=$CONF_EXTRA"
                sed -e "s/@I@/$i/g" -e "s/@PORT@/$(amqp_port "$i")/g" "$CONF_EXTRA"
            fi
        } >"$conf"
    done
}

any_running() { # prints "I:PID" of every running node of DIR
    local d i pid
    for d in "$DIR"/node*/; do
        [[ -d $d ]] || continue
        i=${d%/}
        i=${i##*/node}
        is_uint "$i" || continue
        if pid=$(node_pid "$i"); then printf '%s:%s ' "$i" "$pid"; fi
    done
}

START_OK=0
start_cleanup() {
    local rc=$? i spid deadline
    ((START_OK)) && return 0
    log "start failed: killing the nodes it started (logs kept in $DIR; \`$PROG stop\` deletes it)"
    for ((i = 1; i <= NODES; i++)); do
        # A VM that is still booting may not have written its pid file yet.
        spid=$(cat "$(node_dir "$i")/server.pid" 2>/dev/null || true)
        deadline=$(($(now) + 10))
        while [[ -n $spid ]] && pid_alive "$spid" && ! node_pid "$i" >/dev/null && (($(now) < deadline)); do
            sleep 0.2
        done
        if node_pid "$i" >/dev/null; then
            kill_node "$i" || true
        elif [[ -n $spid ]] && pid_alive "$spid"; then
            log "node $i wrote no pid file, so its VM was not killed; its rabbitmq-server pid is $spid"
        fi
    done
    exit $((rc ? rc : 1))
}

cmd_start() {
    local i t0 deadline running pids=() failed=0
    validate
    if [[ -n $ROOT ]]; then
        [[ -x $ROOT$BIN/rabbitmq-server && -x $ROOT$BIN/rabbitmqctl && -x $ROOT/usr/bin/epmd ]] ||
            die "no RabbitMQ in $ROOT$BIN (CLUSTER_ROOT; scripts/rabbitmq4.sh prepare makes one)"
        [[ $(id -u) -eq 0 ]] || die "CLUSTER_ROOT needs root (chroot, mount namespaces)"
        if ! command -v unshare >/dev/null || ! command -v chroot >/dev/null; then
            die "CLUSTER_ROOT needs unshare and chroot (util-linux, coreutils)"
        fi
    else
        [[ -x $BIN/rabbitmq-server && -x $BIN/rabbitmqctl ]] ||
            die "no RabbitMQ in $BIN (apt-get install rabbitmq-server, or set CLUSTER_RABBITMQ_BIN)"
    fi
    if netns_mode; then
        [[ $(id -u) -eq 0 ]] || die "CLUSTER_NETNS needs root (ip netns exec)"
        local ns
        for ns in "${NETNS_OF[@]}"; do
            [[ -e /var/run/netns/$ns ]] || die "CLUSTER_NETNS: no network namespace '$ns' (ip netns list)"
        done
    fi
    [[ -r $ADVANCED_CONFIG ]] || die "CLUSTER_ADVANCED_CONFIG not readable: $ADVANCED_CONFIG"
    [[ -z $CONF_EXTRA || -r $CONF_EXTRA ]] || die "CLUSTER_CONF_EXTRA not readable: $CONF_EXTRA"
    if [[ -e $DIR ]]; then
        [[ -f $MARKER ]] || die "$DIR exists and was not made by $PROG; choose another CLUSTER_DIR"
        running=$(any_running)
        [[ -z $running ]] || die "the cluster in $DIR already runs (node:pid ${running% }); run \`$PROG stop\` first"
    fi
    for ((i = 1; i <= NODES; i++)); do check_free "$i"; done
    if [[ -e $DIR ]]; then
        log "removing the stale $DIR (nothing runs there)"
        rm -rf -- "$DIR"
    fi

    t0=$(date +%s%N)
    trap start_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    write_files
    ensure_epmd
    deadline=$(($(now) + TIMEOUT))
    if ((NODES == 1)); then
        log "starting node $(node_name 1) (AMQP on $(node_ip 1):$PORT) in $DIR"
    else
        log "starting $NODES nodes in parallel (AMQP on $(node_ip 1):$PORT..$(node_ip "$NODES"):$(amqp_port "$NODES")) in $DIR"
    fi
    for ((i = 1; i <= NODES; i++)); do launch_node "$i"; done
    for ((i = 1; i <= NODES; i++)); do
        wait_up "$i" "$deadline" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || failed=1; done
    ((failed == 0)) || exit 1
    ((NODES == 1)) || wait_formed "$deadline"
    START_OK=1
    trap - EXIT INT TERM
    t0=$((($(date +%s%N) - t0) / 100000000))
    log "$NODES node(s) running, in $((t0 / 10)).$((t0 % 10)) s"
    urls
}

# ------------------------------------------------------------------------------- stop

cmd_stop() {
    local d i pids=() failed=0 running
    if [[ ! -e $DIR ]]; then
        log "nothing to stop ($DIR does not exist)"
        return 0
    fi
    [[ -f $MARKER ]] || die "$DIR was not made by $PROG: not touching it"
    for d in "$DIR"/node*/; do
        [[ -d $d ]] || continue
        i=${d%/}
        i=${i##*/node}
        is_uint "$i" || continue
        node_pid "$i" >/dev/null || continue
        (
            graceful_stop "$i" "$STOP_LIMIT" && exit 0
            log "node $i did not stop within ${STOP_LIMIT}s: kill -9"
            kill_node "$i"
        ) &
        pids+=($!)
    done
    ((${#pids[@]} == 0)) || log "stopping ${#pids[@]} node(s)"
    for i in "${pids[@]}"; do wait "$i" || failed=1; done
    running=$(any_running)
    if ((failed)) || [[ -n $running ]]; then
        die "could not stop every node (still running, node:pid: ${running:-?}); $DIR kept"
    fi
    local first=
    [[ ! -f $DIR/$MOUNTPOINT_NOTE ]] || first=$(cat "$DIR/$MOUNTPOINT_NOTE")
    rm -rf -- "$DIR"
    remove_mountpoint "$first"
    log "stopped; $DIR deleted"
}

# ------------------------------------------------------------------------------ status

cmd_status() {
    local i tmp pid v ok=1 want line
    tmp=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now
    trap "rm -rf -- '$tmp'" EXIT
    for ((i = 1; i <= NODES; i++)); do
        if pid=$(node_pid "$i"); then
            { view "$i" || echo "app=unreachable running=- members=- partitions=-"; } >"$tmp/$i" &
        fi
    done
    wait
    want="app=running running=$(all_indexes) "
    for ((i = 1; i <= NODES; i++)); do
        if pid=$(node_pid "$i"); then
            v=$(cat "$tmp/$i")
        else
            pid=down
            v="app=down running=- members=- partitions=-"
        fi
        [[ $v == "$want"*" partitions=-" ]] || ok=0
        line="$i $(node_name "$i") $(amqp_port "$i") $pid $v"
        printf '%s\n' "$line"
    done
    ((ok))
}

# -------------------------------------------------------------------- node commands

cmd_start_node() {
    local i=$1
    if node_pid "$i" >/dev/null; then
        log "node $i already runs"
        return 0
    fi
    check_free "$i"
    ensure_epmd "$i"
    log "starting node $i ($(node_name "$i")) with its data"
    launch_node "$i"
    wait_up "$i" $(($(now) + TIMEOUT)) || exit 1
    log "node $i runs"
}

cmd_stop_node() {
    local i=$1 pid
    pid=$(node_pid "$i") || { log "node $i is not running"; return 0; }
    log "stopping node $i (pid $pid)"
    ctl "$TIMEOUT" "$i" stop "$(pid_file "$i")" >&2 || true
    wait_gone "$pid" 5 || die "node $i (pid $pid) still runs after \`rabbitmqctl stop\`; try kill-node"
    rm -f "$(pid_file "$i")"
    log "node $i stopped"
}

cmd_kill_node() {
    local i=$1 pid
    pid=$(node_pid "$i") || { log "node $i is not running"; return 0; }
    kill_node "$i" || die "node $i (pid $pid) survived kill -9"
    log "node $i killed (pid $pid)"
}

cmd_stop_app() {
    local i=$1
    node_pid "$i" >/dev/null || die "node $i is not running"
    ctl "$TIMEOUT" "$i" stop_app >&2 || { node_fail "$i" "stop_app failed"; exit 1; }
}

cmd_start_app() {
    local i=$1
    node_pid "$i" >/dev/null || die "node $i is not running (use start-node)"
    ctl "$TIMEOUT" "$i" start_app >&2 || { node_fail "$i" "start_app failed"; exit 1; }
    wait_up "$i" $(($(now) + TIMEOUT)) || exit 1
}

# ------------------------------------------------------------------------------- main

CMD=${1:-}
ARG=${2:-}
case $CMD in
start) cmd_start ;;
stop)
    load_state
    validate_netns
    set_runner
    cmd_stop
    ;;
status)
    load_state
    validate
    cmd_status
    ;;
urls)
    load_state
    validate
    urls
    ;;
pid | kill-node | start-node | stop-node | stop-app | start-app)
    load_state
    validate
    check_index "$ARG"
    ARG=$((10#$ARG))
    case $CMD in
    pid) node_pid "$ARG" || { log "node $ARG is not running"; exit 1; } ;;
    kill-node) cmd_kill_node "$ARG" ;;
    start-node) cmd_start_node "$ARG" ;;
    stop-node) cmd_stop_node "$ARG" ;;
    stop-app) cmd_stop_app "$ARG" ;;
    start-app) cmd_start_app "$ARG" ;;
    esac
    ;;
form)
    load_state
    validate
    wait_formed $(($(now) + TIMEOUT))
    ;;
ctl)
    load_state
    validate
    check_index "$ARG"
    shift 2
    ctl "$TIMEOUT" "$((10#$ARG))" "$@"
    ;;
-h | --help | help) usage 0 ;;
*) usage ;;
esac
