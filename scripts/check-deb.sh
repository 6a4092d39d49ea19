#!/usr/bin/env bash
# Checks the Debian package `make deb` built: its control fields, its files, and that the
# module loads into valkey-server from the extracted package (with the shipped config
# snippet, pointed at the extracted path). Run by `make test` after `make deb`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
deb="target/debian/libmember_${version}-1_${arch}.deb"
[ -f "$deb" ] || deb=$(ls target/debian/libmember_"${version}"*_"${arch}".deb 2>/dev/null | head -n1 || true)
[ -n "$deb" ] && [ -f "$deb" ] || { echo "check-deb: no package for $version ($arch) in target/debian: run make deb" >&2; exit 1; }

fail() { echo "check-deb: $deb: $*" >&2; exit 1; }
[ "$(dpkg-deb -f "$deb" Package)" = "libmember" ] || fail "package name"
depends=$(dpkg-deb -f "$deb" Depends)
case "$depends" in *libc6*) ;; *) fail "Depends lacks libc6: $depends" ;; esac
for f in ./usr/lib/valkey/modules/libmember.so ./etc/valkey/libmember.conf \
         ./usr/share/doc/libmember/README.md ./usr/share/doc/libmember/configuration.md; do
  dpkg-deb -c "$deb" | awk '{print $6}' | grep -qx "$f" || fail "missing $f"
done

tmp=$(mktemp -d)
port=""
cleanup() {
  [ -n "$port" ] && valkey-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
dpkg-deb -x "$deb" "$tmp/root"
# Every library the module needs is present on this system (what Depends promises).
if ldd "$tmp/root/usr/lib/valkey/modules/libmember.so" | grep -q "not found"; then
  fail "unresolved libraries: $(ldd "$tmp/root/usr/lib/valkey/modules/libmember.so" | grep 'not found')"
fi
# The shipped snippet, with the module path moved to the extracted copy.
sed "s#/usr/lib/valkey/modules/#$tmp/root/usr/lib/valkey/modules/#" \
  "$tmp/root/etc/valkey/libmember.conf" > "$tmp/libmember.conf"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
valkey-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save "" --daemonize yes \
  --logfile "$tmp/valkey.log" --include "$tmp/libmember.conf"
for _ in $(seq 100); do [ "$(valkey-cli -p "$port" ping 2>/dev/null)" = "PONG" ] && break; sleep 0.1; done
modules=$(valkey-cli -p "$port" MODULE LIST 2>&1 || true)
echo "$modules" | grep -qx "member" || { tail -n 20 "$tmp/valkey.log" >&2; fail "the module did not load: $modules"; }
reply=$(valkey-cli -p "$port" MEMBER.INFO nosuchset 2>&1 || true)
case "$reply" in *"no such set"*|*UNAVAILABLE*) ;; *) fail "MEMBER.INFO answered: $reply" ;; esac
echo "check-deb: $deb installs the module and its config, and the module loads from it"
