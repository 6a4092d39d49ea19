//! Every `member.*` config: registered at module load, given its value from the server's
//! configuration (`--member.workers 8`, `MODULE LOADEX … CONFIG …`, or the module's own
//! arguments, `--loadmodule libmember.so workers 8`), and checked before anything starts.
//!
//! A value the server refuses (out of range, not a number) fails the module load, so the
//! server either refuses to start with the reason in its log, or answers MODULE LOAD with an
//! error and keeps running. The `redis_module!` macro's own registration ignores the result
//! of the server's LoadConfigs: the load then went on, the server found the configs unset and
//! tried to unload a module that exports a data type, and Valkey 8.0.1 crashes on that path
//! (`moduleUnload` writes its refusal through a null pointer; Redis 7.0.15 survives it).
//! Hence no thread or timer of libmember may start before this has succeeded (what the
//! server registered for the module by then, it removes itself): the config callbacks below
//! do nothing until `db::pool::start` and `notify::started` run at the end of the load.
//!
//! The module's own arguments are checked here too (`module_args`): an unknown name, a name
//! without its value or given twice fails the load, and a string value is checked as text
//! (`config_text`) before it becomes a default (the framework makes a C string of it).
//!
//! Left to the server: a `MODULE LOADEX … CONFIG` name the module does not have at all
//! (`member.wokers`) never reaches the module (the server queues LOADEX pairs and
//! `RedisModule_LoadConfigs` takes only registered names). After a load that succeeded the
//! server finds it unused and unloads the module: Valkey 8.0.1 crashes on that path; Redis
//! 7.0.15's `moduleUnload` refuses a module that exports a data type (`EBUSY`), ignores its
//! own refusal, answers an error and leaves libmember loaded and serving (README
//! "Configuration").

use redis_module::configuration::{
    register_bool_configuration, register_i64_configuration, register_string_configuration,
    ConfigurationContext, ConfigurationFlags,
};
use redis_module::{raw, Context, RedisString};

use crate::config::*;
use crate::{db, upkeep::notify};

/// `member.workers` changed: the pool starts or stops workers to match (once started).
fn on_workers_changed<T>(_: &ConfigurationContext, _: &str, _: &'static T) {
    db::pool::resize();
}

/// `member.sync-notify` changed: the listener starts or stops (once the module is loaded).
fn on_sync_notify_changed<T>(_: &ConfigurationContext, _: &str, _: &'static T) {
    notify::ensure();
}

