//! Ordinary cluster clients, without per-command options (docs/cluster.md, "Routing"): the
//! catalog commands and REBUILD are routed by the set name, so redis-py's `RedisCluster` (which
//! routes by COMMAND's key positions and refuses a command without one) and `valkey-cli -c`
//! send CREATE, ALTER, DROP and REBUILD like any keyed command, and a node that does not serve
//! the name's slot answers MOVED, replicas included, before the module runs.
use crate::support;

use std::process::Command;
use std::time::Duration;

use support::cluster::{cli_follow, Cluster};
use support::member::*;
use support::wait_until;

/// Debian's interpreter, which has Debian's `python3-redis` (scripts/install-deps.sh).
const PYTHON: &str = "/usr/bin/python3";

/// Runs `script` with redis-py's `RedisCluster` bound to `rc` (started from `port`); returns
/// its standard output, or panics with what it printed.
fn redis_py(port: u16, script: &str) -> String {
    let prelude = format!(
        "import redis\nfrom redis.cluster import RedisCluster\n\
         rc = RedisCluster(host='127.0.0.1', port={port}, decode_responses=True)\n"
    );
    let out = Command::new(PYTHON)
        .arg("-c")
        .arg(prelude + script)
        .output()
        .expect("run python3 (scripts/install-deps.sh installs python3-redis)");
    assert!(
        out.status.success(),
        "redis-py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn redis_py_runs_the_catalog_rebuild_info_and_item_commands_without_target_nodes() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    // Started from a replica: the client learns the topology and routes by key position.
    let start = cl.replicas().next().unwrap().port();
    let out = redis_py(
        start,
        r#"
s = 'pyset'
print(rc.execute_command('MEMBER.CREATE', s, 'NORMALIZE', 'none'))
print([rc.execute_command('MEMBER.ADD', s, f'py-{i}') for i in range(12)])
print(rc.execute_command('MEMBER.ALTER', s, 'CACHE-TTL', '60'))
print(rc.execute_command('MEMBER.REBUILD', s, 'SYNC'))
print(rc.execute_command('MEMBER.REBUILD', s))
i = rc.execute_command('MEMBER.INFO', s)
i = dict(zip(i[::2], i[1::2]))
print(i['filter_items'], i['cluster_nodes_answered'], len(i['nodes']))
print([rc.execute_command('MEMBER.EXISTS', s, f'py-{i}') for i in range(12)])
print(rc.execute_command('MEMBER.EXISTS', s, 'py-absent'))
print(rc.execute_command('MEMBER.DROP', s))
"#,
    );
    let ones = format!("[{}]", ["1"; 12].join(", "));
    assert_eq!(
        out,
        format!("OK\n{ones}\nOK\n12\nOK\n12 6 6\n{ones}\n0\nOK"),
        "redis-py's answers"
    );
    // The DROP reached every node: none knows the set any more.
    for n in &cl.nodes {
        let mut c = n.conn();
        assert!(
            wait_until(Duration::from_secs(20), || set_info(
                &mut c,
                "pyset",
                "filter_present"
            )
            .is_err_and(|e| e.0.contains("no such set"))),
            "{} still knows the dropped set",
            n.addr()
        );
    }
}

#[test]
fn a_catalog_command_off_its_slot_is_moved_to_the_owner() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "moved_catalog";
    let owner = cl.set_owner(set);
    let other = cl.primaries().find(|n| n.port() != owner.port()).unwrap();
    let replica = cl.replicas().next().unwrap();
    for n in [other, replica] {
        let mut c = n.conn();
        for args in [
            vec!["MEMBER.CREATE", set],
            vec!["MEMBER.ALTER", set, "CACHE-TTL", "5"],
            vec!["MEMBER.DROP", set],
            vec!["MEMBER.REBUILD", set, "SYNC"],
            vec!["MEMBER.INFO", set],
        ] {
            let e = err(&mut c, &args);
            assert!(
                e.starts_with(&format!("MOVED {} ", cl.keyslot(set)))
                    && e.ends_with(&format!(":{}", owner.port())),
                "{} on {}: {e}",
                args[0],
                n.addr()
            );
        }
        // Refused before the module ran: the set does not exist anywhere.
        assert_eq!(
            err(&mut owner.conn(), &["MEMBER.INFO", set]),
            "ERR no such set: create it with MEMBER.CREATE"
        );
    }
    // valkey-cli -c follows the redirect from any node.
    assert_eq!(cli_follow(replica.port(), &["MEMBER.CREATE", set]), "OK");
    assert_eq!(cli_follow(other.port(), &["MEMBER.DROP", set]), "OK");
}
