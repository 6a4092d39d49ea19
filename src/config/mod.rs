//! Module configs, each declared once (default, bounds, storage) and registered in lib.rs.
//! All are settable on the command line, in a config file and with CONFIG SET.

pub mod attach_allow;
pub mod conninfo;
pub mod module_args;
pub mod pg_link;
pub mod secret_file;
pub mod text;
pub mod token_key;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use redis_module::configuration::ConfigurationContext;
use redis_module::{ConfigurationValue, RedisError, RedisString};

pub const PG_URL_DEFAULT: &str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";
/// libpq connection string (URL or key=value) of the source of truth. Its password is kept
/// apart and never shown (`pg_link.rs`).
pub static PG_URL: crate::config::pg_link::PgUrl = crate::config::pg_link::PgUrl::new();
/// Bumped on every change of `PG_URL` or `PG_PASSWORD_FILE`, so workers reconnect.
pub static PG_URL_GEN: AtomicU64 = AtomicU64::new(0);

/// `member.pg-rebuild-url`: a streaming standby of `member.pg-url` that rebuilds read their
/// COPY from (docs/sync.md, "Rebuilding from a standby"); empty = the primary. Masked like
/// `member.pg-url`; its password comes from `member.pg-password-file` when that is set.
pub static PG_REBUILD_URL: crate::config::pg_link::PgUrl =
    crate::config::pg_link::PgUrl::named("member.pg-rebuild-url");

/// A file holding the database password (read at every connection, so a rotated file is
/// picked up on reconnect); empty = the password in `member.pg-url`, if any. Once the module
/// is loaded, CONFIG SET reads the file at once and refuses one that could not be used.
pub static PG_PASSWORD_FILE: PasswordFile = PasswordFile(Mutex::new(String::new()));

/// Set once the module's configs are loaded (`started`): from then on CONFIG SET checks the
/// password file it names.
static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Text handed to the server as a config's value (CONFIG GET, CONFIG REWRITE): its bytes as
/// they are, never through a C string (a NUL byte would abort the server there; none can be
/// stored, `config_text`, and this keeps it so).
fn shown(s: &str) -> RedisString {
    RedisString::create_from_slice(std::ptr::null_mut(), s.as_bytes())
}

pub use crate::config::text::refusal;

/// The `member.pg-password-file` config: the path, checked as text always and, once the
/// module is loaded, by reading the file (`pg_link::read_password_file`).
pub struct PasswordFile(Mutex<String>);

