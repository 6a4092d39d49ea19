//! Node.js from the tests: the Node example's dependencies (installed once per process by
//! `scripts/node-env.sh`) and its scripts run to completion under a time limit.

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

/// Makes sure `examples/node/node_modules` holds the locked dependencies; panics with the
/// script's output if it cannot.
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
