//! What a test does to a cluster of its own ([`Cluster::start`]): reshard and check it with the
//! real CLI, kill and restart nodes, follow roles after a failover, wait for the slot table to
//! settle. The shared cluster's tests never call these.

use std::process::Command;
use std::time::Duration;

use redis::{Connection, Value};

use super::cluster::{cli_binary, read_slots, Cluster, Node, NODES};
use super::member::wait_catalog_loaded;
use super::wait_until;

/// What one `<cli> --cluster …` run did.
pub struct CliRun {
    pub ok: bool,
    /// The command line, its exit status, stdout and stderr, for assertion messages.
    pub text: String,
}

/// The CLI's output without colour codes, and each run of `Moving slot …` lines (one per
/// slot, a thousand for a reshard) cut to its last three.
fn readable(out: &str) -> String {
    let mut plain = String::with_capacity(out.len());
    let mut chars = out.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ … letter
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let mut text = String::new();
    let mut run: Vec<&str> = Vec::new();
    let flush = |run: &mut Vec<&str>, text: &mut String| {
        if run.len() > 3 {
            text.push_str(&format!(
                "    ({} lines \"Moving slot …\" left out)\n",
                run.len() - 3
            ));
        }
        for l in run.drain(..).rev().take(3).rev() {
            text.push_str(l);
            text.push('\n');
        }
    };
    for line in plain.lines() {
        if line.trim_start().starts_with("Moving slot") {
            run.push(line);
        } else {
            flush(&mut run, &mut text);
            text.push_str(line);
            text.push('\n');
        }
    }
    flush(&mut run, &mut text);
    text
}

/// `INFO <section>`, or empty.
fn info(c: &mut Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(c).unwrap_or_default()
}

/// `CLUSTER INFO`, or empty.
fn cluster_info(c: &mut Connection) -> String {
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query(c)
        .unwrap_or_default()
}

fn role_is_primary(c: &mut Connection) -> Option<bool> {
    let role: Vec<Value> = redis::cmd("ROLE").query(c).ok()?;
    Some(matches!(role.first(), Some(Value::BulkString(b)) if b == b"master"))
}

fn try_conn(n: &Node) -> Option<Connection> {
    let c = redis::Client::open(n.vk.url()).ok()?;
    let con = c
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(con)
}

impl Cluster {
    /// Runs `<cli> --cluster <args>` and returns how it went.
    pub fn cli(&self, args: &[&str]) -> CliRun {
        let out = Command::new(cli_binary())
            .arg("--cluster")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", cli_binary()));
        CliRun {
            ok: out.status.success(),
            text: format!(
                "$ {} --cluster {}\n{}\n--- stdout\n{}--- stderr\n{}",
                cli_binary(),
                args.join(" "),
                out.status,
                readable(&String::from_utf8_lossy(&out.stdout)),
                readable(&String::from_utf8_lossy(&out.stderr))
            ),
        }
    }

    /// `--cluster reshard` of `slots` slots from `from` to `to`, without questions.
    pub fn reshard(&self, from: &Node, to: &Node, slots: usize) -> CliRun {
        let n = slots.to_string();
        self.cli(&[
            "reshard",
            &from.addr(),
            "--cluster-from",
            &from.id,
            "--cluster-to",
            &to.id,
            "--cluster-slots",
            &n,
            "--cluster-yes",
        ])
    }

