//! One row of the command table (`mod.rs`): how the server reaches the command, who may call
//! it, how a cluster routes it, where its items sit and what COMMAND DOCS shows. The types
//! only; `declare.rs` turns a row into COMMAND INFO and COMMAND DOCS, `register.rs` registers it.

use std::os::raw::c_int;

use redis_module::{raw, Context, RedisResult, RedisString};

use crate::command::table::docs::{Arg, Docs};
use crate::hooks::redact::Shape;

/// How the server reaches a command's code.
#[derive(Clone, Copy)]
pub enum Run {
    /// The generic entry point (`register.rs`): arguments as strings, the reply sent by
    /// `reply::guard`, items redacted per the row's `items`.
    Args(fn(&Context, Vec<RedisString>) -> RedisResult),
    /// An entry point of its own that reads its arguments in place (the hot path). It runs
    /// `reply::guard` and redaction itself, with its row's `items`.
    Raw(
        unsafe extern "C" fn(
            *mut raw::RedisModuleCtx,
            *mut *mut raw::RedisModuleString,
            c_int,
        ) -> c_int,
    ),
}

/// Who may call a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Clients: in the `@member` ACL category, in docs/commands.md.
    Public,
    /// The replication stream and the AOF only (`MEMBER._*`).
    Internal,
}

/// One command.
#[derive(Clone, Copy)]
pub struct Command {
    /// As registered and as COMMAND INFO shows it: lower case.
    pub name: &'static str,
    pub run: Run,
    /// The server's command flags.
    pub flags: &'static str,
    /// As COMMAND INFO reports it: `n` exactly n arguments (the name counted), `-n` at least n.
    pub arity: i32,
    pub route: Route,
    pub audience: Audience,
    /// Where the command's items sit, for redaction; `None` for commands that carry none.
    pub items: Option<Shape>,
    /// What COMMAND DOCS shows.
    pub docs: Docs,
}

impl Command {
    /// The row with its documentation.
    pub const fn doc(
        mut self,
        summary: &'static str,
        complexity: Option<&'static str>,
        args: &'static [Arg],
    ) -> Command {
        self.docs = Docs {
            summary,
            complexity,
            args,
        };
        self
    }
}

/// What rows start with before `doc`: nothing (a unit test finds a row left so).
pub const UNDOCUMENTED: Docs = Docs {
    summary: "",
    complexity: None,
    args: &[],
};

/// What a command does with what its routing argument names (the key spec's access flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    Read,
    Insert,
    Update,
    Delete,
}

/// How a command is routed in a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Set-wide: declares no key (firstkey 0), so any node runs it.
    Anywhere,
    /// By the item at argv[2]: one `NOT_KEY` key spec. The server routes by it (MOVED/ASK) and
    /// COMMAND INFO shows it (first/last/step 2/2/1); ACL and COMMAND GETKEYS skip it.
    ByItem(Item),
    /// By the set name at argv[1], the same way (1/1/1): the catalog commands, whose answer is
    /// the same on every node, so any cluster client can send them.
    BySet(Item),
}
