#!/usr/bin/env bash
# The build `make test` needs, with the two cores kept busy: the release module (the one the
# integration tests load and the package ships; its last step, one codegen unit with LTO, runs
# on one core) builds in the background while the Python and Node environments are made and
# the debug build (the test binaries, and the debug module that the failpoint tests load)
# compiles beside it. Fails if any part failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release &
release=$!
status=0
bash scripts/python-env.sh || status=$?
bash scripts/node-env.sh || status=$?
{ cargo build && cargo test --all-targets --no-run; } || status=$?
wait "$release" || status=$?
exit "$status"