    /// What `node` holds in `slot`: the key count and up to ten key names (escaped), for the
    /// message of a reshard that stopped at that slot.
    pub fn keys_in_slot(&self, node: &Node, slot: u16) -> String {
        let mut c = node.conn();
        let count: i64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut c)
            .unwrap_or(-1);
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(10)
            .query(&mut c)
            .unwrap_or_default();
        let names: Vec<String> = keys.iter().map(|k| k.escape_ascii().to_string()).collect();
        format!(
            ":{} holds {count} keys in slot {slot}: {names:?}",
            node.port()
        )
    }

    /// `--cluster check` through the first live primary; clean means exit status 0 and neither
    /// `[ERR]` nor `[WARNING]` in its output.
    pub fn check(&self) -> CliRun {
        let addr = self.primaries().next().expect("a live primary").addr();
        let mut run = self.cli(&["check", &addr]);
        run.ok = run.ok && !run.text.contains("[ERR]") && !run.text.contains("[WARNING]");
        run
    }

    /// Polls [`Cluster::check`] until it is clean (gossip takes a moment to carry a new slot
    /// table everywhere); returns the last run.
    pub fn wait_check_clean(&self, timeout: Duration) -> CliRun {
        let mut last = self.check();
        wait_until(timeout, || {
            last = self.check();
            last.ok
        });
        last
    }

    /// The slots `primary` serves, ascending, from `CLUSTER SLOTS`.
    pub fn slots_of(&self, primary: &Node) -> Vec<u16> {
        self.slots()
            .into_iter()
            .filter(|r| r.primary_port == primary.port())
            .flat_map(|r| r.first..=r.last)
            .collect()
    }

    /// Every slot's primary port, as a live primary sees it now (0 = unserved).
    pub fn slot_table(&self) -> Vec<u16> {
        let mut table = vec![0u16; 16384];
        let mut c = self.primaries().next().expect("a live primary").conn();
        for r in read_slots(&mut c) {
            for s in r.first..=r.last {
                table[s as usize] = r.primary_port;
            }
        }
        table
    }

    /// Kills a node with SIGKILL; it stays down until [`Cluster::restart`].
    pub fn kill9(&mut self, port: u16) {
        let n = self.nodes.iter_mut().find(|n| n.port() == port).unwrap();
        n.vk.kill9();
        n.down = true;
    }

    /// Starts a killed node again on its dir and port (its `nodes.conf` brings it back into
    /// the cluster) and waits for its catalog.
    pub fn restart(&mut self, port: u16) {
        let n = self.nodes.iter_mut().find(|n| n.port() == port).unwrap();
        n.vk.restart();
        n.down = false;
        let mut all = NODES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = all.iter_mut().find(|(_, d)| d == n.vk.dir()) {
            e.0 = n.vk.pid();
        }
        drop(all);
        assert!(
            wait_catalog_loaded(&mut n.conn(), Duration::from_secs(20)),
            "catalog never loaded on restarted {}",
            n.addr()
        );
    }

    /// True once the node on `port` says it is a primary.
    pub fn is_primary_now(&self, port: u16) -> bool {
        try_conn(self.node_by_port(port))
            .and_then(|mut c| role_is_primary(&mut c))
            .unwrap_or(false)
    }

    /// Reads every live node's role (and a replica's primary) again, after a failover.
    pub fn refresh_roles(&mut self) {
        for n in self.nodes.iter_mut().filter(|n| !n.down) {
            let Some(mut c) = try_conn(n) else { continue };
            let Some(primary) = role_is_primary(&mut c) else {
                continue;
            };
            n.primary = primary;
            n.primary_port = if primary {
                None
            } else {
                info(&mut c, "replication")
                    .lines()
                    .find_map(|l| l.strip_prefix("master_port:"))
                    .and_then(|p| p.trim().parse().ok())
            };
        }
    }

    /// Waits until every live node reports `cluster_state:ok` with all slots served and,
    /// when `linked`, every live replica's link to its primary is up. Err says who is not.
    pub fn wait_healthy(&self, timeout: Duration, linked: bool) -> Result<(), String> {
        let mut why = String::new();
        let ok = wait_until(timeout, || {
            for n in self.nodes.iter().filter(|n| !n.down) {
                let Some(mut c) = try_conn(n) else {
                    why = format!("{} does not answer", n.addr());
                    return false;
                };
                let ci = cluster_info(&mut c);
                if !ci.contains("cluster_state:ok") || !ci.contains("cluster_slots_ok:16384") {
                    why = format!("{}: {}", n.addr(), ci.replace("\r\n", " "));
                    return false;
                }
                if linked
                    && role_is_primary(&mut c) == Some(false)
                    && !info(&mut c, "replication").contains("master_link_status:up")
                {
                    why = format!("replica {} not linked", n.addr());
                    return false;
                }
            }
            true
        });
        if ok {
            Ok(())
        } else {
            Err(why)
        }
    }

    /// Sets every slot some live node has open (`MIGRATING`/`IMPORTING`) back to `STABLE` on
    /// every live primary, so that a failed reshard leaves a usable cluster. Returns the
    /// slots it closed.
    pub fn close_open_slots(&self) -> Vec<u16> {
        let mut open = Vec::new();
        for n in self.primaries() {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut n.conn())
                .unwrap_or_default();
            // Open slots show as `[<slot>->-<id>]` or `[<slot>-<-<id>]` on the `myself` line.
            for line in nodes.lines().filter(|l| l.contains("myself")) {
                for part in line.split('[').skip(1) {
                    if let Some(slot) = part.split('-').next().and_then(|s| s.parse().ok()) {
                        open.push(slot);
                    }
                }
            }
        }
        open.sort_unstable();
        open.dedup();
        for slot in &open {
            for n in self.primaries() {
                let _ = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("STABLE")
                    .query::<Value>(&mut n.conn());
            }
        }
        open
    }
}
