# libmember: build, run locally, test, lint.
# Every cargo recipe starts with $(CARGO_ENV) so rustup's cargo is found even when
# ~/.cargo/bin is not on PATH (CI, fresh shells).
CARGO_ENV = command -v cargo >/dev/null 2>&1 || . "$$HOME/.cargo/env";

.PHONY: deps build run demo stop cluster cluster-stop deb test lint bench chaos fuzz

deps:
	bash scripts/install-deps.sh

build: deps
	$(CARGO_ENV) cargo build --release

# PG=16|17|18 runs the local database on that major (pinned binaries, scripts/postgres.sh).
run: build
	PG=$(PG) bash scripts/run-local.sh

# The sign-up example (examples/signup) on 127.0.0.1:8080 beside `make run`'s servers.
demo: run
	bash scripts/python-env.sh
	bash scripts/demo.sh

stop:
	bash scripts/demo.sh stop
	bash scripts/run-local.sh stop

# The Debian package: target/debian/libmember_<version>-1_<arch>.deb (cargo-deb, installed
# from crates.io when missing), then a check that it installs the module and its config and
# that the module loads from the extracted package (scripts/check-deb.sh).
deb: build
	$(CARGO_ENV) command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --locked
	$(CARGO_ENV) cargo deb --no-build --strip
	bash scripts/check-deb.sh

# A local 3-primary, 3-replica cluster on 127.0.0.1:7001-7006 with its own database
# (docs/cluster.md); returns once every node serves MEMBER.*.
cluster: build
	bash scripts/cluster-local.sh

cluster-stop:
	bash scripts/cluster-local.sh stop

# The areas of tests/all whose outcome depends on the server under test, run a second time
# against Redis 7.0 (docs/testing.md, "Against Redis 7.0", says why each is here and why the
# others are not): commands and their replies, MULTI and Lua, ACL, replication, RDB and AOF,
# DUMP/RESTORE, keys moved or overwritten by the server's own commands, SLOWLOG and MONITOR,
# LATENCY, the lazy-free thread, configs and module loading, cluster redirection and the
# cluster bus. Each name is a test-name filter: `<area>::`. Before the pass, every area must
# select at least one test of its own (a filter that matches nothing would pass with 0 tests).
REDIS_AREAS = commands bad_input batch funnel hostile acl \
	catalog lifecycle lifecycle_rebuild replica foreign_filter foreign_writes moved_keys \
	tokenize latency big_filters config_values module_load startup \
	cluster cluster_attach cluster_batch cluster_clients cluster_forward cluster_info cluster_rebuild cluster_slots keyslot command_docs

# The areas run a third time against Valkey 9.1 (docs/testing.md, "Against Valkey 9.1"): the
# funnel and the lifecycle (the server's keyspace, RDB and AOF as the module uses them), and
# the cluster areas where slots move (the classic path, and atomic slot migration), whose
# outcome depends on how the server hands a slot over. The server is the pinned binary
# scripts/valkey9.sh unpacks (`make deps`).
VALKEY9_AREAS = funnel lifecycle replica cluster cluster_slots cluster_reshard asm
VALKEY9_SERVER = $(CURDIR)/target/servers/valkey-9.1.2/valkey-server

