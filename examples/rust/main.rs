//! The `members` example: libmember's first calls from Rust, printed.
//! `cargo run --example members -- [redis://127.0.0.1:6380/] [set]` against one server
//! (`make run` serves 6380), `cargo run --example members -- --cluster redis://127.0.0.1:7001/`
//! against a cluster (`make cluster`).

mod members;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cluster = args.first().is_some_and(|a| a == "--cluster");
    let args = &args[usize::from(cluster)..];
    let default_url = if cluster {
        "redis://127.0.0.1:7001/"
    } else {
        "redis://127.0.0.1:6380/"
    };
    let url = args.first().map_or(default_url, String::as_str);
    let set = args.get(1).map_or("users", String::as_str);
    let answer = if cluster {
        redis::cluster::ClusterClient::new(vec![url])
            .and_then(|client| client.get_connection())
            .and_then(|mut con| {
                members::retrying(3, || {
                    members::cluster_calls(&mut con, set, &["alice", "bob"], &["ALICE", "carol"])
                })
            })
            .map(|(added, found)| {
                format!("added alice bob: {added:?}\nexists ALICE carol: {found:?}")
            })
    } else {
        redis::Client::open(url)
            .and_then(|client| client.get_connection())
            .and_then(|mut con| members::retrying(3, || members::first_calls(&mut con, set)))
            .map(|answers| format!("{answers:?}"))
    };
    match answer {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) if members::is_unavailable(&e) => {
            eprintln!("unavailable, try again later: {e}");
            ExitCode::from(75)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
