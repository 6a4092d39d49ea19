//! Only the module writes its keys (issue 24, item 5): a value another command puts onto an
//! exact-match key — even the very bytes the module wrote there, copied with GET before a DEL
//! removed the member — never answers "present", and the module deletes a string put there. Entries the
//! module filled itself stay believed, on a primary with a replica too.
use crate::support;

use std::thread;
use std::time::Duration;

use redis::{Connection, Value};
use support::lifecycle::{log_tail, wait_linked};
use support::member::*;
use support::{start_with, wait_until};

/// Longer than RECENT-TTL 1 s: from then on no recent-writes mark covers an earlier ADD, so a
/// filter hit goes to the cache.
const PAST_RECENT: Duration = Duration::from_millis(1200);

const WITHIN: Duration = Duration::from_secs(30);

fn create(c: &mut Connection, set: &str) {
    ok(
        c,
        &["MEMBER.CREATE", set, "CACHE-TTL", "300", "RECENT-TTL", "1"],
    );
}

/// Fills `item`'s exact-match entry through a lookup and returns the value the module wrote.
fn filled(c: &mut Connection, set: &str, item: &str) -> Vec<u8> {
    assert_eq!(int(c, &["MEMBER.EXISTS", set, item]), 1);
    assert_eq!(
        explain(c, set, item),
        (1, "cache-hit".to_string()),
        "{item}"
    );
    redis::cmd("GET")
        .arg(cache_key(set, item, ""))
        .query(c)
        .unwrap()
}

fn run(c: &mut Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut k = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        k.arg(*a);
    }
    k.query(c)
}

/// The answer for a deleted member, sent right behind the foreign write (one pipeline, or one
/// transaction, so that nothing of the module runs in between), then on its own: anything but
/// a 1. An error (the database slow on a busy machine, or a lookup inside MULTI that would
/// need it) is not a wrong answer. Returns what was wrong.
fn answer_after(
    c: &mut Connection,
    set: &str,
    item: &str,
    write: &[&[u8]],
    atomic: bool,
) -> Option<String> {
    let mut p = redis::pipe();
    if atomic {
        p.atomic();
    }
    let mut k = redis::cmd(std::str::from_utf8(write[0]).unwrap());
    for a in &write[1..] {
        k.arg(*a);
    }
    p.add_command(k);
    p.cmd("MEMBER.EXPLAIN").arg(set).arg(item);
    let got: redis::RedisResult<Vec<Value>> = p.query(c);
    match &got {
        Ok(v) => {
            if matches!(v.last(), Some(Value::Array(a)) if a.first() == Some(&Value::Int(1))) {
                return Some(format!("{item}: right behind the write: {got:?}"));
            }
        }
        Err(e)
            if e.code() == Some("UNAVAILABLE")
                || (atomic && e.to_string().contains("cannot block inside MULTI")) => {}
        // Any other error (the write refused, say) means the check behind it never ran.
        Err(e) => return Some(format!("{item}: the write or the lookup behind it: {e}")),
    }
    match redis::cmd("MEMBER.EXPLAIN")
        .arg(set)
        .arg(item)
        .query::<(i64, String)>(c)
    {
        Ok((0, _)) => None,
        Err(e) if e.code() == Some("UNAVAILABLE") => None,
        other => Some(format!("{item}: then: {other:?}")),
    }
}