# The tests run once more on each PostgreSQL major beyond Debian's 15 (docs/testing.md, "Against
# PostgreSQL 16, 17 and 18"): those whose outcome depends on the database's behaviour, a few of
# each area (funnel, lifecycle, sync and the change log, notify, catalog, late commits, timeouts,
# failover and restore, pooler, standby rebuild, TLS, tokenize with pgcrypto, attach, the online
# key rotation), and
# pg_versions, which checks what differs between majors. Each name is a test-name filter; each
# must select at least one test. The servers are the pinned binaries scripts/postgres.sh
# unpacks (`make deps`), and pg_basebackup its pinned client tools of 18.
PG_MAJORS = 16 17 18
PG_TESTS = funnel::batched_database_work funnel::concurrent_adds funnel::create_loads_rows \
	funnel::memberships_expire lifecycle::restart_from_rdb_and_kill9 \
	sync:: change_log:: notify::an_outside_insert_is_answered notify::the_listener_reconnects \
	catalog::another_node_learns_a_create catalog::drop_refusals \
	timeouts::slow_postgres_times_out_and_late_add timeouts_config:: faults::postgres_down \
	failover::a_failover_to_a_standby_that_was_behind failover::a_rebuild_source_on_another_history \
	failover_pooler:: restore::a_database_restored_from_a_cold_copy \
	pooler::session_every_command pooler::transaction_every_command pooler::dropped_startup_options \
	pooler::session_stuck_lookup pooler::transaction_stuck_lookup \
	standby::a_rebuild_from_a_lagging_standby pg_tls::require_encrypts pg_tls::verify_full_with_the_right \
	tokenize::tokens_everywhere attach::signup_flow_with_the_change_log \
	attach::signup_flow_with_an_updated_column attach_boundary::triggers_left pg_versions:: \
	key_rotation::a_set_rotated_online key_rotation_held:: key_rotation_faults::a_rotation_resumes_after_postgres \
	key_rotation_in_place::the_rewrite_merges
# $(call check_areas,VAR,Name): every area of $(VAR) must select at least one test of its own
# (a filter that matches nothing would pass with 0 tests); writes the names of the tests of
# the areas to target/VAR.names, which the pass runs by exact name (an area `a` is the module
# `a::`: libtest's filter matches anywhere in a name, so `cluster::` alone would also run
# `key_rotation_cluster::`); prints how many the pass runs.
define check_areas
	$(CARGO_ENV) cargo test --test all -- --list $(addsuffix ::,$($(1))) >target/$(1).list
	@for a in $($(1)); do \
		n=$$(grep -c "^$$a::.*: test$$" target/$(1).list); \
		[ "$$n" -gt 0 ] || { echo "$(1): $$a:: selects no test"; exit 1; }; \
	done; \
	areas=$$(echo $($(1)) | tr ' ' '|'); \
	sed -n "s/: test$$//p" target/$(1).list | grep -E "^($$areas)::" >target/$(1).names; \
	echo "$(2) pass: $$(wc -l <target/$(1).names) tests in $(words $($(1))) areas"
endef

# $(call check_filters,VAR,Name): the same for test-name filters that name their area.
define check_filters
	$(CARGO_ENV) cargo test --test all -- --list $($(1)) >target/$(1).list
	@for f in $($(1)); do \
		n=$$(grep -c "^$$f.*: test$$" target/$(1).list); \
		[ "$$n" -gt 0 ] || { echo "$(1): $$f selects no test"; exit 1; }; \
	done; \
	echo "$(2) passes: $$(grep -c ': test$$' target/$(1).list) tests of $(words $($(1))) filters"
endef
# First every relative link of the documentation must resolve (scripts/check-links.py), and
# imports in src/ must flow one way (scripts/check-layers.py, docs/architecture.md).
# scripts/test-build.sh then builds the release module in the background while the Python
# (target/pyenv, for tests/all/python_client.rs and the browser test tests/all/signup_browser.rs)
# and Node (clients/node and examples/node, for tests/all/node_client.rs and client_snippets.rs)
# environments are made and the debug build compiles beside it. Tests start their own PostgreSQL and valkey-server and load the
# release module, the one the package ships (MEMBER_MODULE; the failpoint tests load the debug
# one). The REDIS_AREAS then run once more against Redis 7.0, the second supported server, and
# the VALKEY9_AREAS against Valkey 9.1.
# Last, the Debian package is made from that same build and loaded from its extracted files.
RELEASE_MODULE = $(CURDIR)/target/release/libmember.so

