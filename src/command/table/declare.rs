//! What COMMAND INFO and COMMAND DOCS show of each row of the command table (`mod.rs`)
//! beyond its name and flags: its arity, its cluster routing key (the item, argv[2], for the
//! per-item commands; the set name, argv[1], for the catalog commands) and its documentation
//! (`docs.rs`). The only room that calls `RedisModule_SetCommandInfo`; docs/cluster.md says why
//! both keys are declared `NOT_KEY`.

use std::ffi::{CString, NulError};
use std::mem::MaybeUninit;
use std::os::raw::{c_char, c_int};
use std::ptr;

use redis_module::{raw, Context};

use crate::command::table::docs::{Arg, Docs, Kind, SINCE};
use crate::command::table::row::{Command, Item, Route};
use crate::server::reply::{self, Level};

/// argv position of the item in `MEMBER.ADD|EXISTS|DEL|EXPLAIN <set> <item> …`.
pub const ITEM_POS: c_int = 2;
/// argv position of the set name in `MEMBER.CREATE|ALTER|DROP <set> …`.
pub const SET_POS: c_int = 1;

/// Key-spec flags for the item: one access flag (the server requires exactly one of RO, RW,
/// OW, RM), the kind of write, and `NOT_KEY`, which is what keeps it out of ACL key checks.
pub fn item_flags(item: Item) -> u64 {
    let access = match item {
        Item::Read => raw::REDISMODULE_CMD_KEY_RO,
        Item::Insert => raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_INSERT,
        Item::Update => raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
        Item::Delete => raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    };
    u64::from(access | raw::REDISMODULE_CMD_KEY_NOT_KEY)
}

const VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
};

