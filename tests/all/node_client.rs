//! The Node package (`clients/node`, npm `libmember`) against real servers, on every client
//! library it supports (ioredis 5 and 6, iovalkey, node-redis 5 and 6, GLIDE): `node --test`
//! on its tests with a standalone server, one whose PostgreSQL this test stops, and a cluster
//! of the package's own, on which every node's `INFO errorstats` must count no MOVED; and
//! `npm pack` builds the package.
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::support;

use support::cluster::{cli_binary, Cluster};
use support::member::*;
use support::node;
use support::OwnPg;

/// Every client library the tests run on, as `clients/node/test/support.js` names them.
const LIBRARIES: [&str; 6] = [
    "ioredis5", "ioredis6", "iovalkey", "redis5", "redis6", "glide",
];

/// A run's limit: each file takes seconds; a hung one fails the test.
const LIMIT: Duration = Duration::from_secs(300);

fn node_test(files: &[&str], env: &[(&str, String)]) -> String {
    node::node_test("clients/node", files, env, LIMIT)
}

/// One test at a time on [`cluster`]: the MOVED each counts are its own, and no slot moves
/// while another counts.
static TURN: Mutex<()> = Mutex::new(());

/// The cluster these tests count MOVED on: 3 primaries and 3 replicas of their own, so that
/// no other area's redirections (some send by the wrong argument on purpose) are counted.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start(&[]))
}

/// The pure parts: the slot function, the option names, the reply and error mappings; and
/// the types (`index.d.ts`) against every library's own, under `tsc --strict`.
#[test]
fn unit() {
    node_test(&["test/unit.test.js", "test/types.test.js"], &[]);
}

/// Every method and the typed errors over each library's standalone client.
fn standalone(lib: &str) {
    let env = Env::new();
    node_test(
        &["test/standalone.test.js"],
        &[("MEMBER_URL", env.vk.url()), ("MEMBER_CLIENTS", lib.into())],
    );
}

#[test]
fn standalone_ioredis5() {
    standalone("ioredis5");
}

#[test]
fn standalone_ioredis6() {
    standalone("ioredis6");
}

#[test]
fn standalone_iovalkey() {
    standalone("iovalkey");
}

#[test]
fn standalone_redis5() {
    standalone("redis5");
}

#[test]
fn standalone_redis6() {
    standalone("redis6");
}

#[test]
fn standalone_glide() {
    standalone("glide");
}

/// `Unavailable` once PostgreSQL is stopped, on every library: the set is made while it runs,
/// then each library asks again with the database gone.
#[test]
fn unavailable_with_postgres_stopped() {
    let mut pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &[]);
    let url = vk.url();
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "down"]);
    // Added but never looked up: the filter lets them through and no cache entry holds them,
    // so a lookup needs the database.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "down", "alice"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "down", "bob"]), 1);
    ok(&mut c, &["CONFIG", "SET", "member.db-timeout-ms", "500"]);
    pg.stop();
    node_test(
        &["test/unavailable.test.js"],
        &[("MEMBER_URL", url), ("MEMBER_CLIENTS", LIBRARIES.join(","))],
    );
}

/// Every method over each library's cluster client, started from a replica, and 1 000 EXISTS,
/// 1 000 ADD and 100 concurrent EXISTS with no MOVED on any node. One library at a time, so
/// the MOVED counted are its own.
/// Then 20 slots move to another primary under the client's feet, and every call on their items
/// still answers right, the library following the server's MOVED itself.
fn on_cluster(lib: &str) {
    let cl = cluster();
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let replica = cl.replicas().next().expect("a replica");
    let nodes: Vec<String> = cl.nodes.iter().map(|n| n.addr()).collect();
    let out = node_test(
        &["test/cluster.test.js", "test/moved.test.js"],
        &[
            ("MEMBER_CLUSTER", replica.addr()),
            ("MEMBER_CLUSTER_NODES", nodes.join(",")),
            ("MEMBER_CLIENTS", lib.into()),
            ("MEMBER_CLI", cli_binary()),
        ],
    );
    for line in out
        .lines()
        .filter(|l| l.contains("MOVED per 1000") || l.contains("slots moved:"))
    {
        println!("{}", line.trim_start_matches(['#', ' ']));
    }
}

#[test]
fn cluster_ioredis5() {
    on_cluster("ioredis5");
}

#[test]
fn cluster_ioredis6() {
    on_cluster("ioredis6");
}

#[test]
fn cluster_iovalkey() {
    on_cluster("iovalkey");
}

#[test]
fn cluster_redis5() {
    on_cluster("redis5");
}

#[test]
fn cluster_redis6() {
    on_cluster("redis6");
}

#[test]
fn cluster_glide() {
    on_cluster("glide");
}

/// The package's routing table is the server's: each command's routing argument is the first
/// key of its `COMMAND INFO`, and the package's slot function answers as `CLUSTER KEYSLOT`.
#[test]
fn routing_matches_the_server() {
    let cl = cluster();
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let nodes: Vec<String> = cl.nodes.iter().map(|n| n.addr()).collect();
    node_test(
        &["test/routing.test.js"],
        &[("MEMBER_CLUSTER_NODES", nodes.join(","))],
    );
}

/// `npm pack` builds the package offline, with its code, types and README and nothing else,
/// and the packed package loads.
#[test]
fn npm_pack_builds_the_package() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dest = Dir(std::env::temp_dir().join(format!("member-npm-pack-{}", std::process::id())));
    std::fs::create_dir_all(dest.path()).expect("a temporary directory");
    let out = Command::new("npm")
        .args(["pack", "--offline", "--silent", "--pack-destination"])
        .arg(dest.path())
        .current_dir(root.join("clients/node"))
        .output()
        .expect("run npm pack");
    assert!(
        out.status.success(),
        "npm pack failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tarball = dest
        .path()
        .join(String::from_utf8_lossy(&out.stdout).trim());
    let list = Command::new("tar")
        .arg("tzf")
        .arg(&tarball)
        .output()
        .expect("run tar");
    let mut files: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    files.sort();
    let expected = [
        "package/README.md",
        "package/index.d.ts",
        "package/index.js",
        "package/lib/commands.js",
        "package/lib/errors.js",
        "package/lib/sets.js",
        "package/lib/slot.js",
        "package/lib/transport.js",
        "package/package.json",
    ];
    assert_eq!(files, expected, "the packed files");
    let unpacked = dest.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let untar = Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .expect("run tar");
    assert!(untar.success());
    let load = Command::new("node")
        .arg("-e")
        .arg(
            "const m = require(process.argv[1]); \
             if (typeof m.Sets !== 'function' || m.keyslot('foo') !== 12182) process.exit(1);",
        )
        .arg(unpacked.join("package"))
        .status()
        .expect("run node");
    assert!(load.success(), "the packed package does not load");
}

/// A directory removed when dropped.
struct Dir(std::path::PathBuf);

impl Dir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
