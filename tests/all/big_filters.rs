//! Large filters never stall other clients: CREATE builds off the main thread (the rebuild
//! path) and the data type lets the server free a big filter on its lazy-free thread.
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use redis::Value;
use support::member::*;
use support::wait_until;

/// 200 000 000 members at 1 %: a 240 MB filter.
const BIG: [&str; 6] = [
    "MEMBER.CREATE",
    "big",
    "CAPACITY",
    "200000000",
    "ERROR",
    "0.01",
];

fn memory_field(c: &mut redis::Connection, name: &str) -> i64 {
    info_number(c, "memory", name)
}

#[test]
fn create_of_a_large_filter_leaves_other_clients_served_and_replies_when_built() {
    let env = Env::new();
    let creating = Arc::new(AtomicBool::new(true));
    let answered_meanwhile = {
        let mut other = env.conn();
        let creating = creating.clone();
        thread::spawn(move || {
            let mut n = 0u64;
            while creating.load(Ordering::SeqCst) {
                let pong: String = redis::cmd("PING").query(&mut other).unwrap();
                assert_eq!(pong, "PONG");
                // Counted only if CREATE had still not replied once PONG was back.
                if creating.load(Ordering::SeqCst) {
                    n += 1;
                }
            }
            n
        })
    };
    // Let the PING loop start, then CREATE from another client.
    thread::sleep(Duration::from_millis(50));
    let mut c = env.conn();
    assert_eq!(cmd(&mut c, &BIG).unwrap(), Value::Okay);
    creating.store(false, Ordering::SeqCst);
    let n = answered_meanwhile.join().unwrap();
    assert!(n > 0, "no other command was answered while CREATE ran");
    // OK means usable with a complete filter: absent items are answered in memory.
    assert_eq!(
        set_info(&mut c, "big", "filter_complete").as_deref(),
        Ok("1")
    );
    assert_eq!(
        explain(&mut c, "big", "nobody"),
        (0, "bloom-negative".into())
    );
    assert_eq!(
        set_info(&mut c, "big", "last_rebuild").as_deref(),
        Ok("ok"),
        "CREATE builds through the rebuild path"
    );
}

#[test]
fn unlink_frees_a_large_filter_on_the_lazy_free_thread() {
    let env = Env::new();
    let mut c = env.conn();
    assert_eq!(cmd(&mut c, &BIG).unwrap(), Value::Okay);
    let before = memory_field(&mut c, "lazyfreed_objects");
    let n: i64 = redis::cmd("UNLINK")
        .arg("member:big:bloom")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1);
    assert!(
        wait_until(Duration::from_secs(10), || memory_field(
            &mut c,
            "lazyfreed_objects"
        ) == before + 1),
        "the filter was not freed by the lazy-free thread"
    );
    // (used_memory is no witness: the set starts rebuilding its filter at once.)
    // The set falls through to the database and rebuilds itself.
    assert_eq!(int(&mut c, &["MEMBER.ADD", "big", "a"]), 1);
    assert_eq!(int(&mut c, &["MEMBER.EXISTS", "big", "a"]), 1);
}
