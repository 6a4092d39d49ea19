//! Atomic slot migration (Valkey ≥ 9.0, `CLUSTER MIGRATESLOTS`) driven from the tests: start a
//! job, wait for its end as the source reports it (`CLUSTER GETSLOTMIGRATIONS`), and check that
//! no node keeps a key in a slot it does not own.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use redis::Value;

use super::cluster::{Cluster, Node};
use super::valkey::server_version;

/// One job as `CLUSTER GETSLOTMIGRATIONS` shows it: its fields as text.
pub type Job = HashMap<String, String>;

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// Every job `node` remembers, newest first.
pub fn jobs(node: &Node) -> Vec<Job> {
    let v: Value = redis::cmd("CLUSTER")
        .arg("GETSLOTMIGRATIONS")
        .query(&mut node.conn())
        .expect("CLUSTER GETSLOTMIGRATIONS");
    let Value::Array(list) = v else {
        panic!("CLUSTER GETSLOTMIGRATIONS answered {v:?}");
    };
    list.iter()
        .map(|j| match j {
            Value::Array(kv) => kv
                .chunks_exact(2)
                .map(|p| (text(&p[0]), text(&p[1])))
                .collect(),
            Value::Map(kv) => kv.iter().map(|(k, v)| (text(k), text(v))).collect(),
            other => panic!("a job that is not a map: {other:?}"),
        })
        .collect()
}

/// True when the server under test can run atomic slot migration (Valkey ≥ 9.0); prints why
/// a test is skipped otherwise.
pub fn has_asm(cl: &Cluster, test: &str) -> bool {
    let v = server_version(&mut cl.primaries().next().unwrap().conn());
    let yes = v.valkey_at_least((9, 0, 0));
    if !yes {
        eprintln!("{test}: skipped on {v}: no atomic slot migration before Valkey 9.0");
    }
    yes
}

/// Holds `node`'s export jobs before their last step (`DEBUG SLOTMIGRATION PREVENT-PAUSE`), or
/// lets them go on: the snapshot sent, changes streaming, the same halfway point every run.
pub fn hold_before_last_step(node: &Node, on: bool) {
    redis::cmd("DEBUG")
        .arg("SLOTMIGRATION")
        .arg("PREVENT-PAUSE")
        .arg(if on { "1" } else { "0" })
        .query::<String>(&mut node.conn())
        .expect("DEBUG SLOTMIGRATION PREVENT-PAUSE");
}

/// `ranges` as `CLUSTER GETSLOTMIGRATIONS` writes them (`a-b a-b …`).
fn ranges_text(ranges: &[(u16, u16)]) -> String {
    ranges
        .iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts one job moving `ranges` from `from` to `to` and returns its name (read from the
/// source's job log: the one that was not there before), or the server's error.
pub fn start(from: &Node, to: &Node, ranges: &[(u16, u16)]) -> Result<String, String> {
    let before: BTreeSet<String> = jobs(from)
        .into_iter()
        .filter_map(|j| j.get("name").cloned())
        .collect();
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("MIGRATESLOTS");
    for (a, b) in ranges {
        cmd.arg("SLOTSRANGE").arg(*a).arg(*b);
    }
    cmd.arg("NODE").arg(&to.id);
    cmd.query::<String>(&mut from.conn())
        .map_err(|e| e.to_string())?;
    let want = ranges_text(ranges);
    jobs(from)
        .into_iter()
        .find(|j| {
            j.get("operation").map(String::as_str) == Some("EXPORT")
                && j.get("slot_ranges") == Some(&want)
                && j.get("name").is_some_and(|n| !before.contains(n))
        })
        .and_then(|j| j.get("name").cloned())
        .ok_or_else(|| format!("no new export job of {want} on {}", from.addr()))
}

/// The job `name` on `node`, if it still remembers it.
pub fn job(node: &Node, name: &str) -> Option<Job> {
    jobs(node)
        .into_iter()
        .find(|j| j.get("name").map(String::as_str) == Some(name))
}

/// Waits up to `timeout` for the job `name` on `node` to reach a state `pred` accepts;
/// returns the job as last seen.
pub fn wait_state(node: &Node, name: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> Job {
    let end = Instant::now() + timeout;
    loop {
        let j = job(node, name).unwrap_or_default();
        let state = j.get("state").cloned().unwrap_or_default();
        if pred(&state) || Instant::now() >= end {
            return j;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True for the states a job ends in.
pub fn ended(state: &str) -> bool {
    matches!(state, "success" | "failed" | "cancelled")
}

/// Moves `ranges` from `from` to `to` and waits (up to `timeout`) for the job's end on the
/// source: `Ok(seconds)` when it succeeded, else why not.
pub fn migrate(
    from: &Node,
    to: &Node,
    ranges: &[(u16, u16)],
    timeout: Duration,
) -> Result<f64, String> {
    let t = Instant::now();
    let name = start(from, to, ranges)?;
    let j = wait_state(from, &name, timeout, ended);
    match j.get("state").map(String::as_str) {
        Some("success") => Ok(t.elapsed().as_secs_f64()),
        _ => Err(format!("job {name}: {j:?}")),
    }
}

/// Every key a live primary holds in a slot it does not own, as `node: key (slot)`; and a
/// replica's, in a slot its primary does not own. Reads each node's own slot map; `slot_of`
/// is the cluster's key slot function.
pub fn keys_out_of_place(cl: &Cluster, slot_of: fn(&[u8]) -> u16) -> Vec<String> {
    let mut out = Vec::new();
    for n in cl.nodes.iter().filter(|n| !n.down) {
        let mut c = n.conn();
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut c)
            .expect("CLUSTER NODES");
        let mut owned = vec![false; 16384];
        let me = nodes
            .lines()
            .find(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
            .expect("myself");
        let fields: Vec<&str> = me.split(' ').collect();
        let serving = if fields[2].contains("master") {
            me.to_string()
        } else {
            let primary = fields[3];
            nodes
                .lines()
                .find(|l| l.starts_with(primary))
                .unwrap_or_default()
                .to_string()
        };
        for r in serving.split(' ').skip(8) {
            if r.starts_with('[') {
                continue;
            }
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                owned[a..=b.min(16383)].fill(true);
            }
        }
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query(&mut c)
                .expect("SCAN");
            for k in keys {
                let slot = slot_of(&k);
                if !owned[slot as usize] {
                    out.push(format!(
                        "{}: {} ({slot})",
                        n.addr(),
                        String::from_utf8_lossy(&k)
                    ));
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    out
}
