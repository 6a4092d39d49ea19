//! Per-set access control with ordinary ACL rules: a command on set `S` needs the calling
//! user's key permission on the name `member:S` (read for EXISTS, EXPLAIN and INFO; write
//! for ADD, DEL, CREATE, ALTER, REBUILD and DROP), so `~member:usernames*` grants one set and
//! not the others. The only room that touches the raw ACL API; commands also join the `@member`
//! category where the server lets modules add one.

use std::os::raw::c_int;

use redis_module::{raw, Context, RedisError, RedisString};

pub mod cache;

pub use crate::model::set_def::acl_key;
pub use cache::Access;

/// The refusal a user without the permission gets (standard `NOPERM` prefix).
pub fn refusal(set: &str, access: Access) -> String {
    let what = match access {
        Access::Read => "read",
        Access::Write => "write",
    };
    format!(
        "NOPERM this user may not {what} set '{set}' (needs ACL key permission on '{}')",
        acl_key(set)
    )
}

/// Refuses the call unless the calling user may `access` `set`. Calls without a user (the
/// replication link, the AOF, the module itself) and servers without the ACL module API pass.
pub fn check_set(ctx: &Context, set: &str, access: Access) -> Result<(), RedisError> {
    if !crate::config::ACL_SETS.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    // SAFETY: the API pointers are set at load (None on a server without them); every object
    // created here is freed before returning; ctx is the live command context.
    unsafe {
        let (Some(current), Some(from_name), Some(check), Some(free_user), Some(free_str)) = (
            raw::RedisModule_GetCurrentUserName,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckKeyPermissions,
            raw::RedisModule_FreeModuleUser,
            raw::RedisModule_FreeString,
        ) else {
            return Ok(());
        };
        let name = current(ctx.ctx);
        if name.is_null() {
            return Ok(());
        }
        let mut len = 0;
        let p = raw::RedisModule_StringPtrLen.unwrap()(name, &mut len);
        let user_name = std::slice::from_raw_parts(p.cast::<u8>(), len);
        let client = raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx));
        if client != 0 && cache::granted(client, user_name, set, access) {
            free_str(ctx.ctx, name);
            return Ok(());
        }
        let user = from_name(name);
        if user.is_null() {
            free_str(ctx.ctx, name);
            // The user was deleted while its client stayed connected: no permission at all.
            return Err(RedisError::String(refusal(set, access)));
        }
        // The API takes the key-spec *operation* flags (RO/RW are refused with EINVAL):
        // ACCESS needs read permission on the key, UPDATE write permission.
        let flags = match access {
            Access::Read => raw::REDISMODULE_CMD_KEY_ACCESS,
            Access::Write => raw::REDISMODULE_CMD_KEY_UPDATE,
        } as c_int;
        // The set's ACL name, made once per known set; a name this node does not know yet
        // (the catalog may still have it) gets a temporary one.
        let ok = crate::sets::state::with(|r| {
            r.sets
                .get(set)
                .map(|s| check(user, s.acl_key.inner, flags) == raw::REDISMODULE_OK as c_int)
        })
        .unwrap_or_else(|| {
            let key = RedisString::create(None, acl_key(set));
            check(user, key.inner, flags) == raw::REDISMODULE_OK as c_int
        });
        free_user(user);
        if ok && client != 0 {
            cache::remember(client, user_name, set, access);
        }
        free_str(ctx.ctx, name);
        if ok {
            Ok(())
        } else {
            Err(RedisError::String(refusal(set, access)))
        }
    }
}

/// Puts every command in `commands` into the `@member` ACL category, where the server lets
/// modules add categories (Valkey 8 does; Redis 7.0 does not: there the commands carry the
/// built-in categories their flags give, `@read`/`@write`, `@fast`/`@slow`; docs/security.md).
/// Returns whether the category exists.
pub fn declare_category(ctx: &Context, commands: &[&str]) -> bool {
    // SAFETY: module load, main thread; names are NUL-terminated; commands exist (registered
    // before this runs).
    unsafe {
        let (Some(add), Some(get), Some(set)) = (
            raw::RedisModule_AddACLCategory,
            raw::RedisModule_GetCommand,
            raw::RedisModule_SetCommandACLCategories,
        ) else {
            return false;
        };
        if add(ctx.ctx, c"member".as_ptr()) != raw::REDISMODULE_OK as c_int {
            return false;
        }
        for name in commands {
            let Ok(cname) = std::ffi::CString::new(*name) else {
                continue;
            };
            let cmd = get(ctx.ctx, cname.as_ptr());
            if cmd.is_null() || set(cmd, c"member".as_ptr()) != raw::REDISMODULE_OK as c_int {
                crate::server::reply::log(
                    ctx,
                    crate::server::reply::Level::Warning,
                    &format!("libmember: could not put {name} into the @member ACL category"),
                );
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_names_the_set_and_the_key() {
        assert_eq!(
            refusal("cards", Access::Write),
            "NOPERM this user may not write set 'cards' (needs ACL key permission on 'member:cards')"
        );
    }
}
