//! Issue 8, first step: in a real cluster (3 primaries, 3 replicas, shared; a slot marked
//! migrating on the second one kept for slot moves), the
//! per-item commands are routed by the item, set-wide ones run anywhere, and cluster-aware
//! clients land every call on the node that owns the item's slot.
use crate::support;

use std::process::Command;
use std::time::Duration;

use redis::{Connection, Value};
use support::cluster::{cli_binary, Cluster};
use support::member::*;
use support::wait_until;

const UNKNOWN_SET: &str = "ERR no such set: create it with MEMBER.CREATE";

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Okay => "OK".into(),
        other => panic!("expected text, got {other:?}"),
    }
}

fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        other => panic!("expected an array, got {other:?}"),
    }
}

/// The value after `name` in a flat `[name, value, …]` reply.
fn field<'a>(flat: &'a [Value], name: &str) -> &'a Value {
    flat.chunks(2)
        .find(|p| text(&p[0]) == name)
        .map(|p| &p[1])
        .unwrap_or_else(|| panic!("no field {name} in {flat:?}"))
}

fn int_field(flat: &[Value], name: &str) -> i64 {
    text(field(flat, name)).parse().unwrap()
}

/// One field of MEMBER.INFO as a number.
fn set_counter(c: &mut Connection, set: &str, name: &str) -> i64 {
    set_info(c, set, name)
        .unwrap_or_else(|e| panic!("{e}"))
        .parse()
        .unwrap()
}

#[test]
fn command_info_declares_arity_and_the_item_or_the_set_as_routing_key() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let mut c = cl.nodes[0].conn();
    // Per-item commands: first/last/step 2/2/1, catalog commands 1/1/1, and one key spec
    // with these flags. The internal commands the module replicates name the item or the set
    // the same way, so a replicated effect has a slot (Valkey 9's atomic slot migration fails
    // on a replicated command without one).
    const ADD: &[&str] = &["RW", "insert", "not_key"];
    const UPDATE: &[&str] = &["RW", "update", "not_key"];
    const DEL: &[&str] = &["RW", "delete", "not_key"];
    const READ: &[&str] = &["RO", "not_key"];
    /// The routing argument's position and its key spec's flags.
    type Route = Option<(i64, &'static [&'static str])>;
    let want: [(&str, i64, Route); 19] = [
        ("member.create", -2, Some((1, ADD))),
        ("member.alter", -3, Some((1, UPDATE))),
        ("member.add", -3, Some((2, ADD))),
        ("member.exists", -3, Some((2, READ))),
        ("member.del", -3, Some((2, DEL))),
        ("member.explain", -3, Some((2, READ))),
        ("member.info", 2, Some((1, READ))),
        ("member.nodeinfo", -1, None),
        ("member.keys", 2, None),
        ("member.rebuild", -2, Some((1, UPDATE))),
        ("member._add", 4, Some((2, ADD))),
        ("member._del", 4, Some((2, DEL))),
        ("member._load", -3, None),
        ("member._set", -7, Some((1, UPDATE))),
        ("member.drop", -2, Some((1, DEL))),
        ("member._drop", 2, Some((1, DEL))),
        ("member._own", 2, None),
        ("member.mexists", -4, Some((1, READ))),
        ("member.madd", -4, Some((1, ADD))),
    ];
    for (name, arity, flags) in want {
        let (first, last, step) = match flags {
            Some((pos, _)) => (pos, pos, 1),
            None => (0, 0, 0),
        };
        let v: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut c)
            .unwrap();
        let info = array(&array(&v)[0]);
        assert_eq!(text(&info[0]), name);
        let got: Vec<i64> = [1, 3, 4, 5]
            .iter()
            .map(|&i| text(&info[i]).parse().unwrap())
            .collect();
        assert_eq!(
            got,
            [arity, first, last, step],
            "{name}: arity, first, last, step"
        );
        let specs = array(&info[8]);
        match flags {
            None => assert!(specs.is_empty(), "{name}: {specs:?}"),
            Some((pos, flags)) => {
                assert_eq!(specs.len(), 1, "{name}: {specs:?}");
                let spec = array(&specs[0]);
                let got: Vec<String> = array(field(spec, "flags")).iter().map(text).collect();
                assert_eq!(got, flags, "{name}");
                let bs = array(field(spec, "begin_search"));
                assert_eq!(text(field(bs, "type")), "index");
                assert_eq!(int_field(array(field(bs, "spec")), "index"), pos, "{name}");
                let fk = array(field(spec, "find_keys"));
                assert_eq!(text(field(fk, "type")), "range");
                let range = array(field(fk, "spec"));
                assert_eq!(int_field(range, "lastkey"), 0, "{name}");
                assert_eq!(int_field(range, "keystep"), 1, "{name}");
            }
        }
    }
    // No command of the module is left out of the table (it would say arity -1).
    let listed = module_commands(&mut c);
    let mut declared: Vec<String> = want.iter().map(|w| w.0.to_string()).collect();
    declared.sort();
    assert_eq!(listed, declared);
    // The server now checks the minimum itself, before the module runs.
    let e = err(&mut c, &["MEMBER.EXISTS", "s"]);
    assert!(e.starts_with("ERR wrong number of arguments"), "{e}");
}

