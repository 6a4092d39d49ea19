//! The Node (ioredis) and Rust (`redis` crate) snippets of docs/clients.md, run as they are
//! shipped: `examples/node` against a standalone server, one whose PostgreSQL this test stops,
//! and the shared cluster; `examples/rust/members.rs` (also the `members` example) called
//! directly against the same three; and the page's quotes of both checked against those files.
use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support;

use support::cluster::Cluster;
use support::member::*;
use support::node;
use support::OwnPg;

/// The Rust snippet, compiled into this binary so the test always runs the current code.
#[path = "../../examples/rust/members.rs"]
mod members;

/// Each script's limit: a run takes well under a second; a hung one fails the test.
const NODE_LIMIT: Duration = Duration::from_secs(30);

fn run_node(script: &str, args: &[String]) -> node::Finished {
    node::run(&format!("examples/node/{script}"), args, NODE_LIMIT)
}

/// A server whose PostgreSQL is then stopped: the set `users` holds alice, and the database
/// timeout is 500 ms (the set was made under the default, which a busy machine may need).
fn server_losing_its_database() -> (OwnPg, support::Valkey) {
    let pg = OwnPg::start_new();
    let vk = start_loaded(&pg.url(), &[]);
    let mut c = vk.conn();
    ok(&mut c, &["MEMBER.CREATE", "users", "NORMALIZE", "username"]);
    assert_eq!(int(&mut c, &["MEMBER.ADD", "users", "alice"]), 1);
    ok(&mut c, &["CONFIG", "SET", "member.db-timeout-ms", "500"]);
    (pg, vk)
}

/// standalone.js: every answer of the README's first calls, exit 0.
#[test]
fn node_standalone() {
    let env = Env::new();
    let run = run_node("standalone.js", &[env.vk.url(), "users".into()]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout,
        "added alice: true\nexists ALICE: true\nexists bob: false\nmexists alice bob: [true,false]\n",
        "{run:?}"
    );
}

/// standalone.js with PostgreSQL stopped: the UNAVAILABLE reply is tried three times, then
/// reported as "try again later" (exit 75), never as an answer.
#[test]
fn node_unavailable_is_retried_then_reported() {
    let (mut pg, vk) = server_losing_its_database();
    pg.stop();
    let run = run_node("standalone.js", &[vk.url(), "users".into()]);
    assert_eq!(run.code, Some(75), "{run:?}");
    assert_eq!(run.stdout, "", "no answer may be printed: {run:?}");
    for line in ["try 2 of 3 in 200 ms", "try 3 of 3 in 400 ms"] {
        assert!(run.stderr.contains(line), "{line:?} missing: {run:?}");
    }
    assert!(
        run.stderr
            .contains("unavailable, try again later: UNAVAILABLE "),
        "{run:?}"
    );
}

/// cluster.js from a replica's address: through the libmember package CREATE goes to the set
/// name's primary and every per-item call to its item's, and MEMBER.INFO reaches every
/// primary (their slots add up to all 16384).
#[test]
fn node_cluster() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    // Every node knows the set before the script's own CREATE (which then finds it there):
    // a node that learns of it only at its first call answers TRYAGAIN until then, and
    // ioredis retries that for 1.6 s only, too short on a busy machine.
    cl.create_everywhere_with("snippet_node", &["NORMALIZE", "username"]);
    let replica = cl.replicas().next().expect("a replica");
    let run = run_node("cluster.js", &[replica.addr(), "snippet_node".into()]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout,
        "added alice bob carol: [true,true,true]\nexists ALICE Bob dave: [true,true,false]\n\
         slots owned by the 3 primaries: 16384\n",
        "{run:?}"
    );
}

/// members::first_calls on one server, through members::retrying.
#[test]
fn rust_standalone() {
    let env = Env::new();
    let mut con = env.conn();
    let answers =
        members::retrying(3, || members::first_calls(&mut con, "users")).expect("the first calls");
    assert_eq!(
        answers,
        members::Answers {
            added: true,
            taken: true,
            bob: false,
            both: vec![true, false],
        }
    );
}