impl PasswordFile {
    /// The path set (empty: none).
    pub fn path(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl ConfigurationValue<RedisString> for PasswordFile {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        shown(&self.path())
    }
    fn set(&self, _: &ConfigurationContext, val: RedisString) -> Result<(), RedisError> {
        let path = crate::config::text::check("member.pg-password-file", val.as_slice())
            .map_err(refusal)?;
        if !path.is_empty() && STARTED.load(Ordering::Acquire) {
            crate::config::pg_link::read_password_file(path).map_err(refusal)?;
        }
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = path.to_string();
        Ok(())
    }
}

/// Called from module load once the configs are applied: from now on CONFIG SET checks the
/// password file; one named at start-up that cannot be used is logged (connections fail
/// with the reason in `db_link_error` until it can).
pub fn started(ctx: &redis_module::Context) {
    STARTED.store(true, Ordering::Release);
    let path = PG_PASSWORD_FILE.path();
    if path.is_empty() {
        return;
    }
    if let Err(e) = crate::config::pg_link::read_password_file(&path) {
        crate::server::reply::log(
            ctx,
            crate::server::reply::Level::Warning,
            &format!("libmember: {e}; connections fail until it can be read"),
        );
    }
}

pub const WORKERS_DEFAULT: i64 = 4;
pub const WORKERS_MIN: i64 = 1;
pub const WORKERS_MAX: i64 = 64;
/// Database worker threads (each holds one connection).
pub static WORKERS: AtomicI64 = AtomicI64::new(WORKERS_DEFAULT);

pub const DB_TIMEOUT_MS_DEFAULT: i64 = 2000;
pub const DB_TIMEOUT_MS_MIN: i64 = 10;
pub const DB_TIMEOUT_MS_MAX: i64 = 600_000;
/// How long a blocked client waits for the database before it gets an UNAVAILABLE error.
pub static DB_TIMEOUT_MS: AtomicI64 = AtomicI64::new(DB_TIMEOUT_MS_DEFAULT);

pub const BATCH_SIZE_DEFAULT: i64 = 256;
pub const BATCH_SIZE_MIN: i64 = 1;
pub const BATCH_SIZE_MAX: i64 = 10_000;
/// Most queued jobs a worker takes at once; lookups (and ADDs) of one set among them share
/// one statement.
pub static BATCH_SIZE: AtomicI64 = AtomicI64::new(BATCH_SIZE_DEFAULT);

pub const DEFAULT_CAPACITY_DEFAULT: i64 = 1_000_000;
pub const DEFAULT_CAPACITY_MIN: i64 = 1;
pub const DEFAULT_CAPACITY_MAX: i64 = 4_000_000_000;
/// Filter capacity of sets created without CAPACITY.
pub static DEFAULT_CAPACITY: AtomicI64 = AtomicI64::new(DEFAULT_CAPACITY_DEFAULT);

pub const CACHE_TTL_DEFAULT: i64 = 300;
pub const CACHE_TTL_MIN: i64 = 1;
pub const CACHE_TTL_MAX: i64 = 31_536_000;
/// Exact-match key TTL (seconds) of sets created without CACHE-TTL.
pub static CACHE_TTL: AtomicI64 = AtomicI64::new(CACHE_TTL_DEFAULT);

pub const FP_CACHE_SIZE_DEFAULT: i64 = 16_384;
pub const FP_CACHE_SIZE_MIN: i64 = 0;
pub const FP_CACHE_SIZE_MAX: i64 = 16_777_216;
/// Confirmed false positives remembered per set (each for the set's CACHE-TTL; 32 bytes a
/// slot, slots grown as needed up to this rounded to a power of two); 0 turns the tier off.
pub static FP_CACHE_SIZE: AtomicI64 = AtomicI64::new(FP_CACHE_SIZE_DEFAULT);

pub const RECENT_TTL_DEFAULT: i64 = 10;
pub const RECENT_TTL_MIN: i64 = 1;
pub const RECENT_TTL_MAX: i64 = 86_400;
/// Seconds a recent-writes mark outlives its write, for sets created without RECENT-TTL.
pub static RECENT_TTL: AtomicI64 = AtomicI64::new(RECENT_TTL_DEFAULT);

pub const SYNC_INTERVAL_MS_DEFAULT: i64 = 1000;
pub const SYNC_INTERVAL_MS_MIN: i64 = 100;
pub const SYNC_INTERVAL_MS_MAX: i64 = 3_600_000;
/// How often the sync loop reads rows written outside the module (and catches up filters).
pub static SYNC_INTERVAL_MS: AtomicI64 = AtomicI64::new(SYNC_INTERVAL_MS_DEFAULT);

pub const CHANGE_RETENTION_S_DEFAULT: i64 = 21_600;
pub const CHANGE_RETENTION_S_MIN: i64 = 60;
pub const CHANGE_RETENTION_S_MAX: i64 = 2_592_000;
/// How long rows stay in the change log `member_changes` (docs/sync.md) at least: a node whose
/// filter is older than that (down, or restored from an old snapshot) rebuilds it instead.
pub static CHANGE_RETENTION_S: AtomicI64 = AtomicI64::new(CHANGE_RETENTION_S_DEFAULT);

pub const SOURCE_LOOKBACK_MS_DEFAULT: i64 = 60_000;
pub const SOURCE_LOOKBACK_MS_MIN: i64 = 0;
pub const SOURCE_LOOKBACK_MS_MAX: i64 = 86_400_000;
/// Attached sets synced by `UPDATED-COLUMN` (docs/attach.md): each poll rereads the rows
/// stamped up to this long before the last poll, so a transaction that commits less than this
/// after its row's timestamp is not missed.
pub static SOURCE_LOOKBACK_MS: AtomicI64 = AtomicI64::new(SOURCE_LOOKBACK_MS_DEFAULT);

pub const REBUILD_INTERVAL_S_DEFAULT: i64 = 0;
pub const REBUILD_INTERVAL_S_MIN: i64 = 0;
pub const REBUILD_INTERVAL_S_MAX: i64 = 2_592_000;
/// Seconds between automatic rebuilds of every set (0 = never), to drop deleted and expired
/// members' bits.
pub static REBUILD_INTERVAL_S: AtomicI64 = AtomicI64::new(REBUILD_INTERVAL_S_DEFAULT);

pub const MAX_FILTER_BYTES_DEFAULT: i64 = 1 << 30;
pub const MAX_FILTER_BYTES_MIN: i64 = 1 << 12;
/// The filter's own cap (`filter::MAX_BITS` / 8, 8 GiB), written here as a number so the
/// settings do not import the filter above them; a unit test keeps the two equal.
pub const MAX_FILTER_BYTES_MAX: i64 = 1 << 33;
/// Largest filter (bit array, bytes) CREATE, a rebuild or a write may allocate for one set;
/// checked before anything is allocated.
pub static MAX_FILTER_BYTES: AtomicI64 = AtomicI64::new(MAX_FILTER_BYTES_DEFAULT);

pub fn max_filter_bytes() -> u64 {
    MAX_FILTER_BYTES
        .load(Ordering::Relaxed)
        .max(MAX_FILTER_BYTES_MIN) as u64
}

pub const BUILD_MEMORY_DEFAULT: i64 = 64 << 20;
pub const BUILD_MEMORY_MIN: i64 = 1 << 20;
pub const BUILD_MEMORY_MAX: i64 = 64 << 30;
/// Transient memory one build (a rebuild, a slot fill) may hold besides the filter it makes:
/// a quarter for the rows it read (past it they spill to a file in the server's working
/// directory), half for the fuse constructions running at once (docs/sync.md, "Rebuilding in
/// bounded memory").
pub static BUILD_MEMORY: AtomicI64 = AtomicI64::new(BUILD_MEMORY_DEFAULT);

pub fn build_memory() -> u64 {
    BUILD_MEMORY.load(Ordering::Relaxed).max(BUILD_MEMORY_MIN) as u64
}

pub const MAX_BLOCKED_CLIENTS_DEFAULT: i64 = 10_000;
pub const MAX_BLOCKED_CLIENTS_MIN: i64 = 1;
pub const MAX_BLOCKED_CLIENTS_MAX: i64 = 1_000_000;
/// Most clients blocked on the database at once; one more gets `UNAVAILABLE` at once.
pub static MAX_BLOCKED_CLIENTS: AtomicI64 = AtomicI64::new(MAX_BLOCKED_CLIENTS_DEFAULT);

pub const MAX_SETS_DEFAULT: i64 = 100_000;
pub const MAX_SETS_MIN: i64 = 1;
pub const MAX_SETS_MAX: i64 = 10_000_000;
/// Most sets MEMBER.CREATE adds on one node (sets learned from the catalog are not refused).
pub static MAX_SETS: AtomicI64 = AtomicI64::new(MAX_SETS_DEFAULT);

pub const MAX_JOURNAL_DEFAULT: i64 = 10_000_000;
pub const MAX_JOURNAL_MIN: i64 = 1;
pub const MAX_JOURNAL_MAX: i64 = 1_000_000_000;
/// Most adds one running rebuild journals (16 bytes each); past it the rebuild fails and the
/// old filter, which received every add, keeps serving.
pub static MAX_JOURNAL: AtomicI64 = AtomicI64::new(MAX_JOURNAL_DEFAULT);

pub const ACL_SETS_DEFAULT: bool = true;
/// Check the calling user's ACL key permission on `member:<set>` for every command (see
/// `acl.rs`); off skips the check and its cost on every call.
pub static ACL_SETS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(ACL_SETS_DEFAULT);

pub const AUTO_GROW_DEFAULT: bool = true;
/// Rebuild a set's filter by itself, sized for twice its rows, once its estimated FPR is
/// above twice its ERROR (`grow.rs`).
pub static AUTO_GROW: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(AUTO_GROW_DEFAULT);

pub fn auto_grow() -> bool {
    AUTO_GROW.load(Ordering::Relaxed)
}

pub const SYNC_NOTIFY_DEFAULT: bool = false;
/// Change notification (docs/sync.md): a listener connection wakes the sync loop as soon as
/// an outside write commits; the interval loop keeps running as the safety net.
pub static SYNC_NOTIFY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(SYNC_NOTIFY_DEFAULT);

pub fn sync_notify() -> bool {
    SYNC_NOTIFY.load(Ordering::Relaxed)
}

/// `member.pg-pooler` (docs/pooler.md): how connections to PostgreSQL hold their settings and
/// statements. `Auto` detects a pooler when connecting; `No` is a direct connection (startup
/// options, statements prepared once); `Yes` is a pooler (every transaction carries its
/// settings, no statement outlives its transaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Pooler {
    Auto = 0,
    No = 1,
    Yes = 2,
}

