//! The sign-up example (`examples/signup`) in a real browser: PostgreSQL and valkey-server with
//! the module, the example's app.py on a free port, then its pytest suite drives Debian's
//! headless chromium through chromium-driver (`examples/signup/tests/test_browser.py`).
use crate::support;

use support::member::*;
use support::python::{self, Program};

/// Taken, available, a sign-up seen from a second browser session, a duplicate sign-up
/// refused, and two sign-ups at once of which exactly one wins.
#[test]
fn signup_page_in_a_browser() {
    // The operator's decision the example needs: its table may be attached.
    let env = Env::with(&[("member.attach-allow", "signup.users")]);
    let port = support::free_port();
    let mut app = Program::start(
        "examples/signup/app.py",
        &[
            format!("--port={port}"),
            format!("--pg={}", env.db.url()),
            format!("--valkey={}", env.vk.url()),
        ],
    );
    // pytest starts the browser while the app starts, and waits for the app to answer.
    let run = python::try_pytest(
        "examples/signup",
        &["test_browser.py"],
        &[
            ("SIGNUP_URL", format!("http://127.0.0.1:{port}/")),
            ("SIGNUP_PG", env.db.url()),
            // chromium-driver is given by path: never look for (or fetch) another.
            ("SE_OFFLINE", "true".to_string()),
        ],
    );
    if let Err(e) = run {
        panic!("{e}\napp.py's output:\n{}", app.log());
    }
    assert!(app.is_running(), "app.py stopped:\n{}", app.log());
}