/// NOT_KEY keeps the item out of COMMAND GETKEYS, exactly as it keeps it out of ACL key
/// checks: both ask the same server function (docs/cluster.md). Clients route from the
/// first/last/step of COMMAND INFO instead.
#[test]
fn command_getkeys_reports_no_key() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let mut c = cl.nodes[0].conn();
    for cmd in [
        "MEMBER.EXISTS",
        "MEMBER.ADD",
        "MEMBER.DEL",
        "MEMBER.EXPLAIN",
    ] {
        assert_eq!(
            err(&mut c, &["COMMAND", "GETKEYS", cmd, "s", "item"]),
            "ERR The command has no key arguments",
            "{cmd}"
        );
    }
}

#[test]
fn a_node_that_does_not_own_the_item_answers_moved_to_its_slot() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let mut owners_seen = std::collections::HashSet::new();
    for i in 0..24 {
        let item = format!("routed-{i}");
        let slot = cl.keyslot(&item);
        let owner = cl.owner(slot);
        owners_seen.insert(owner.port());
        for cmd in [
            "MEMBER.EXISTS",
            "MEMBER.ADD",
            "MEMBER.DEL",
            "MEMBER.EXPLAIN",
        ] {
            // The set does not exist: only the module on the owner would say so.
            let args = [cmd, "nosuchset", item.as_str()];
            for n in cl.primaries() {
                let got = err(&mut n.conn(), &args);
                if n.port() == owner.port() {
                    assert_eq!(got, UNKNOWN_SET, "{args:?} on the owner");
                } else {
                    assert_eq!(got, format!("MOVED {slot} {}", owner.addr()), "{args:?}");
                }
            }
        }
    }
    assert_eq!(owners_seen.len(), 3, "24 items should hit every primary");
    // NODEINFO declares no key: every node runs it. INFO and REBUILD are routed by the set name.
    let name_owner = cl.set_owner("nosuchset");
    for n in &cl.nodes {
        let mut c = n.conn();
        assert_eq!(err(&mut c, &["MEMBER.NODEINFO", "nosuchset"]), UNKNOWN_SET);
        for cmd in ["MEMBER.INFO", "MEMBER.REBUILD"] {
            let got = err(&mut c, &[cmd, "nosuchset"]);
            if n.port() == name_owner.port() {
                assert_eq!(got, UNKNOWN_SET, "{cmd}");
            } else {
                assert!(got.starts_with("MOVED "), "{cmd} on {}: {got}", n.addr());
            }
        }
    }
}

/// Sets a slot back to STABLE on both nodes, even if the test fails half-way.
struct Migration<'a> {
    slot: u16,
    nodes: [&'a support::cluster::Node; 2],
}

impl Drop for Migration<'_> {
    fn drop(&mut self) {
        for n in self.nodes {
            let _ = cmd(
                &mut n.conn(),
                &["CLUSTER", "SETSLOT", &self.slot.to_string(), "STABLE"],
            );
        }
    }
}

#[test]
fn a_slot_in_migration_answers_ask() {
    let held = Cluster::shared_exclusive();
    let cl: &Cluster = &held;
    let item = "ask-probe";
    let slot = cl.keyslot(item);
    let src = cl.owner(slot);
    let dst = cl.primaries().find(|n| n.port() != src.port()).unwrap();
    let s = slot.to_string();
    let _restore = Migration {
        slot,
        nodes: [src, dst],
    };
    ok(
        &mut dst.conn(),
        &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src.id],
    );
    ok(
        &mut src.conn(),
        &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst.id],
    );
    let args = ["MEMBER.EXISTS", "nosuchset", item];
    // The item is never a key on the source, so a migrating slot always sends it on.
    assert_eq!(
        err(&mut src.conn(), &args),
        format!("ASK {slot} {}", dst.addr())
    );
    let mut d = dst.conn();
    assert_eq!(err(&mut d, &args), format!("MOVED {slot} {}", src.addr()));
    ok(&mut d, &["ASKING"]);
    assert_eq!(
        err(&mut d, &args),
        UNKNOWN_SET,
        "ASKING lets the target run it"
    );
}

