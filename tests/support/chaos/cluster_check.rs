//! After the cluster history load ([`super::cluster_load`]): the database holds what the
//! history says, and every item the run touched is answered as the database says by the
//! primary that owns its slot now, while every other live primary redirects it there.

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisResult, Value};

use super::checker::{known_state_at, Violation};
use super::cluster_load::LoadConfig;
use super::history::{Kind, Op};
use super::router::keyslot;
use super::truth::Truth;
use crate::support::cluster::{Cluster, Node};

/// The replies to `MEMBER.EXISTS <set> <item>` for each of `items`, pipelined, error
/// replies kept in place (`Value::ServerError`).
fn exists_many(c: &mut redis::Connection, set: &str, items: &[&str]) -> RedisResult<Vec<Value>> {
    let mut p = redis::pipe();
    for it in items {
        p.cmd("MEMBER.EXISTS").arg(set).arg(*it);
    }
    c.req_packed_commands(&p.get_packed_pipeline(), 0, items.len())
}

/// A reply as text for a violation.
fn shown(v: &RedisResult<Value>) -> String {
    match v {
        Ok(Value::Int(n)) => n.to_string(),
        Ok(Value::ServerError(e)) => format!("{} {}", e.code(), e.details().unwrap_or("")),
        Ok(v) => format!("{v:?}"),
        Err(e) => e.to_string(),
    }
}

/// After the load: the database holds what the history says, and every item the run touched
/// is answered as the database says by the primary that owns its slot now (an error there is
/// asked again for up to 30 s), while every other live primary redirects it there (`MOVED`).
pub fn final_check(cl: &Cluster, set: &str, cfg: &LoadConfig, ops: &[Op]) -> Vec<Violation> {
    let rules = &cfg.rules();
    let truth = &Truth::of(set, cfg);
    let mut out = Vec::new();
    let mut writes_of: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in ops {
        let w = writes_of.entry(&o.item).or_default();
        if o.kind != Kind::Exists {
            w.push(o);
        }
    }
    let asked: Vec<&str> = writes_of.keys().copied().collect();
    let members = truth.members(&mut cl.db().client(), &asked);
    for (item, writes) in &writes_of {
        let truth = members.contains(*item);
        if let (Some(k), by) = known_state_at(writes, u64::MAX / 2, rules) {
            if k != truth {
                out.push(Violation {
                    rule: "final: database differs from history",
                    text: format!(
                        "{item}: the database says {}, the history {}{}",
                        truth as u8,
                        k as u8,
                        by.map(|b| format!(" (by {})", b.describe()))
                            .unwrap_or_default()
                    ),
                });
            }
        }
    }
    let table = cl.slot_table();
    let owner = |item: &str| table[keyslot(item.as_bytes()) as usize];
    let items: Vec<&str> = writes_of.keys().copied().collect();
    // Items with a write that got no answer (UNAVAILABLE, a lost connection): its statement
    // may still land after the truth above was read.
    let unsettled: BTreeSet<&str> = writes_of
        .iter()
        .filter(|(_, w)| w.iter().any(|o| o.outcome.answer().is_none()))
        .map(|(item, _)| *item)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let members = &members;
    let (items, owner, unsettled) = (&items, &owner, &unsettled);
    let mut mismatched = Vec::new();
    thread::scope(|sc| {
        let asked: Vec<_> = cl
            .primaries()
            .map(|n| sc.spawn(move || ask_node(n, set, items, members, owner, unsettled, deadline)))
            .collect();
        for a in asked {
            let (violations, again) = a.join().expect("final check thread");
            out.extend(violations);
            mismatched.extend(again);
        }
    });
    // An unsettled item whose answer differed: the truth and the answer again, until the
    // truth read before and after the answer agree with it, for up to 30 s. A late write has
    // landed by then; a stale cache entry (300 s) or a filter that lost a member would not
    // have healed.
    for (port, item) in mismatched {
        let node = cl.primaries().find(|n| n.port() == port).unwrap();
        if let Some(v) = settle(
            cl,
            node,
            (set, truth),
            item,
            deadline + Duration::from_secs(30),
        ) {
            out.push(v);
        }
    }
    out
}

