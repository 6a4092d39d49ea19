#!/usr/bin/env bash
# The build `make test` needs, with the two cores kept busy: the release module (the one the
# integration tests load and the package ships; its last step, one codegen unit with LTO, runs
# on one core) builds in the background while the Python and Node environments are made and
# the debug build (the test binaries, and the debug module that the failpoint tests load)
# compiles beside it. The debug build is one `cargo build --all-targets`: the module then gets
# the same dependency features as the test binaries (dev-dependencies unify features only in
# a build that has a target needing them), so each dependency compiles once in debug, not
# twice (a separate `cargo build` and `cargo test --no-run` compiled 194 units where this
# compiles 174, 2m24s against 1m53s on a fresh clone of the 2-core machine), and the
# `cargo test --all-targets` that follows compiles only the example in test mode (under a
# second). Fails if any part failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release &
release=$!
status=0
bash scripts/python-env.sh || status=$?
bash scripts/node-env.sh || status=$?
cargo build --all-targets || status=$?
wait "$release" || status=$?
exit "$status"
