#!/usr/bin/env bash
# Installs the Node example's dependencies (examples/node: ioredis, pinned by its
# package-lock.json) into examples/node/node_modules with `npm ci`, for
# tests/all/client_snippets.rs and for a user trying the example. Does nothing when they are
# there from this same lock file; `rm -rf examples/node/node_modules` installs them again.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/examples/node"
# Written last, holding the lock file's checksum: an interrupted run (or a changed lock) is redone.
mark="$dir/node_modules/.libmember-installed"
mkdir -p "$root/target"
# Tests run in parallel threads: one run at a time, the others then find it done.
exec 9>"$root/target/.node-env.lock"
flock 9
sum="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
[ -f "$mark" ] && [ "$(cat "$mark")" = "$sum" ] && exit 0

(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
printf '%s' "$sum" > "$mark"