/// Registers every config and loads the values the server holds for them. `Err`: the reason
/// the load must fail (the server has logged which config it refused, and why).
#[rustfmt::skip::macros(numbers, strings, flags)]
pub fn register_and_load(ctx: &Context, args: &[RedisString]) -> Result<(), String> {
    let raw: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    let given = crate::config::module_args::ModuleArgs::parse(&raw)?;
    // The key file's path is read at once, from the first value registered on.
    TOKEN_KEY_FILE.loads_with(crate::config::token_key::set_file);
    // Text fit for a string config (no NUL: the framework makes a C string of a default).
    let text = |name: &str, v: &[u8]| {
        crate::config::text::check(name, v)
            .map(str::to_string)
            .map_err(|e| format!("libmember: module argument {e}"))
    };
    let mut known: Vec<&str> = Vec::new();
    macro_rules! numbers {
        ($([$name:expr, $var:expr, $def:expr, $min:expr, $max:expr, $flags:expr, $cb:expr]),* $(,)?) => {$(
            known.push($name);
            let default = match given.value($name) {
                None => $def,
                Some(v) => text($name, v)?.trim().parse::<i64>().map_err(|_| format!(
                    "libmember: module argument {}: {:?} is not an integer",
                    $name, crate::server::reply::escape(v)
                ))?,
            };
            // The server checks the range of a value it loads, not of a default.
            if !($min..=$max).contains(&default) {
                return Err(format!(
                    "libmember: module argument {}: {default} is not between {} and {}",
                    $name, $min, $max
                ));
            }
            register_i64_configuration(ctx, $name, $var, default, $min, $max, $flags, $cb);
        )*};
    }
    use ConfigurationFlags as F;
    numbers!(
        ["workers", &WORKERS, WORKERS_DEFAULT, WORKERS_MIN, WORKERS_MAX, F::DEFAULT, Some(Box::new(on_workers_changed))],
        ["db-timeout-ms", &DB_TIMEOUT_MS, DB_TIMEOUT_MS_DEFAULT, DB_TIMEOUT_MS_MIN, DB_TIMEOUT_MS_MAX, F::DEFAULT, None],
        ["batch-size", &BATCH_SIZE, BATCH_SIZE_DEFAULT, BATCH_SIZE_MIN, BATCH_SIZE_MAX, F::DEFAULT, None],
        ["default-capacity", &DEFAULT_CAPACITY, DEFAULT_CAPACITY_DEFAULT, DEFAULT_CAPACITY_MIN, DEFAULT_CAPACITY_MAX, F::DEFAULT, None],
        ["cache-ttl", &CACHE_TTL, CACHE_TTL_DEFAULT, CACHE_TTL_MIN, CACHE_TTL_MAX, F::DEFAULT, None],
        ["sync-interval-ms", &SYNC_INTERVAL_MS, SYNC_INTERVAL_MS_DEFAULT, SYNC_INTERVAL_MS_MIN, SYNC_INTERVAL_MS_MAX, F::DEFAULT, None],
        ["change-retention-s", &CHANGE_RETENTION_S, CHANGE_RETENTION_S_DEFAULT, CHANGE_RETENTION_S_MIN, CHANGE_RETENTION_S_MAX, F::DEFAULT, None],
        ["source-lookback-ms", &SOURCE_LOOKBACK_MS, SOURCE_LOOKBACK_MS_DEFAULT, SOURCE_LOOKBACK_MS_MIN, SOURCE_LOOKBACK_MS_MAX, F::DEFAULT, None],
        ["rebuild-interval-s", &REBUILD_INTERVAL_S, REBUILD_INTERVAL_S_DEFAULT, REBUILD_INTERVAL_S_MIN, REBUILD_INTERVAL_S_MAX, F::DEFAULT, None],
        ["fp-cache-size", &FP_CACHE_SIZE, FP_CACHE_SIZE_DEFAULT, FP_CACHE_SIZE_MIN, FP_CACHE_SIZE_MAX, F::DEFAULT, None],
        ["max-filter-bytes", &MAX_FILTER_BYTES, MAX_FILTER_BYTES_DEFAULT, MAX_FILTER_BYTES_MIN, MAX_FILTER_BYTES_MAX, F::MEMORY, None],
        ["build-memory", &BUILD_MEMORY, BUILD_MEMORY_DEFAULT, BUILD_MEMORY_MIN, BUILD_MEMORY_MAX, F::MEMORY, None],
        ["max-blocked-clients", &MAX_BLOCKED_CLIENTS, MAX_BLOCKED_CLIENTS_DEFAULT, MAX_BLOCKED_CLIENTS_MIN, MAX_BLOCKED_CLIENTS_MAX, F::DEFAULT, None],
        ["max-sets", &MAX_SETS, MAX_SETS_DEFAULT, MAX_SETS_MIN, MAX_SETS_MAX, F::DEFAULT, None],
        ["max-journal", &MAX_JOURNAL, MAX_JOURNAL_DEFAULT, MAX_JOURNAL_MIN, MAX_JOURNAL_MAX, F::DEFAULT, None],
        ["recent-ttl", &RECENT_TTL, RECENT_TTL_DEFAULT, RECENT_TTL_MIN, RECENT_TTL_MAX, F::DEFAULT, None],
    );
    macro_rules! strings {
        ($([$name:expr, $var:expr, $def:expr, $flags:expr, $cb:expr]),* $(,)?) => {$(
            known.push($name);
            let default = match given.value($name) {
                None => $def.to_string(),
                Some(v) => text($name, v)?,
            };
            register_string_configuration(ctx, $name, $var, &default, $flags, $cb);
        )*};
    }
    strings!(
        ["pg-url", &PG_URL, PG_URL_DEFAULT, F::SENSITIVE, Some(Box::new(on_pg_url_changed))],
        ["pg-rebuild-url", &PG_REBUILD_URL, "", F::SENSITIVE, None],
        ["pg-password-file", &PG_PASSWORD_FILE, "", F::DEFAULT, Some(Box::new(on_pg_url_changed))],
        ["pg-pooler", &PG_POOLER, PG_POOLER_DEFAULT, F::DEFAULT, Some(Box::new(on_pg_url_changed))],
        ["default-error-rate", &DEFAULT_ERROR_RATE, ERROR_RATE_DEFAULT, F::DEFAULT, None],
        ["token-key-file", &TOKEN_KEY_FILE, TOKEN_KEY_FILE_DEFAULT, F::DEFAULT, None],
        ["attach-allow", &crate::config::attach_allow::ATTACH_ALLOW, "", F::DEFAULT, None],
    );
    macro_rules! flags {
        ($([$name:expr, $var:expr, $def:expr, $flags:expr, $cb:expr]),* $(,)?) => {$(
            known.push($name);
            let default = match given.value($name).map(|v| text($name, v)).transpose()?.as_deref() {
                None | Some("") => $def,
                Some(v) if v.eq_ignore_ascii_case("yes") => true,
                Some(v) if v.eq_ignore_ascii_case("no") => false,
                // Anything else was read as "no" by the crate's own parser.
                Some(v) => return Err(format!("libmember: module argument {}: {v:?} is not yes or no", $name)),
            };
            register_bool_configuration(ctx, $name, $var, default, $flags, $cb);
        )*};
    }
    flags!(
        ["acl-sets", &ACL_SETS, ACL_SETS_DEFAULT, F::DEFAULT, None],
        ["auto-grow", &AUTO_GROW, AUTO_GROW_DEFAULT, F::DEFAULT, None],
        ["sync-notify", &SYNC_NOTIFY, SYNC_NOTIFY_DEFAULT, F::DEFAULT, Some(Box::new(on_sync_notify_changed))],
    );
    // A name no config has (`wokers 3`) was ignored before: now the load fails on it.
    given.only(&known)?;
    // SAFETY: OnLoad, main thread, the module's own context.
    let loaded = unsafe { raw::RedisModule_LoadConfigs.map(|load| load(ctx.ctx)) };
    match loaded {
        Some(rc) if rc != raw::REDISMODULE_OK as i32 => Err(
            "libmember: a member.* configuration was refused (the line above says which and why); \
             the module is not loaded"
                .into(),
        ),
        _ => Ok(()),
    }
}
