# Sourced by the scripts (not run): where this machine keeps what the test
# command builds once and reuses across checkouts and runs -- the earlier
# releases' binaries (scripts/previous-release.sh) and the build directory of
# the tests (scripts/test.sh). ORDER_TIMEOUT_CACHE when set; else
# /var/cache/order-timeout when it is (or can be made) writable, as for root
# in CI; else ~/.cache/order-timeout.
# shellcheck shell=bash
cache_dir() {
    local dir=${ORDER_TIMEOUT_CACHE:-}
    if [[ -z $dir ]]; then
        if mkdir -p /var/cache/order-timeout 2>/dev/null && [[ -w /var/cache/order-timeout ]]; then
            dir=/var/cache/order-timeout
        else
            dir=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/order-timeout
        fi
    fi
    mkdir -p "$dir"
    printf '%s\n' "$dir"
}
