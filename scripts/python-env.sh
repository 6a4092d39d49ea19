#!/usr/bin/env bash
# Makes target/pyenv, the virtualenv the Python tests run in (tests/all/python_client.rs and
# tests/all/signup_browser.rs) and the sign-up example runs in (`make demo`): Debian's python3
# with redis-py >= 5, valkey-py and valkey-glide (async and sync; the Python client's tests run
# over each, pinned to the releases they were measured with: docs/clients.md), pytest, psycopg 3
# and selenium, and clients/python installed in editable mode. Does nothing when it is there
# with these same packages; a changed list below installs what it adds into the existing
# virtualenv; `rm -rf target/pyenv` makes it again, and so does a virtualenv made for another
# checkout (copied with its target/: its scripts and its editable install name that one).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
env="$root/target/pyenv"
packages=('redis>=5' 'valkey==6.2.0' 'valkey-glide==2.6.0' 'valkey-glide-sync==2.6.0' pytest 'setuptools>=64' wheel 'psycopg[binary]>=3.1' 'selenium>=4.11')
# The last step below writes the package list into this file, so an interrupted run (or a
# list that changed since) is redone.
done_mark="$env/.complete"
mkdir -p "$root/target"
# Tests run in parallel threads: one run at a time, the others then find it done.
exec 9>"$root/target/.pyenv.lock"
flock 9
# The virtualenv records the path it was made at (pyvenv.cfg's `command`, Python 3.11 and
# later): another path means a copy whose pip and libmember are the original's.
cfg="$env/pyvenv.cfg"
if grep -q '^command = ' "$cfg" 2>/dev/null \
  && ! grep -qxF "command = /usr/bin/python3 -m venv $env" "$cfg"; then
  rm -rf "$env"
fi
[ -f "$done_mark" ] && [ "$(cat "$done_mark")" = "${packages[*]}" ] && exit 0

[ -x "$env/bin/pip" ] || { rm -rf "$env"; /usr/bin/python3 -m venv "$env"; }
"$env/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
"$env/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
  --editable "$root/clients/python"
printf '%s' "${packages[*]}" > "$done_mark"