impl Pooler {
    pub const NAMES: [&'static str; 3] = ["auto", "no", "yes"];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    pub fn parse(s: &str) -> Option<Pooler> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Some(Pooler::Auto),
            "no" => Some(Pooler::No),
            "yes" => Some(Pooler::Yes),
            _ => None,
        }
    }
}

pub const PG_POOLER_DEFAULT: &str = "auto";
/// The `member.pg-pooler` config, one byte; setting it reconnects every connection (as a new
/// `member.pg-url` does).
pub static PG_POOLER: PoolerConfig = PoolerConfig(std::sync::atomic::AtomicU8::new(0));

pub struct PoolerConfig(std::sync::atomic::AtomicU8);

impl PoolerConfig {
    pub fn get(&self) -> Pooler {
        match self.0.load(Ordering::Relaxed) {
            1 => Pooler::No,
            2 => Pooler::Yes,
            _ => Pooler::Auto,
        }
    }
}

impl ConfigurationValue<RedisString> for PoolerConfig {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        shown(self.get().name())
    }
    fn set(&self, _: &ConfigurationContext, val: RedisString) -> Result<(), RedisError> {
        let v = Pooler::parse(&val.to_string_lossy())
            .ok_or(RedisError::Str("member.pg-pooler must be auto, no or yes"))?;
        self.0.store(v as u8, Ordering::Relaxed);
        Ok(())
    }
}

