#!/usr/bin/env bash
# Installs the Node dependencies, each folder's pinned by its package-lock.json, with `npm ci`:
# clients/node (the libmember package's test clients, side by side under npm aliases: ioredis
# 5 and 6, iovalkey, node-redis 5 and 6, GLIDE; and TypeScript for its types) and
# examples/node (ioredis 5.9, and the package linked from clients/node), for
# tests/all/node_client.rs, tests/all/client_snippets.rs and a user trying the example. Does
# nothing for a folder whose dependencies are there from this same lock file;
# `rm -rf <folder>/node_modules` installs them again.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$root/target"
# Tests run in parallel threads: one run at a time, the others then find it done.
exec 9>"$root/target/.node-env.lock"
flock 9
for dir in "$root/clients/node" "$root/examples/node"; do
  # Written last, holding the lock file's checksum: an interrupted run (or a changed lock) is redone.
  mark="$dir/node_modules/.libmember-installed"
  sum="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
  [ -f "$mark" ] && [ "$(cat "$mark")" = "$sum" ] && continue
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  printf '%s' "$sum" > "$mark"
done
