//! Test harness shared by the integration tests (`tests/all/main.rs` declares it; the bench includes it too).
//!
//! * [`Pg`] / [`fresh_db`]: one throwaway PostgreSQL cluster per test process, started lazily;
//!   every test gets its own database in it.
//! * [`OwnPg`]: a dedicated cluster for a fault test that stops and restarts PostgreSQL.
//! * [`Valkey`]: one valkey-server per test, with `libmember.so` loaded.
//! * [`cluster::Cluster`]: one cluster (3 primaries, 3 replicas) per test process.
//!
//! We run as root; PostgreSQL runs as the `postgres` user. All children are spawned from one
//! long-lived "spawner" thread with `PR_SET_PDEATHSIG`, because the parent-death signal fires
//! when the *thread* that forked exits (libtest runs each test on its own thread), not only when
//! the process does. Children therefore die with the test process and never before it.
//!
//! Files: `process.rs` (waiting, ports, temp dirs, the spawner), `pg_cluster.rs` (one PostgreSQL
//! cluster process), `pg.rs` (the shared cluster, test roles, `TestDb`), `own_pg.rs` (`OwnPg`),
//! `valkey.rs` (`Valkey`, starting it), `valkey_lifecycle.rs` (kill, shutdown, restart),
//! `member.rs` (`Env` and libmember client helpers), `pgbouncer.rs` (pgbouncer in front of the
//! shared cluster, one per pooling mode), `lifecycle.rs` (the filter-lifecycle
//! tests' servers and assertions), `faults.rs` (the fault-injection tests' calls and
//! probes), `cluster.rs` / `cluster_ops.rs` (a Valkey Cluster), `proxy.rs` (a TCP proxy that
//! injects link faults), `sentinel.rs` (Debian's `valkey-sentinel` watching a primary), `tls.rs` (PostgreSQL over TLS), `python.rs` (the virtualenv, pytest,
//! Python programs), `node.rs` (the Node dependencies, the example's scripts, `node --test`).

mod own_pg;
mod pg;
mod pg_cluster;
mod process;
mod valkey;
mod valkey_lifecycle;

pub mod cluster;
pub mod cluster_asm;
pub mod cluster_ops;
pub mod failover;
pub mod faults;
pub mod lifecycle;
pub mod member;
pub mod node;
pub mod pgbouncer;
pub mod proxy;
pub mod python;
pub mod rotation;
pub mod sentinel;
pub mod source;
pub mod standby;
pub mod tls;

// The harness's public names, reachable as `support::X`. Each test file uses some of them.
#[allow(unused_imports)]
pub use own_pg::{ColdCopy, OwnPg};
#[allow(unused_imports)]
pub use pg::{fresh_db, fresh_db_owned_by_module_role, Pg, TestDb, APP_ROLE, MODULE_ROLE};
#[allow(unused_imports)]
pub use pg_cluster::{pg_bin, Setup};
#[allow(unused_imports)]
pub use process::{free_port, wait_until};
#[allow(unused_imports)]
pub use valkey::{
    debug_module_path, module_path, server_binary, server_version, start_with, ServerVersion,
    Valkey,
};