pub const ERROR_RATE_DEFAULT: &str = "0.01";
pub const ERROR_RATE_MIN: f64 = 0.000_001;
pub const ERROR_RATE_MAX: f64 = 0.5;
/// Filter false-positive rate of sets created without ERROR.
pub static DEFAULT_ERROR_RATE: ErrorRate = ErrorRate(AtomicU64::new(0x3F84_7AE1_47AE_147B)); // 0.01

/// An f64 config stored once, as bits; CONFIG GET prints it, CONFIG SET parses and bounds it.
pub struct ErrorRate(AtomicU64);

impl ErrorRate {
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// Parses an error rate, accepting only [ERROR_RATE_MIN, ERROR_RATE_MAX].
pub fn parse_error_rate(s: &str) -> Option<f64> {
    let v: f64 = s.trim().parse().ok()?;
    (ERROR_RATE_MIN..=ERROR_RATE_MAX).contains(&v).then_some(v)
}

impl ConfigurationValue<RedisString> for ErrorRate {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        shown(&self.get().to_string())
    }
    fn set(&self, _: &ConfigurationContext, val: RedisString) -> Result<(), RedisError> {
        let v = parse_error_rate(&val.to_string_lossy()).ok_or(RedisError::Str(
            "member.default-error-rate must be between 0.000001 and 0.5",
        ))?;
        self.0.store(v.to_bits(), Ordering::Relaxed);
        Ok(())
    }
}

pub const TOKEN_KEY_FILE_DEFAULT: &str = "";
/// Path of the file holding the tokenization key in hex (`token_key`); empty: no key. Setting
/// it reads the file at once (the server skips a CONFIG SET that names the path already set,
/// so another key is loaded by naming another file); an unreadable or malformed file is
/// refused and the key held before stays (at start-up it is kept without a key, and logged).
/// CONFIG GET shows the path, never the key.
pub static TOKEN_KEY_FILE: KeyFile = KeyFile {
    path: Mutex::new(String::new()),
    load: OnceLock::new(),
};

/// What takes a key file's path (`token_key::set_file`): refuses a file it cannot use.
pub type KeyLoader = fn(&str) -> Result<(), String>;

