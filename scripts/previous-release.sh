#!/usr/bin/env bash
# Builds the production binary of an earlier release from its commit, for the
# rolling-upgrade test (tests/e2e/upgrade.rs) and for operators who want to
# try an upgrade by hand:
#
#   scripts/previous-release.sh [VERSION]     # default: the release before this one
#
# CHANGELOG.md names each release's commit ("Commit: <sha>" under its
# heading). The source is taken from git (the checkout's history), built in
# target/previous-release/<VERSION>/ with its own Cargo.lock, and the binary
# is cached there: a second run prints its path at once. Prints the binary's
# path on the last line of its output.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/nonexistent}/.cargo/bin/cargo ]]; then
    PATH=$HOME/.cargo/bin:$PATH
fi

# The releases in CHANGELOG.md, newest first: "## [X.Y.Z] - DATE" headings,
# each followed by a "Commit: <sha>" line.
releases=$(awk '/^## \[[0-9]+\.[0-9]+\.[0-9]+\]/ { v = $2; gsub(/[\[\]]/, "", v); print v }' CHANGELOG.md)
current=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
version=${1:-$(printf '%s\n' "$releases" | grep -vx "$current" | head -1)}
if [[ -z $version ]]; then
    echo "previous-release: CHANGELOG.md names no release before $current" >&2
    exit 1
fi
commit=$(awk -v v="[$version]" '
    $1 == "##" && $2 == v { inside = 1; next }
    $1 == "##" { inside = 0 }
    inside && /^Commit: / { sub(/^Commit: `?/, ""); sub(/`.*/, ""); print; exit }
' CHANGELOG.md)
if [[ -z $commit ]]; then
    echo "previous-release: CHANGELOG.md gives no 'Commit:' line for [$version]" >&2
    exit 1
fi

out=target/previous-release/$version
bin=$out/order-timeout
if [[ -x $bin && -f $out/commit && $(cat "$out/commit") == "$commit" ]]; then
    echo "$PWD/$bin"
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
CARGO_TARGET_DIR=$PWD/target/previous-release/target \
    cargo build --locked --manifest-path "$manifest" -p "$package" --bin order-timeout >&2
cp "target/previous-release/target/debug/order-timeout" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$commit" >"$out/commit"
"$bin" --version >&2
echo "$PWD/$bin"