/// members::retrying with PostgreSQL stopped: UNAVAILABLE is tried again until the third
/// try and then returned, recognized by members::is_unavailable; any other error (here an
/// empty item) is returned at the first try.
#[test]
fn rust_unavailable_is_retried_then_returned() {
    let (mut pg, vk) = server_losing_its_database();
    let mut con = vk.conn();
    pg.stop();
    let mut tries = 0;
    let started = Instant::now();
    let err = members::retrying(3, || {
        tries += 1;
        members::first_calls(&mut con, "users")
    })
    .expect_err("no answer without PostgreSQL");
    assert!(members::is_unavailable(&err), "{err}");
    assert_eq!(tries, 3, "{err}");
    assert!(started.elapsed() >= Duration::from_millis(600), "no pause");

    let mut tries = 0;
    let err = members::retrying(3, || {
        tries += 1;
        redis::cmd("MEMBER.EXISTS")
            .arg(&["users", ""])
            .query::<bool>(&mut con)
    })
    .expect_err("an empty item");
    assert!(!members::is_unavailable(&err), "{err}");
    assert_eq!(tries, 1, "{err}");
}

/// members::cluster_calls through the crate's cluster client started from a replica.
#[test]
fn rust_cluster() {
    let held = Cluster::shared();
    let cl: &Cluster = &held;
    // As for the Node script: every node knows the set before the calls.
    cl.create_everywhere_with("snippet_rust", &["NORMALIZE", "username"]);
    let replica = cl.replicas().next().expect("a replica");
    let client = redis::cluster::ClusterClient::new(vec![replica.vk.url()]).unwrap();
    let mut con = client.get_connection().expect("a cluster connection");
    let (added, found) = members::retrying(3, || {
        members::cluster_calls(
            &mut con,
            "snippet_rust",
            &["alice", "bob", "carol"],
            &["ALICE", "Bob", "dave"],
        )
    })
    .expect("the cluster calls");
    assert_eq!(added, [true, true, true]);
    assert_eq!(found, [true, true, false]);
}

/// The lines of a page's fenced blocks marked `lang`.
fn fenced_blocks(page: &str, lang: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut inside = false;
    for line in page.lines() {
        if inside && line.trim_end() == "```" {
            inside = false;
        } else if inside {
            lines.push(line.to_string());
        } else if line.trim_end() == format!("```{lang}") {
            inside = true;
        }
    }
    lines
}

/// The Node and Rust snippets of docs/clients.md (and of the README, should it quote any) are
/// quotes of the files tested above: every line of their `js` and `rust` blocks is a line of
/// `examples/node/*.js` or `examples/rust/*.rs` (compared without indentation; `// …` marks
/// what a quote leaves out).
#[test]
fn client_docs_quote_the_tested_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |page: &str| fs::read_to_string(root.join(page)).expect(page);
    let (clients, readme) = (read("docs/clients.md"), read("README.md"));
    for (lang, dir, ext) in [
        ("js", "examples/node", "js"),
        ("rust", "examples/rust", "rs"),
    ] {
        let mut known = HashSet::new();
        for entry in fs::read_dir(root.join(dir)).expect("list the examples") {
            let path = entry.expect("an example").path();
            if path.extension().is_some_and(|e| e == ext) {
                let text = fs::read_to_string(&path).expect("read an example");
                known.extend(text.lines().map(|l| l.trim().to_string()));
            }
        }
        let quoted = fenced_blocks(&clients, lang);
        assert!(
            quoted.len() >= 10,
            "docs/clients.md quotes no {lang} snippet"
        );
        let quoted = [quoted, fenced_blocks(&readme, lang)].concat();
        for line in quoted.iter().map(|l| l.trim()) {
            if line.is_empty() || line.starts_with("// …") {
                continue;
            }
            assert!(
                known.contains(line),
                "a quoted {lang} line is not in {dir}: {line:?}"
            );
        }
    }
}
