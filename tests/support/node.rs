//! Node.js from the tests: the Node example's and the Node package's dependencies (installed
//! once per process by `scripts/node-env.sh`), scripts run to completion under a time limit,
//! and `node --test` runs of the package's tests.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::process::{set_pdeathsig, spawn, unique, wait_until};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What a finished script left: its exit code and its two outputs.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Makes sure `examples/node/node_modules` and `clients/node/node_modules` hold the locked
/// dependencies; panics with the script's output if it cannot.
fn installed() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let done = DONE.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("scripts/node-env.sh"))
            .output()
            .map_err(|e| format!("run scripts/node-env.sh: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/node-env.sh failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = done {
        panic!("{e}");
    }
}

/// Runs `node <script> <args>` (`script` a path in the repository) until it exits; panics
/// if it is still running after `limit` (it is then killed).
pub fn run(script: &str, args: &[String], limit: Duration) -> Finished {
    installed();
    let base = std::env::temp_dir().join(format!("member-node-{}", unique()));
    let (out_path, err_path) = (base.with_extension("out"), base.with_extension("err"));
    let mut cmd = Command::new("node");
    cmd.arg(root().join(script))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("create the stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("create the stderr file"));
    set_pdeathsig(&mut cmd, libc::SIGKILL);
    let mut child = spawn(cmd).unwrap_or_else(|e| panic!("start node {script}: {e}"));
    let mut status = None;
    let exited = wait_until(limit, || {
        status = child.try_wait().expect("wait for node");
        status.is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let finished = Finished {
        code: status.and_then(|s| s.code()),
        stdout: read(&out_path),
        stderr: read(&err_path),
    };
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    assert!(
        exited,
        "node {script} still running after {limit:?}: {finished:?}"
    );
    finished
}

/// Runs `node --test` on `files` (paths under `project`, a folder of the repository) with
/// `env`, from that folder; panics with the run's output unless every test ran and passed
/// (none failed, skipped, cancelled or left to do, and at least one passed). Returns the
/// run's standard output (TAP), whose `#` lines the tests may use to report figures.
pub fn node_test(project: &str, files: &[&str], env: &[(&str, String)], limit: Duration) -> String {
    installed();
    let dir = root().join(project);
    let mut args = vec![
        "--test".to_string(),
        "--test-reporter=tap".to_string(),
        "--test-concurrency=1".to_string(),
        // A client left open by a failed test must not keep the run alive.
        "--test-force-exit".to_string(),
    ];
    args.extend(files.iter().map(|f| dir.join(f).display().to_string()));
    let base = std::env::temp_dir().join(format!("member-node-test-{}", unique()));
    let (out_path, err_path) = (base.with_extension("out"), base.with_extension("err"));
    let mut cmd = Command::new("node");
    cmd.args(&args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("create the stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("create the stderr file"));
    set_pdeathsig(&mut cmd, libc::SIGKILL);
    let mut child = spawn(cmd).unwrap_or_else(|e| panic!("start node --test: {e}"));
    let mut status = None;
    let exited = wait_until(limit, || {
        status = child.try_wait().expect("wait for node");
        status.is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let (stdout, stderr) = (read(&out_path), read(&err_path));
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    let text = format!("{stdout}{stderr}");
    assert!(
        exited,
        "node --test {files:?} still running after {limit:?}:\n{text}"
    );
    let count = |name: &str| -> Option<u64> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# {name} ")))
            .and_then(|n| n.trim().parse().ok())
    };
    let ok = status.is_some_and(|s| s.success())
        && count("pass").is_some_and(|n| n > 0)
        && ["fail", "cancelled", "skipped", "todo"]
            .iter()
            .all(|k| count(k) == Some(0));
    assert!(
        ok,
        "node --test {files:?}: every test must run and pass:\n{text}"
    );
    println!(
        "node --test {files:?}: {} passed",
        count("pass").unwrap_or_default()
    );
    stdout
}