/// The all-zero key spec: the list terminator (begin_search_type INVALID), and the blank the
/// item's spec is filled into.
fn zeroed_spec() -> raw::RedisModuleCommandKeySpec {
    // SAFETY: the struct holds a pointer, integers and unions of integers: all-zero is valid.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// `[spec, terminator]`: one key at the route's argv position, a range of one.
fn route_specs(route: Route) -> Option<[raw::RedisModuleCommandKeySpec; 2]> {
    let (pos, access, notes) = match route {
        Route::Anywhere => return None,
        Route::ByItem(item) => (
            ITEM_POS,
            item,
            c"the item: routed like a key (its cluster slot), but not a key: no ACL check, not in GETKEYS",
        ),
        Route::BySet(access) => (
            SET_POS,
            access,
            c"the set name: routed like a key (its cluster slot), but not a key: no ACL check, not in GETKEYS",
        ),
    };
    let mut spec = zeroed_spec();
    spec.notes = notes.as_ptr();
    spec.flags = item_flags(access);
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = pos;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    spec.fk.range.lastkey = 0;
    spec.fk.range.keystep = 1;
    spec.fk.range.limit = 0;
    Some([spec, zeroed_spec()])
}

/// Declares arity, routing and documentation (COMMAND DOCS: summary, since, complexity,
/// arguments) of every command in `commands`, all already created (`register.rs`). A server
/// that refuses the documentation gets the arity and routing alone, and the refusal is
/// logged. Any other failure is logged and loading goes on: the command then keeps arity -1
/// and no routing key, and the item never becomes an ACL key (commands are created with
/// firstkey 0).
pub fn declare(ctx: &Context, commands: &[Command]) {
    for info in commands {
        if let Err(e) = set(ctx, info) {
            reply::log(
                ctx,
                Level::Warning,
                &format!(
                    "libmember: could not declare arity and routing of {}: {e}",
                    info.name
                ),
            );
        }
    }
}

fn set(ctx: &Context, info: &Command) -> Result<(), String> {
    // SAFETY: reading a function pointer the server filled in before OnLoad.
    let Some(get) = (unsafe { raw::RedisModule_GetCommand }) else {
        return Err("this server has no RedisModule_GetCommand (Redis 7.0+ or Valkey)".into());
    };
    let name = CString::new(info.name).map_err(|e| e.to_string())?;
    // SAFETY: called from OnLoad with the module's context; name is NUL-terminated.
    let cmd = unsafe { get(ctx.ctx, name.as_ptr()) };
    if cmd.is_null() {
        return Err("no such command".into());
    }
    let docs = RawDocs::of(&info.docs).map_err(|e| e.to_string())?;
    // SAFETY: cmd was just looked up among this module's commands, during OnLoad, and `declare`
    // visits each command once; a refused call sets nothing (the server checks everything
    // first), so the second call below is still the first that takes.
    match unsafe { set_command_info(cmd, info, Some(&docs)) } {
        Ok(()) => Ok(()),
        Err(e) => {
            reply::log(
                ctx,
                Level::Warning,
                &format!(
                    "libmember: COMMAND DOCS of {} refused, declared without them: {e}",
                    info.name
                ),
            );
            // SAFETY: as above.
            unsafe { set_command_info(cmd, info, None) }
        }
    }
}

/// A command's documentation as the module API takes it: C strings and NULL-terminated
/// argument arrays, owned here and alive as long as this value (the server copies them).
struct RawDocs {
    summary: CString,
    complexity: Option<CString>,
    since: CString,
    args: RawArgs,
}

struct RawArgs {
    /// The names, tokens and display texts the entries point into.
    _strings: Vec<CString>,
    /// The one-ofs' and blocks' own arrays, which entries' `subargs` point into.
    _inner: Vec<RawArgs>,
    /// The entries, then the all-zero terminator (no name).
    entries: Vec<raw::RedisModuleCommandArg>,
}

impl RawDocs {
    fn of(docs: &Docs) -> Result<RawDocs, NulError> {
        Ok(RawDocs {
            summary: CString::new(docs.summary)?,
            complexity: docs.complexity.map(CString::new).transpose()?,
            since: CString::new(SINCE)?,
            args: RawArgs::of(docs.args)?,
        })
    }
}

impl RawArgs {
    fn of(args: &[Arg]) -> Result<RawArgs, NulError> {
        let mut strings = Vec::new();
        let mut inner = Vec::new();
        let mut entries = Vec::with_capacity(args.len() + 1);
        let mut keep = |s: &str| -> Result<*const c_char, NulError> {
            let c = CString::new(s)?;
            // The heap buffer stays where it is when the CString moves into the vector.
            let p = c.as_ptr();
            strings.push(c);
            Ok(p)
        };
        for a in args {
            // SAFETY: pointers, integers and an enum whose 0 is STRING: all-zero is valid.
            let mut e: raw::RedisModuleCommandArg = unsafe { MaybeUninit::zeroed().assume_init() };
            e.name = keep(a.name)?;
            e.type_ = match a.kind {
                Kind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                Kind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                Kind::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
                Kind::UnixTime => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
                Kind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                Kind::OneOf(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                Kind::Block(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            };
            // No argument is a key: the routing arguments are NOT_KEY (see the top).
            e.key_spec_index = -1;
            if let Some(t) = a.token {
                e.token = keep(t)?;
            }
            if let Some(d) = a.display {
                e.display_text = keep(d)?;
            }
            let mut flags = raw::REDISMODULE_CMD_ARG_NONE;
            if a.optional {
                flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
            }
            if a.multiple {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
            }
            e.flags = flags as c_int;
            if let Some(of) = a.inner() {
                let mut sub = RawArgs::of(of)?;
                // The vector's buffer stays where it is when `sub` moves into `inner`.
                e.subargs = sub.entries.as_mut_ptr();
                inner.push(sub);
            }
            entries.push(e);
        }
        // SAFETY: as above; a NULL name ends the array.
        entries.push(unsafe { MaybeUninit::zeroed().assume_init() });
        Ok(RawArgs {
            _strings: strings,
            _inner: inner,
            entries,
        })
    }
}

/// Hands `info` (with `docs`, if given) to `RedisModule_SetCommandInfo`.
///
/// # Safety
/// `cmd` is a live command this module created, whose info has not been set yet (the server
/// refuses a second call with EEXIST and keeps the first). Everything passed is borrowed for
/// the call only: the server copies what it keeps.
unsafe fn set_command_info(
    cmd: *mut raw::RedisModuleCommand,
    info: &Command,
    docs: Option<&RawDocs>,
) -> Result<(), String> {
    // SAFETY: reading a function pointer the server filled in before OnLoad.
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return Err("this server has no RedisModule_SetCommandInfo (Redis 7.0+ or Valkey)".into());
    };
    let mut specs = route_specs(info.route);
    let c_info = raw::RedisModuleCommandInfo {
        version: &VERSION,
        summary: docs.map_or(ptr::null(), |d| d.summary.as_ptr()),
        complexity: docs
            .and_then(|d| d.complexity.as_ref())
            .map_or(ptr::null(), |c| c.as_ptr()),
        since: docs.map_or(ptr::null(), |d| d.since.as_ptr()),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: info.arity,
        // NULL leaves the key specs as created (none, firstkey 0).
        key_specs: specs.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
        // The server only reads them (it copies the array); the API's pointer is not const.
        args: docs.map_or(ptr::null_mut(), |d| d.args.entries.as_ptr().cast_mut()),
    };
    // SAFETY: cmd per this function's contract; c_info, the specs (terminated by an all-zero
    // one), the notes literal and the documentation outlive the call.
    let rc = unsafe { set_info(cmd, &c_info) };
    if rc == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(format!(
            "RedisModule_SetCommandInfo refused it ({})",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_is_always_not_key_with_exactly_one_access_flag() {
        let access = u64::from(
            raw::REDISMODULE_CMD_KEY_RO
                | raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_OW
                | raw::REDISMODULE_CMD_KEY_RM,
        );
        let writes = u64::from(
            raw::REDISMODULE_CMD_KEY_INSERT
                | raw::REDISMODULE_CMD_KEY_DELETE
                | raw::REDISMODULE_CMD_KEY_UPDATE,
        );
        for item in [Item::Read, Item::Insert, Item::Update, Item::Delete] {
            let f = item_flags(item);
            assert_ne!(f & u64::from(raw::REDISMODULE_CMD_KEY_NOT_KEY), 0);
            assert!((f & access).is_power_of_two(), "{item:?}");
            assert!(
                f & writes == 0 || (f & writes).is_power_of_two(),
                "{item:?}"
            );
        }
        assert_eq!(item_flags(Item::Read) & writes, 0);
    }

    #[test]
    fn item_spec_is_one_key_at_argv_2_then_the_terminator() {
        assert!(route_specs(Route::Anywhere).is_none());
        let [set, _] = route_specs(Route::BySet(Item::Insert)).unwrap();
        // SAFETY: reading the union field route_specs wrote.
        assert_eq!(unsafe { set.bs.index.pos }, 1);
        let [spec, end] = route_specs(Route::ByItem(Item::Read)).unwrap();
        assert_eq!(
            spec.begin_search_type,
            raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX
        );
        // SAFETY: reading the union fields item_specs wrote.
        unsafe {
            assert_eq!(spec.bs.index.pos, 2);
            assert_eq!(spec.fk.range.lastkey, 0);
            assert_eq!(spec.fk.range.keystep, 1);
        }
        assert_eq!(end.begin_search_type, 0);
        assert!(end.notes.is_null());
    }
}
