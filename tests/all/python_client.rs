//! The Python client (`clients/python`): its pytest suite run against the servers started here,
//! a standalone server, one whose PostgreSQL this test stops, the shared cluster, and a cluster
//! of its own on which the MOVED replies are counted.
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

/// Every method over `redis.Redis` and `redis.asyncio.Redis`, valkey-py's `Valkey` and GLIDE's
/// `GlideClient` (sync and async), the typed INFO values, and the NoSuchSet and NoPermission
/// errors.
#[test]
fn standalone_methods_and_errors() {
    let env = Env::new();
    pytest(
        &[
            "test_sets.py",
            "test_errors.py",
            "test_asyncio.py",
            "test_glide.py",
        ],
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

/// Every call one hop: GLIDE's cluster clients (sync and async), redis-py's `RedisCluster` and
/// valkey-py's `ValkeyCluster` through `libmember`, 0 MOVED per 1 000 EXISTS and ADD counted
/// from `INFO errorstats` on every node. On a cluster of its own: the shared one serves tests
/// that take MOVED on purpose (the `redis` crate's snippets), which this count would see.
/// `-- --nocapture` prints the figures.
#[test]
fn cluster_clients_route_every_call_in_one_hop() {
    let cl = Cluster::start(&[]);
    let replica = cl.replicas().next().expect("a replica");
    let ports: Vec<String> = cl
        .primaries()
        .chain(cl.replicas())
        .map(|n| n.port().to_string())
        .collect();
    pytest(
        &["test_routing.py"],
        &[
            ("MEMBER_CLUSTER_PORT", replica.port().to_string()),
            ("MEMBER_CLUSTER_PORTS", ports.join(",")),
        ],
    );
}
