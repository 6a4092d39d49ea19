# libmember: build, run locally, test, lint.
# Every cargo recipe starts with $(CARGO_ENV) so rustup's cargo is found even when
# ~/.cargo/bin is not on PATH (CI, fresh shells).
CARGO_ENV = command -v cargo >/dev/null 2>&1 || . "$$HOME/.cargo/env";

.PHONY: deps build run stop test lint bench chaos

deps:
	bash scripts/install-deps.sh

build: deps
	$(CARGO_ENV) cargo build --release

run: build
	bash scripts/run-local.sh

stop:
	bash scripts/run-local.sh stop

# Tests start their own PostgreSQL and valkey-server; they load target/debug/libmember.so.
# The integration tests then run once more against Redis 7.0, the second supported server.
test: deps
	$(CARGO_ENV) cargo build
	$(CARGO_ENV) cargo test --all-targets -- --test-threads=4
	$(CARGO_ENV) MEMBER_SERVER=redis-server cargo test --tests -- --test-threads=4

lint:
	$(CARGO_ENV) cargo fmt --check
	$(CARGO_ENV) cargo clippy --all-targets -- -D warnings

# Benchmark against its own PostgreSQL and valkey-server. Prints one table and writes
# bench/results.md and bench/latency.svg. `make bench ARGS=--ten-million` loads 10 M members.
# `cargo bench` does not build the cdylib (nothing links it), so build it first: the bench loads
# target/release/deps/libmember.so (MEMBER_MODULE overrides).
bench: deps
	$(CARGO_ENV) cargo build --release
	$(CARGO_ENV) cargo bench --bench member -- $(ARGS)

# The long chaos run of issue 9 (tests/chaos.rs): faults against a live workload, then the
# history checker. MEMBER_CHAOS_SECS sets its length (default 300), MEMBER_CHAOS_SEED repeats a run.
chaos: deps
	$(CARGO_ENV) cargo build
	$(CARGO_ENV) cargo test --test chaos -- --ignored --nocapture chaos_long
