#!/usr/bin/env bash
# Makes target/pyenv, the virtualenv the Python client's tests run in (tests/all/python_client.rs):
# Debian's python3 with redis-py >= 5, pytest and clients/python installed in editable mode.
# Does nothing when it is there and complete; `rm -rf target/pyenv` makes it again.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
env="$root/target/pyenv"
# The last step below writes this file, so an interrupted run is redone.
done_mark="$env/.complete"
[ -f "$done_mark" ] && exit 0

rm -rf "$env"
/usr/bin/python3 -m venv "$env"
"$env/bin/pip" install --quiet --disable-pip-version-check 'redis>=5' pytest 'setuptools>=64' wheel
"$env/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
  --editable "$root/clients/python"
touch "$done_mark"
