#!/usr/bin/env bash
# Builds the production binary of an earlier release from its commit, for the
# rolling-upgrade test (tests/e2e/upgrade.rs) and for operators who want to
# try an upgrade by hand:
#
#   scripts/previous-release.sh [VERSION]     # default: the release before this one
#   scripts/previous-release.sh --which [VERSION]   # only print "VERSION COMMIT"
#
# CHANGELOG.md names each release's commit ("Commit: <sha>" under its
# heading; a release whose entry has no such line yet is found by its tag
# vX.Y.Z). The release before this one is the newest release whose commit
# is not this checkout's HEAD: on a checkout with changes after the newest
# release (an Unreleased section), that newest release; on a release's own
# commit, the one before it. The source is taken from git (the checkout's
# history), exactly the named commit (git archive), built with its own
# Cargo.lock, and the binary is cached once per machine, outside the
# checkout, with the commit it was built from:
# $ORDER_TIMEOUT_CACHE/previous-release/<VERSION>-<COMMIT>/{order-timeout,commit}
# (ORDER_TIMEOUT_CACHE: /var/cache/order-timeout when writable, else
# ~/.cache/order-timeout). A second run, from this checkout or any other
# clone, prints its path at once; two runs building at once take turns.
# Prints the binary's path on the last line of its output.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/nonexistent}/.cargo/bin/cargo ]]; then
    PATH=$HOME/.cargo/bin:$PATH
fi

which=false
if [[ ${1:-} == --which ]]; then
    which=true
    shift
fi

# The releases in CHANGELOG.md, newest first: "## [X.Y.Z] - DATE" headings.
releases=$(awk '/^## \[[0-9]+\.[0-9]+\.[0-9]+\]/ { v = $2; gsub(/[\[\]]/, "", v); print v }' CHANGELOG.md)
# The commit CHANGELOG.md names for release $1 ("Commit: <sha>" under its
# heading), else its tag's, else nothing.
commit_of() {
    local named
    named=$(awk -v v="[$1]" '
        $1 == "##" && $2 == v { inside = 1; next }
        $1 == "##" { inside = 0 }
        inside && /^Commit: / { sub(/^Commit: `?/, ""); sub(/`.*/, ""); print; exit }
    ' CHANGELOG.md)
    if [[ -n $named ]]; then
        echo "$named"
    else
        git rev-parse --verify --quiet "refs/tags/v$1^{commit}" || true
    fi
}
head=$(git rev-parse HEAD 2>/dev/null || true)
version=${1:-}
if [[ -z $version ]]; then
    for v in $releases; do
        c=$(commit_of "$v")
        if [[ -n $c && $c != "$head" ]]; then
            version=$v
            break
        fi
    done
fi
if [[ -z $version ]]; then
    echo "previous-release: CHANGELOG.md names no release commit other than this checkout's" >&2
    exit 1
fi
commit=$(commit_of "$version")
if [[ -z $commit ]]; then
    echo "previous-release: CHANGELOG.md gives no 'Commit:' line for [$version], and there is no tag v$version" >&2
    exit 1
fi
if $which; then
    echo "$version $commit"
    exit 0
fi

# shellcheck source=scripts/cache-dir.sh
source scripts/cache-dir.sh
cache=$(cache_dir)/previous-release
out=$cache/$version-$commit
bin=$out/order-timeout
cached() { [[ -x $bin && -f $out/commit && $(cat "$out/commit") == "$commit" ]]; }
if cached; then
    echo "$bin"
    exit 0
fi
mkdir -p "$cache"
# One build at a time on this machine (another clone's run may be building it now).
exec 9>"$cache/lock"
flock 9
if cached; then
    echo "$bin"
    exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null \
    && [[ $(git rev-parse --is-shallow-repository 2>/dev/null) == true ]]; then
    echo "previous-release: a shallow clone; fetching the history for $commit" >&2
    git fetch --quiet --unshallow >&2 || true
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "previous-release: commit $commit of release $version is not in this checkout's history (a shallow clone? git fetch --unshallow)" >&2
    exit 1
fi

echo "building order-timeout $version from $commit in $out (once; cached afterwards)" >&2
rm -rf "$out/src"
mkdir -p "$out/src"
git archive "$commit" | tar -x -C "$out/src"
# The release's own lock file and package layout: only its service binary.
manifest=$out/src/Cargo.toml
package=order-timeout
CARGO_TARGET_DIR=$cache/target \
    cargo build --locked --manifest-path "$manifest" -p "$package" --bin order-timeout >&2
cp "$cache/target/debug/order-timeout" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$commit" >"$out/commit"
rm -rf "$out/src"
"$bin" --version >&2
echo "$bin"
