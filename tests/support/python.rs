//! Python from the tests: the virtualenv `target/pyenv` (made once per process by
//! `scripts/python-env.sh`), pytest runs in it, and Python programs the tests start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use super::process::{set_pdeathsig, spawn};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The virtualenv's interpreter, the virtualenv made first if missing or out of date.
pub fn python() -> PathBuf {
    static MADE: OnceLock<Result<(), String>> = OnceLock::new();
    let made = MADE.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("scripts/python-env.sh"))
            .output()
            .map_err(|e| format!("run scripts/python-env.sh: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/python-env.sh failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = made {
        panic!("{e}");
    }
    root().join("target/pyenv/bin/python")
}

/// Runs pytest in `project` (a folder of the repository) on `selection` (paths or node ids
/// under its `tests/`) with `env`; panics with pytest's output unless every selected test ran
/// and passed.
pub fn pytest(project: &str, selection: &[&str], env: &[(&str, String)]) {
    if let Err(e) = try_pytest(project, selection, env) {
        panic!("{e}");
    }
}

/// [`pytest`], its failure (with pytest's output) returned rather than raised.
pub fn try_pytest(project: &str, selection: &[&str], env: &[(&str, String)]) -> Result<(), String> {
    let dir = root().join(project);
    let out = Command::new(python())
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"])
        .args(selection.iter().map(|s| dir.join("tests").join(s)))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&dir)
        .output()
        .map_err(|e| format!("run pytest: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("pytest {selection:?} failed:\n{text}"));
    }
    let summary = text
        .lines()
        .rev()
        .find(|l| l.contains(" in "))
        .unwrap_or("");
    if !summary.contains(" passed") || summary.contains("skipped") {
        return Err(format!(
            "pytest {selection:?}: every test must run and pass:\n{text}"
        ));
    }
    // Captured by the test harness; `-- --nocapture` shows what the tests printed (-rA).
    println!("pytest {selection:?}: {summary}\n{text}");
    Ok(())
}

/// A Python program of the repository running in the virtualenv; killed when dropped (and
/// when the test process dies).
pub struct Program {
    child: Child,
    log: PathBuf,
}

impl Program {
    /// Starts `script` (a path in the repository) with `args`; its output goes to a file
    /// that [`Program::log`] reads.
    pub fn start(script: &str, args: &[String]) -> Program {
        let log = std::env::temp_dir().join(format!(
            "member-py-{}-{}.log",
            std::process::id(),
            super::process::unique()
        ));
        let file = std::fs::File::create(&log).expect("create the program's log");
        let mut cmd = Command::new(python());
        cmd.arg(root().join(script))
            .args(args)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        set_pdeathsig(&mut cmd, libc::SIGKILL);
        let child = spawn(cmd).unwrap_or_else(|e| panic!("start {script}: {e}"));
        Program { child, log }
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What it printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