test: deps
	python3 scripts/check-links.py
	python3 scripts/check-layers.py
	$(CARGO_ENV) bash scripts/test-build.sh
	$(CARGO_ENV) MEMBER_MODULE=$(RELEASE_MODULE) cargo test --all-targets -- --test-threads=4
	$(call check_areas,REDIS_AREAS,Redis)
	$(CARGO_ENV) MEMBER_MODULE=$(RELEASE_MODULE) MEMBER_SERVER=redis-server \
		cargo test --test all -- --test-threads=4 --exact $$(cat target/REDIS_AREAS.names)
	$(call check_areas,VALKEY9_AREAS,Valkey 9)
	$(CARGO_ENV) MEMBER_MODULE=$(RELEASE_MODULE) MEMBER_SERVER=$(VALKEY9_SERVER) \
		cargo test --test all -- --test-threads=4 --exact $$(cat target/VALKEY9_AREAS.names)
	$(call check_filters,PG_TESTS,PostgreSQL)
	@set -e; for m in $(PG_MAJORS); do \
		echo "PostgreSQL $$m pass"; \
		$(CARGO_ENV) MEMBER_MODULE=$(RELEASE_MODULE) \
			MEMBER_PG_BIN="$$(bash scripts/postgres.sh $$m):$$(bash scripts/postgres.sh client)" \
			cargo test --test all -- --test-threads=4 $(PG_TESTS); \
	done
	$(MAKE) deb

lint:
	$(CARGO_ENV) cargo fmt --check
	$(CARGO_ENV) cargo clippy --all-targets -- -D warnings

# Benchmark against its own PostgreSQL and valkey-server. Prints one table and writes
# bench/results.md and bench/latency.svg. `make bench ARGS=--ten-million` loads 10 M members;
# `ARGS=--hundred-million` runs only the filter-level rows at 100 M members (no servers).
# PG=16|17|18 runs its PostgreSQL on that major (pinned binaries, scripts/postgres.sh), for
# example `make bench ARGS="--only cold" PG=18` beside the same on 15.
# `cargo bench` does not build the cdylib (nothing links it), so build it first: the bench loads
# target/release/deps/libmember.so (MEMBER_MODULE overrides).
bench: deps
	$(CARGO_ENV) cargo build --release
	bash scripts/redisbloom.sh >/dev/null
	$(CARGO_ENV) $(if $(filter-out 15,$(PG)),MEMBER_PG_BIN="$$(bash scripts/postgres.sh $(PG)):$$(bash scripts/postgres.sh client)") \
		cargo bench --bench member -- $(ARGS)

# The long chaos run (tests/all/chaos.rs, docs/testing.md): faults against a live workload, then the
# history checker. MEMBER_CHAOS_SECS sets its length (default 300), MEMBER_CHAOS_SEED repeats a run,
# MEMBER_CHAOS_FAULTS=demote,failover injects only the faults named.
chaos: deps
	$(CARGO_ENV) cargo build
	$(CARGO_ENV) cargo test --test all -- --ignored --nocapture chaos::chaos_long

# Fuzzing (docs/testing.md): every target of fuzz/ for FUZZ_SECS seconds (default
# 60), one after the other; FUZZ_TARGETS picks some. Needs no server. Installs the nightly
# toolchain and cargo-fuzz when missing. Corpora grow in fuzz/corpus/, crashes land in
# fuzz/artifacts/ (both ignored by git): a crash stops the run with the input's path.
FUZZ_SECS ?= 60
FUZZ_TARGETS ?= filter_payload cluster_wire command_args canonicalize cluster_nodes conninfo
fuzz:
	$(CARGO_ENV) rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
	$(CARGO_ENV) command -v cargo-fuzz >/dev/null 2>&1 || cargo +nightly install cargo-fuzz --locked
	$(CARGO_ENV) cd fuzz && for t in $(FUZZ_TARGETS); do \
		echo "== fuzz $$t for $(FUZZ_SECS) s"; \
		cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECS) -print_final_stats=1 || exit 1; \
	done