#[test]
fn the_cluster_client_lands_every_item_on_its_owner() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "landing";
    let mut cc = cl.client();
    // Routed by argv[1], the set name: CREATE's routing key, so it lands on that slot's owner.
    let v: Value = redis::cmd("MEMBER.CREATE").arg(set).query(&mut cc).unwrap();
    assert_eq!(v, Value::Okay);
    cl.create_everywhere(set);

    let members: Vec<String> = (0..30).map(|i| format!("member-{i}")).collect();
    let absent: Vec<String> = (0..30).map(|i| format!("absent-{i}")).collect();
    for m in &members {
        let n: i64 = redis::cmd("MEMBER.ADD")
            .arg(set)
            .arg(m)
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 1, "ADD {m}");
    }
    for m in &members {
        let n: i64 = redis::cmd("MEMBER.EXISTS")
            .arg(set)
            .arg(m)
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 1, "EXISTS {m}");
    }
    for a in &absent {
        let n: i64 = redis::cmd("MEMBER.EXISTS")
            .arg(set)
            .arg(a)
            .query(&mut cc)
            .unwrap();
        assert_eq!(n, 0, "EXISTS {a}");
    }

    // Each primary ran exactly the calls for the items it owns.
    let owner_port = |item: &str| cl.owner(cl.keyslot(item)).port();
    for p in cl.primaries() {
        let owned =
            |items: &[String]| items.iter().filter(|i| owner_port(i) == p.port()).count() as i64;
        let (adds, lookups) = (owned(&members), owned(&members) + owned(&absent));
        assert!(adds > 0, "30 items should hit every primary");
        let mut c = p.conn();
        assert_eq!(
            set_counter(&mut c, set, "adds"),
            adds,
            "adds on {}",
            p.addr()
        );
        assert_eq!(
            set_counter(&mut c, set, "exists_calls"),
            lookups,
            "lookups on {}",
            p.addr()
        );
    }

    // A replica (in READONLY mode) answers for its primary's items and redirects the rest.
    for p in cl.primaries() {
        let r = cl.replica_of(p);
        let mut c = r.conn();
        ok(&mut c, &["READONLY"]);
        for m in &members {
            let owner = cl.owner(cl.keyslot(m));
            if owner.port() == p.port() {
                assert!(
                    wait_until(Duration::from_secs(10), || {
                        int(&mut c, &["MEMBER.EXISTS", set, m]) == 1
                    }),
                    "replica {} never answered 1 for {m}",
                    r.addr()
                );
            } else {
                let slot = cl.keyslot(m);
                assert_eq!(
                    err(&mut c, &["MEMBER.EXISTS", set, m]),
                    format!("MOVED {slot} {}", owner.addr())
                );
            }
        }
    }
}

/// `valkey-cli -c` routes nothing itself: it sends to the node it is connected to and follows
/// the server's MOVED/ASK, so it goes wherever the server's key spec says.
#[test]
fn the_cli_in_cluster_mode_follows_moved() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    let set = "cli";
    cl.create_everywhere(set);
    let item = "cli-item";
    let owner = cl.owner(cl.keyslot(item));
    assert_eq!(int(&mut owner.conn(), &["MEMBER.ADD", set, item]), 1);
    let elsewhere = cl.primaries().find(|n| n.port() != owner.port()).unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(cli_binary())
            .args(["-h", "127.0.0.1", "-p", &elsewhere.port().to_string()])
            .args(extra)
            .args(["MEMBER.EXISTS", set, item])
            .output()
            .expect("run the cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
            + String::from_utf8_lossy(&out.stderr).trim()
    };
    assert_eq!(run(&["-c"]), "1");
    let plain = run(&[]);
    assert!(plain.contains("MOVED"), "without -c: {plain}");
}

/// Two clients asking at once to create one set with different settings (CREATE is routed by
/// the set name, so both reach the same primary): the catalog keeps exactly one definition,
/// the other CREATE gets a clear error, and every node ends up with the kept one.
#[test]
fn a_create_racing_from_two_clients_keeps_one_definition() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    for round in 0..3 {
        let set = format!("race{round}");
        let nodes = [cl.set_owner(&set), cl.set_owner(&set)];
        let barrier = std::sync::Barrier::new(2);
        let replies: Vec<Result<Value, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = nodes
                .iter()
                .zip(["0.01", "0.05"])
                .map(|(n, rate)| {
                    let (set, barrier) = (&set, &barrier);
                    let mut c = n.conn();
                    s.spawn(move || {
                        barrier.wait();
                        redis::cmd("MEMBER.CREATE")
                            .arg(set)
                            .arg("ERROR")
                            .arg(rate)
                            .query::<Value>(&mut c)
                            .map_err(|e| e.to_string())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let oks = replies
            .iter()
            .filter(|r| matches!(r, Ok(Value::Okay)))
            .count();
        assert_eq!(oks, 1, "{set}: {replies:?}");
        let refused = replies.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            refused.contains("set already exists with different settings"),
            "{set}: {refused}"
        );
        let rates: Vec<_> = cl
            .nodes
            .iter()
            .map(|n| {
                let mut c = n.conn();
                let mut rate = set_info(&mut c, &set, "error_rate");
                wait_until(Duration::from_secs(20), || {
                    rate = set_info(&mut c, &set, "error_rate");
                    rate.is_ok()
                });
                rate
            })
            .collect();
        assert!(rates.iter().all(|r| *r == rates[0]), "{set}: {rates:?}");
    }
}
