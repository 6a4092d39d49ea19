//! The running command's redaction flag: raised wherever a tokenized set's items are touched
//! (however deep), read once by the command filter (`hooks::redact`) when the command ends.
//! A thread-local flag: commands run on the main thread one at a time.

use std::cell::Cell;

thread_local! {
    /// Raised by the running command when its items must not be shown; cleared at its start.
    static NEEDED: Cell<bool> = const { Cell::new(false) };
}

/// Marks the running command's item arguments for redaction (cheap: a thread-local flag).
pub fn needed() {
    NEEDED.with(|n| n.set(true));
}

/// Clears the flag before a command runs.
pub fn clear() {
    NEEDED.with(|n| n.set(false));
}

/// Whether the command that just ran raised the flag; clears it.
pub fn take() -> bool {
    NEEDED.with(|n| n.replace(false))
}