/// Asks `node`, the owner of `item`, until its answer agrees with the database read just
/// before and just after it (None), or `deadline` passes (the last disagreement).
fn settle(
    cl: &Cluster,
    node: &Node,
    (set, truth): (&str, &Truth),
    item: &str,
    deadline: Instant,
) -> Option<Violation> {
    let mut pg = cl.db().client();
    let mut c = node.conn();
    loop {
        let before = truth.has(&mut pg, item);
        let got = redis::cmd("MEMBER.EXISTS")
            .arg(set)
            .arg(item)
            .query::<Value>(&mut c);
        let after = truth.has(&mut pg, item);
        match got {
            Ok(Value::Int(a)) if before == after && (a == 1) == after => return None,
            _ if Instant::now() < deadline => thread::sleep(Duration::from_millis(200)),
            Ok(Value::Int(a)) => {
                return Some(Violation {
                    rule: "final: answer differs from the database",
                    text: format!(
                        "{item}: owner :{} answers {a}, the database says {} (after its \
                         unanswered writes had 30 s to land)",
                        node.port(),
                        after as u8
                    ),
                })
            }
            other => {
                return Some(Violation {
                    rule: "final: no answer",
                    text: format!("{item}: owner :{} replies {}", node.port(), shown(&other)),
                })
            }
        }
    }
}

/// One primary's part of the final check: its own items answered as the database says,
/// everyone else's redirected to their owner.
fn ask_node<'a>(
    n: &Node,
    set: &str,
    items: &[&'a str],
    members: &BTreeSet<String>,
    owner: &(impl Fn(&str) -> u16 + Sync),
    unsettled: &BTreeSet<&str>,
    deadline: Instant,
) -> (Vec<Violation>, Vec<(u16, &'a str)>) {
    let mut out = Vec::new();
    let mut mismatched = Vec::new();
    let port = n.port();
    let mut c = n.conn();
    let mut again: Vec<&str> = Vec::new();
    for chunk in items.chunks(500) {
        let replies = exists_many(&mut c, set, chunk)
            .unwrap_or_else(|e| panic!("pipeline of EXISTS to :{port}: {e}"));
        for (item, got) in chunk.iter().zip(replies) {
            let (truth, home) = (members.contains(*item), owner(item));
            let moved_home = format!("127.0.0.1:{home}");
            let (rule, text) = match got {
                Value::Int(a) if port == home && (a == 1) == truth => continue,
                Value::Int(_) if port == home && unsettled.contains(item) => {
                    mismatched.push((port, *item));
                    continue;
                }
                Value::Int(a) if port == home => (
                    "final: answer differs from the database",
                    format!(
                        "{item}: owner :{port} answers {a}, the database says {}",
                        truth as u8
                    ),
                ),
                Value::Int(a) => (
                    "final: a non-owner answered",
                    format!("{item}: :{port} answers {a}, the owner is :{home}"),
                ),
                Value::ServerError(e)
                    if port != home
                        && e.code() == "MOVED"
                        && e.details().is_some_and(|d| d.ends_with(&moved_home)) =>
                {
                    continue
                }
                _ if port == home => {
                    again.push(item);
                    continue;
                }
                other => (
                    "final: nodes disagree on the owner",
                    format!(
                        "{item}: :{port} replies {}, the owner is :{home}",
                        shown(&Ok(other))
                    ),
                ),
            };
            out.push(Violation { rule, text });
        }
    }
    // The owner's errors (a rebuild, a slow database): asked again one by one.
    for item in again {
        let truth = members.contains(item);
        let mut got = redis::cmd("MEMBER.EXISTS")
            .arg(set)
            .arg(item)
            .query::<Value>(&mut c);
        while !matches!(got, Ok(Value::Int(_))) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
            got = redis::cmd("MEMBER.EXISTS")
                .arg(set)
                .arg(item)
                .query::<Value>(&mut c);
        }
        let (rule, text) = match got {
            Ok(Value::Int(a)) if (a == 1) == truth => continue,
            Ok(Value::Int(_)) if unsettled.contains(item) => {
                mismatched.push((port, item));
                continue;
            }
            Ok(Value::Int(a)) => (
                "final: answer differs from the database",
                format!(
                    "{item}: owner :{port} answers {a}, the database says {}",
                    truth as u8
                ),
            ),
            other => (
                "final: no answer",
                format!("{item}: owner :{port} replies {}", shown(&other)),
            ),
        };
        out.push(Violation { rule, text });
    }
    (out, mismatched)
}