#[test]
fn a_write_of_another_command_onto_a_cache_key_never_makes_an_item_present() {
    let env = Env::new();
    let mut c = env.conn();
    let set = "s3";
    create(&mut c, set);
    // Ten writes of a string, then five of other types.
    let variants = [
        "set", "multi", "setrange", "append", "setex", "psetex", "getset", "mset", "msetnx",
        "setnx", "hset", "lpush", "sadd", "zadd", "xadd",
    ];
    for item in variants.iter().chain(&["kept"]) {
        assert_eq!(int(&mut c, &["MEMBER.ADD", set, item]), 1);
    }
    thread::sleep(PAST_RECENT);
    // Filled before any foreign write: a write onto another key must not cost it its entry.
    filled(&mut c, set, "kept");
    let mut wrong = Vec::new();
    for item in variants {
        let value = filled(&mut c, set, item);
        assert_eq!(int(&mut c, &["MEMBER.DEL", set, item]), 1);
        let key = cache_key(set, item, "");
        let (k, v) = (key.as_slice(), value.as_slice());
        let write: Vec<&[u8]> = match item {
            "set" | "multi" => vec![b"SET", k, v, b"EX", b"300"],
            "setrange" => vec![b"SETRANGE", k, b"0", v],
            "append" => vec![b"APPEND", k, v],
            "setex" => vec![b"SETEX", k, b"300", v],
            "psetex" => vec![b"PSETEX", k, b"300000", v],
            "getset" => vec![b"GETSET", k, v],
            "mset" => vec![b"MSET", b"unrelated", b"x", k, v],
            "msetnx" => vec![b"MSETNX", k, v],
            "setnx" => vec![b"SETNX", k, v],
            "hset" => vec![b"HSET", k, b"f", v],
            "lpush" => vec![b"LPUSH", k, v],
            "sadd" => vec![b"SADD", k, v],
            "zadd" => vec![b"ZADD", k, b"1", v],
            _ => vec![b"XADD", k, b"*", b"f", v],
        };
        wrong.extend(answer_after(&mut c, set, item, &write, item == "multi"));
    }
    assert!(
        wrong.is_empty(),
        "a value another command wrote made a deleted member present: {wrong:#?}"
    );
    // The module deletes the strings other commands wrote there. A value of another type is
    // never read as an entry (the module does not watch those writes) and the next fill
    // replaces it.
    let mut left = Vec::new();
    let gone = wait_until(WITHIN, || {
        left = variants[..10]
            .iter()
            .filter(|i| {
                int(
                    &mut c,
                    &["EXISTS", &String::from_utf8(cache_key(set, i, "")).unwrap()],
                ) == 1
            })
            .collect();
        left.is_empty()
    });
    assert!(
        gone,
        "foreign values stayed: {left:?}\n{}",
        log_tail(&env.vk)
    );
    // The entry filled next is the module's own again, and believed.
    for item in variants {
        assert_eq!(int(&mut c, &["MEMBER.ADD", set, item]), 1);
    }
    thread::sleep(PAST_RECENT);
    for item in variants {
        filled(&mut c, set, item);
    }
    // Only the keys written were distrusted, not the whole cache.
    assert_eq!(explain(&mut c, set, "kept"), (1, "cache-hit".to_string()));
}

/// An entry whose TTL another command lengthened (PERSIST, EXPIRE) could outlive the membership
/// it stands for: it is not believed either.
#[test]
fn a_ttl_changed_by_another_command_is_not_believed() {
    let env = Env::new();
    let mut c = env.conn();
    let set = "ttl";
    create(&mut c, set);
    for item in ["persist", "expire"] {
        assert_eq!(int(&mut c, &["MEMBER.ADD", set, item, "TTL", "3"]), 1);
    }
    thread::sleep(PAST_RECENT);
    for item in ["persist", "expire"] {
        filled(&mut c, set, item);
        let key = cache_key(set, item, "");
        let k = key.as_slice();
        let write: Vec<&[u8]> = match item {
            "persist" => vec![b"PERSIST", k],
            _ => vec![b"EXPIRE", k, b"300"],
        };
        run(&mut c, &write).unwrap();
        let (a, path) = explain(&mut c, set, item);
        assert_ne!(
            path, "cache-hit",
            "{item}: answered {a} from a lengthened entry"
        );
    }
    // Past the memberships' expiry.
    thread::sleep(Duration::from_secs(3));
    for item in ["persist", "expire"] {
        match redis::cmd("MEMBER.EXPLAIN")
            .arg(set)
            .arg(item)
            .query::<(i64, String)>(&mut c)
        {
            Ok((a, path)) => assert_eq!(a, 0, "{item}: expired member answered ({a}, {path})"),
            Err(e) => assert_eq!(e.code(), Some("UNAVAILABLE"), "{item}: {e}"),
        }
    }
}

