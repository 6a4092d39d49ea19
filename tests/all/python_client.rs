//! The Python client (`clients/python`): its pytest suite run against the servers started here,
//! a standalone server, one whose PostgreSQL this test stops, and the shared cluster.
//!
//! pytest runs from `target/pyenv` (made by `scripts/python-env.sh`, which `make test` calls
//! first; run here too, once per process, so `cargo test --test all python_client::` works on
//! its own: `support::python`). The servers' addresses reach pytest in `MEMBER_URL` and
//! `MEMBER_CLUSTER_PORT`; a test that needs one fails when it is missing, so nothing is skipped
//! in silence.
use crate::support;

use support::cluster::Cluster;
use support::member::*;
use support::python;
use support::OwnPg;

/// pytest on `selection` of `clients/python/tests` (see [`python::pytest`]).
fn pytest(selection: &[&str], env: &[(&str, String)]) {
    python::pytest("clients/python", selection, env);
}

/// Every method over `redis.Redis` and `redis.asyncio.Redis`, the typed INFO values, and
/// the NoSuchSet and NoPermission errors.
#[test]
fn standalone_methods_and_errors() {
    let env = Env::new();
    pytest(
        &["test_sets.py", "test_errors.py", "test_asyncio.py"],
        &[("MEMBER_URL", env.vk.url())],
    );
}

/// `Unavailable` once PostgreSQL is stopped: the set is made while it runs, then pytest asks
/// again with the database gone.
#[test]
fn unavailable_with_postgres_stopped() {
    let mut pg = OwnPg::start_new();
    // The set is made under the default timeout (a busy machine can take longer than 500 ms
    // for the CREATE); the calls with PostgreSQL stopped run under 500 ms.
    let vk = start_loaded(&pg.url(), &[]);
    let url = [("MEMBER_URL", vk.url())];
    pytest(&["test_unavailable.py::test_prepare_while_up"], &url);
    ok(
        &mut vk.conn(),
        &["CONFIG", "SET", "member.db-timeout-ms", "500"],
    );
    pg.stop();
    pytest(&["test_unavailable.py::test_unavailable_while_down"], &url);
}

/// `RedisCluster` and its asyncio twin against the shared cluster, started from a replica:
/// every method from any node, items across slots, INFO and REBUILD routed by the client.
#[test]
fn cluster_client() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let replica = cl.replicas().next().expect("a replica");
    pytest(
        &["test_cluster.py"],
        &[("MEMBER_CLUSTER_PORT", replica.port().to_string())],
    );
}
