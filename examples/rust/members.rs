//! libmember from Rust's `redis` crate: the calls of a sign-up check, and the one error worth
//! retrying. Built as the `members` example (`main.rs`) and run by the integration tests
//! (`tests/all/client_snippets.rs`).

use std::thread::sleep;
use std::time::Duration;

use redis::cluster::ClusterConnection;
use redis::{Connection, RedisError, RedisResult};

/// Whether `err` is libmember's retryable reply: PostgreSQL (the source of truth) did not
/// answer in time, and the module said `UNAVAILABLE …` rather than guess. Every other error
/// is final.
pub fn is_unavailable(err: &RedisError) -> bool {
    err.code() == Some("UNAVAILABLE")
}

/// Runs `call` at most `tries` times: again after an UNAVAILABLE reply, with a growing pause;
/// any other answer, or the last try's UNAVAILABLE, is returned as it is. Retrying an ADD is
/// safe: an ADD of a member answers 0.
pub fn retrying<T>(tries: u32, mut call: impl FnMut() -> RedisResult<T>) -> RedisResult<T> {
    let mut attempt = 1;
    loop {
        match call() {
            Err(e) if is_unavailable(&e) && attempt < tries => {
                sleep(Duration::from_millis(200 * u64::from(attempt)));
                attempt += 1;
            }
            answer => return answer,
        }
    }
}

/// What [`first_calls`] was answered.
#[derive(Debug, PartialEq)]
pub struct Answers {
    /// Whether the ADD made alice a member (false if she already was one).
    pub added: bool,
    /// Whether ALICE is a member (true: NORMALIZE username makes her alice).
    pub taken: bool,
    /// Whether bob is a member.
    pub bob: bool,
    /// MEXISTS of alice and bob.
    pub both: Vec<bool>,
}

/// On one server: creates `set` (NORMALIZE username), adds alice, then asks for ALICE and
/// bob, one by one and in one MEXISTS.
pub fn first_calls(con: &mut Connection, set: &str) -> RedisResult<Answers> {
    redis::cmd("MEMBER.CREATE")
        .arg(&[set, "NORMALIZE", "username"])
        .query::<()>(con)?;
    let added: bool = redis::cmd("MEMBER.ADD").arg(&[set, "alice"]).query(con)?;
    let taken: bool = redis::cmd("MEMBER.EXISTS")
        .arg(&[set, "ALICE"])
        .query(con)?;
    let bob: bool = redis::cmd("MEMBER.EXISTS").arg(&[set, "bob"]).query(con)?;
    let items = ["ITEMS", "alice", "bob"];
    let both: Vec<bool> = redis::cmd("MEMBER.MEXISTS")
        .arg(set)
        .arg(&items)
        .query(con)?;
    Ok(Answers {
        added,
        taken,
        bob,
        both,
    })
}

/// On a cluster: creates `set`, adds `add` with one MADD, then answers EXISTS for each of
/// `ask`. The crate's cluster client routes a module command by its first argument (the set
/// name): CREATE and MADD land at once (MADD on the set name's node, which asks the owners of
/// the items' slots), and each per-item call reaches the item's owner through one MOVED.
pub fn cluster_calls(
    con: &mut ClusterConnection,
    set: &str,
    add: &[&str],
    ask: &[&str],
) -> RedisResult<(Vec<bool>, Vec<bool>)> {
    redis::cmd("MEMBER.CREATE")
        .arg(&[set, "NORMALIZE", "username"])
        .query::<()>(con)?;
    let added: Vec<bool> = redis::cmd("MEMBER.MADD")
        .arg(set)
        .arg("ITEMS")
        .arg(add)
        .query(con)?;
    let mut found = Vec::new();
    for item in ask {
        found.push(redis::cmd("MEMBER.EXISTS").arg(&[set, item]).query(con)?);
    }
    Ok((added, found))
}
