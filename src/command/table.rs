//! The one list of the module's commands: one row per command, read by registration
//! (`register.rs`: name, entry point, flags), COMMAND INFO (`declare.rs`: arity, routing key),
//! the `@member` ACL category (public rows), redaction (where the items sit) and the hot path
//! (MEMBER.EXISTS's raw entry point). A new command is one row here.

use std::os::raw::c_int;

use redis_module::{raw, Context, RedisResult, RedisString};

use super::declare::{Item, Route};
use super::{alter, batch, create, drop, exists, info, internal, lookup, rebuild, write};
use crate::redact::Shape;

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
}

/// MEMBER.EXISTS <set> <item> [SCOPE <scope>]: its raw entry point reads this row.
pub const EXISTS: Command = Command {
    name: "member.exists",
    run: Run::Raw(exists::entry),
    flags: "readonly fast",
    arity: -3,
    route: Route::ByItem(Item::Read),
    audience: Audience::Public,
    items: Some(Shape::Item),
};

/// Every command of the module. Per-item commands route by the item (argv[2]), the catalog
/// commands (CREATE, ALTER, DROP) by the set name (argv[1]), both declared NOT_KEY: never an
/// ACL key. INFO, REBUILD, MEXISTS, MADD and the internal commands declare no key and run on
/// any node (MEXISTS and MADD: many items, maybe of many slots; refused in cluster mode).
///
/// One row per line: a table reads better than rustfmt's one argument per line.
#[rustfmt::skip]
pub const COMMANDS: &[Command] = &[
    public("member.create", create::create, "write deny-oom", -2, Route::BySet(Item::Insert), None),
    public("member.alter", alter::alter, "write deny-oom", -3, Route::BySet(Item::Update), None),
    public("member.drop", drop::drop, "write", -2, Route::BySet(Item::Delete), None),
    public("member.add", write::add, "write deny-oom", -3, Route::ByItem(Item::Insert), Some(Shape::Item)),
    EXISTS,
    public("member.del", write::del, "write", -3, Route::ByItem(Item::Delete), Some(Shape::Item)),
    public("member.explain", lookup::explain, "readonly", -3, Route::ByItem(Item::Read), Some(Shape::Item)),
    public("member.mexists", batch::mexists, "readonly", -4, Route::Anywhere, Some(Shape::Many)),
    public("member.madd", batch::madd, "write deny-oom", -4, Route::Anywhere, Some(Shape::Many)),
    public("member.info", info::info, "readonly", 2, Route::Anywhere, None),
    public("member.rebuild", rebuild::rebuild, "write", -2, Route::Anywhere, None),
    internal("member._add", internal::add, "write deny-oom", 4),
    internal("member._del", internal::del, "write", 4),
    internal("member._load", internal::load, "write deny-oom", -3),
    internal("member._set", internal::set, "write", -7),
    internal("member._drop", internal::drop, "write", 2),
    internal("member._own", internal::own, "write", 2),
];

/// The row of a command name as a client spelled it (any case).
pub fn find(name: &[u8]) -> Option<&'static Command> {
    COMMANDS
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

const fn public(
    name: &'static str,
    f: fn(&Context, Vec<RedisString>) -> RedisResult,
    flags: &'static str,
    arity: i32,
    route: Route,
    items: Option<Shape>,
) -> Command {
    Command {
        name,
        run: Run::Args(f),
        flags,
        arity,
        route,
        audience: Audience::Public,
        items,
    }
}

/// A replication and AOF command: no routing key, not in `@member`, run without redaction.
const fn internal(
    name: &'static str,
    f: fn(&Context, Vec<RedisString>) -> RedisResult,
    flags: &'static str,
    arity: i32,
) -> Command {
    Command {
        name,
        run: Run::Args(f),
        flags,
        arity,
        route: Route::Anywhere,
        audience: Audience::Internal,
        items: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_lower_case_and_found_in_any_case() {
        for (i, c) in COMMANDS.iter().enumerate() {
            assert_eq!(c.name, c.name.to_ascii_lowercase());
            assert!(c.name.starts_with("member."), "{}", c.name);
            assert!(COMMANDS[..i].iter().all(|d| d.name != c.name), "{}", c.name);
            assert_eq!(
                find(c.name.to_ascii_uppercase().as_bytes()).unwrap().name,
                c.name
            );
        }
        assert!(find(b"member.nope").is_none());
    }

    #[test]
    fn internal_commands_are_the_underscored_ones() {
        for c in COMMANDS {
            assert_eq!(
                c.name.starts_with("member._"),
                c.audience == Audience::Internal,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn only_exists_has_an_entry_point_of_its_own() {
        for c in COMMANDS {
            assert_eq!(
                matches!(c.run, Run::Raw(_)),
                c.name == EXISTS.name,
                "{}",
                c.name
            );
        }
    }
}