/// The `member.token-key-file` config: its value is the path; the key goes to the loader set
/// with `loads_with` (`token_key::set_file`), which refuses a file it cannot use.
pub struct KeyFile {
    path: Mutex<String>,
    load: OnceLock<KeyLoader>,
}

impl KeyFile {
    /// Makes every path set from now on go to `load`. Call once, before the configs are
    /// registered (`hooks/config_load.rs`).
    pub fn loads_with(&self, load: KeyLoader) {
        let _ = self.load.set(load);
    }
}

impl ConfigurationValue<RedisString> for KeyFile {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        shown(self.path.lock().unwrap_or_else(|e| e.into_inner()).as_str())
    }
    fn set(&self, _: &ConfigurationContext, val: RedisString) -> Result<(), RedisError> {
        // Refused even at start-up: such a path could not be shown or opened.
        let path =
            crate::config::text::check("member.token-key-file", val.as_slice()).map_err(refusal)?;
        if let Some(load) = self.load.get() {
            load(path).map_err(refusal)?;
        }
        *self.path.lock().unwrap_or_else(|e| e.into_inner()) = path.to_string();
        Ok(())
    }
}

pub fn sync_interval() -> std::time::Duration {
    std::time::Duration::from_millis(SYNC_INTERVAL_MS.load(Ordering::Relaxed) as u64)
}

pub fn change_retention_s() -> u64 {
    CHANGE_RETENTION_S.load(Ordering::Relaxed) as u64
}

pub fn source_lookback_ms() -> i64 {
    SOURCE_LOOKBACK_MS.load(Ordering::Relaxed)
}

pub fn rebuild_interval() -> Option<std::time::Duration> {
    match REBUILD_INTERVAL_S.load(Ordering::Relaxed) {
        0 => None,
        s => Some(std::time::Duration::from_secs(s as u64)),
    }
}

pub fn db_timeout_ms() -> u64 {
    DB_TIMEOUT_MS.load(Ordering::Relaxed) as u64
}

/// How long after a node takes over items (a promotion, a slot that arrived) the work that
/// makes its filter current must start before a negative counts: an ADD the previous holder
/// took is acknowledged within its `member.db-timeout-ms` or never, so it is committed by
/// then. One second covers the reply's way back and differing clocks of the timeouts.
pub fn handover_grace() -> std::time::Duration {
    std::time::Duration::from_millis(db_timeout_ms()) + std::time::Duration::from_secs(1)
}

/// The connection string as shown (password masked), the password kept apart, the password
/// file, and the generation they belong to.
pub fn pg_link() -> (crate::config::pg_link::Link, u64) {
    let gen = PG_URL_GEN.load(Ordering::Acquire);
    (PG_URL.link(PG_PASSWORD_FILE.path()), gen)
}

/// The standby rebuilds read from (same password file as the primary: a physical standby has
/// the primary's roles and passwords), or None when `member.pg-rebuild-url` is empty.
pub fn pg_rebuild_link() -> Option<crate::config::pg_link::Link> {
    if PG_REBUILD_URL.shown().trim().is_empty() {
        return None;
    }
    Some(PG_REBUILD_URL.link(PG_PASSWORD_FILE.path()))
}

/// The generation of the link settings; a connection made under another one is stale.
pub fn pg_link_gen() -> u64 {
    PG_URL_GEN.load(Ordering::Acquire)
}

pub fn on_pg_url_changed<T>(_: &ConfigurationContext, _: &str, _: &'static T) {
    PG_URL_GEN.fetch_add(1, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_rate_default_bits_are_one_percent() {
        assert_eq!(DEFAULT_ERROR_RATE.get(), 0.01);
        assert_eq!(parse_error_rate(ERROR_RATE_DEFAULT), Some(0.01));
    }

    #[test]
    fn the_largest_max_filter_bytes_is_the_filters_own_cap() {
        assert_eq!(MAX_FILTER_BYTES_MAX as u64, crate::filter::MAX_BITS / 8);
    }

    #[test]
    fn error_rate_bounds() {
        assert_eq!(parse_error_rate("0.5"), Some(0.5));
        assert_eq!(parse_error_rate("0.6"), None);
        assert_eq!(parse_error_rate("0"), None);
        assert_eq!(parse_error_rate("nan"), None);
        assert_eq!(parse_error_rate("x"), None);
    }
}