/// With a replica attached, the primary's own fills (which fire no notification and are not
/// replicated) stay believed through ordinary traffic, and the primary's delete of a foreign
/// value reaches the replica.
#[test]
fn a_primarys_own_fills_stay_believed_with_a_replica() {
    let env = Env::new();
    let mut p = env.conn();
    let set = "rep";
    create(&mut p, set);
    let replica = start_with(&env.db.url(), &[]);
    let mut r = replica.conn();
    ok(
        &mut r,
        &["REPLICAOF", "127.0.0.1", &env.vk.port().to_string()],
    );
    wait_linked(&replica, &mut r, WITHIN);
    for item in ["a", "b", "gone"] {
        assert_eq!(int(&mut p, &["MEMBER.ADD", set, item]), 1);
    }
    thread::sleep(PAST_RECENT);
    filled(&mut p, set, "a");
    filled(&mut p, set, "b");
    let value = filled(&mut p, set, "gone");
    // Ordinary traffic, replicated.
    for i in 0..20 {
        let item = format!("t{i}");
        assert_eq!(int(&mut p, &["MEMBER.ADD", set, &item]), 1);
        assert_eq!(int(&mut p, &["MEMBER.EXISTS", set, &item]), 1);
        assert_eq!(int(&mut p, &["MEMBER.EXISTS", set, "a"]), 1);
        if i % 2 == 0 {
            assert_eq!(int(&mut p, &["MEMBER.DEL", set, &item]), 1);
        }
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut p).unwrap();
    assert_eq!(acked, 1, "{}", log_tail(&replica));
    for item in ["a", "b"] {
        assert_eq!(explain(&mut p, set, item), (1, "cache-hit".to_string()));
    }
    // A foreign value on the primary reaches the replica, and so does the primary's delete.
    assert_eq!(int(&mut p, &["MEMBER.DEL", set, "gone"]), 1);
    let key = cache_key(set, "gone", "");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&value)
        .query(&mut p)
        .unwrap();
    assert_eq!(explain(&mut p, set, "gone").0, 0);
    for (name, c) in [("primary", &mut p), ("replica", &mut r)] {
        assert!(
            wait_until(WITHIN, || {
                redis::cmd("EXISTS").arg(&key).query::<i64>(c).unwrap() == 0
            }),
            "the foreign value stayed on the {name}"
        );
    }
    assert_eq!(explain(&mut p, set, "a"), (1, "cache-hit".to_string()));
    assert_eq!(explain(&mut p, set, "b"), (1, "cache-hit".to_string()));
}

/// A filter key is a value of the module's own type: a write of another type onto it fails
/// (WRONGTYPE), and a SET replaces it. The set then has no filter: nothing answers "absent"
/// from what the SET left, and the rebuild that starts by itself puts a filter back.
#[test]
fn a_set_over_a_filter_key_leaves_no_filter_to_answer_absent_until_rebuilt() {
    let env = Env::new();
    let mut c = env.conn();
    let set = "fk";
    create(&mut c, set);
    assert_eq!(int(&mut c, &["MEMBER.ADD", set, "a"]), 1);
    let key = format!("member:{set}:bloom");
    let e = err(&mut c, &["HSET", &key, "f", "v"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    assert_eq!(
        explain(&mut c, set, "never"),
        (0, "bloom-negative".to_string())
    );
    let replies: Vec<Value> = redis::pipe()
        .cmd("SET")
        .arg(&key)
        .arg("junk")
        .cmd("MEMBER.EXPLAIN")
        .arg(set)
        .arg("never")
        .cmd("MEMBER.EXPLAIN")
        .arg(set)
        .arg("a")
        .query(&mut c)
        .unwrap();
    let never: redis::RedisResult<(i64, String)> = redis::from_redis_value(&replies[1]);
    assert!(
        !matches!(&never, Ok((_, p)) if p == "bloom-negative"),
        "answered from a string at the filter key: {never:?}"
    );
    let a: redis::RedisResult<(i64, String)> = redis::from_redis_value(&replies[2]);
    assert!(!matches!(a, Ok((0, _))), "a member answered {a:?}");
    assert!(
        wait_until(WITHIN, || bloom_negative_now(&mut c, set, "never")),
        "the set never got a filter back\n{}",
        log_tail(&env.vk)
    );
    let t: String = redis::cmd("TYPE").arg(&key).query(&mut c).unwrap();
    assert_eq!(t, "member-bf");
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", set, "a"]), 1);
}
