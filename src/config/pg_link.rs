//! The database link's secrets: `member.pg-url` (and `member.pg-rebuild-url`, the standby
//! rebuilds read from) is stored and shown with its password masked, the password kept apart
//! (or read from `member.pg-password-file` at every connection).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use redis_module::configuration::ConfigurationContext;
use redis_module::{ConfigurationValue, RedisError, RedisString};

use crate::config::conninfo::{ConnInfo, MASK};

/// `member.pg-url` (or another connection-string config, named by `name`): CONFIG GET shows
/// the masked text; CONFIG SET of a text whose password is the mask keeps the password already
/// set.
pub struct PgUrl {
    /// The config's full name, `member.pg-url`: messages and the filter's stash use it.
    name: &'static str,
    stored: Mutex<Stored>,
}

struct Stored {
    /// The text as set, every password replaced by the mask.
    masked: String,
    /// The password the text carried (the last one given, as the driver reads it).
    password: Option<String>,
}

/// What the command filter puts in place of a value that cannot be read (its password could
/// not be found to mask); a setter given it refuses the value.
pub const UNREADABLE: &str = "(unreadable connection string: not shown)";

/// What the filter took out of one config's value: its password, or why the text could not
/// be read.
pub type Stashed = Result<String, &'static str>;

/// The passwords (or why the texts could not be read) that `hooks/config_filter.rs` took out of the
/// CONFIG SET now running, per config name, for the setters to take back. Any other command
/// clears them, so they never outlive their CONFIG SET (inside MULTI they are gone by EXEC:
/// see the README).
static STASH: Mutex<Vec<(&'static str, Stashed)>> = Mutex::new(Vec::new());
static STASHED: AtomicBool = AtomicBool::new(false);

/// Holds what the filter took out of the current CONFIG SET (empty: nothing).
pub fn stash(v: Vec<(&'static str, Stashed)>) {
    STASHED.store(!v.is_empty(), Ordering::Relaxed);
    *STASH.lock().unwrap_or_else(|e| e.into_inner()) = v;
}

/// Forgets a stash (every command but CONFIG SET; one relaxed load when there is none).
pub fn stash_clear() {
    if STASHED.load(Ordering::Relaxed) {
        stash(Vec::new());
    }
}

fn take_stash(name: &str) -> Option<Stashed> {
    let mut s = STASH.lock().unwrap_or_else(|e| e.into_inner());
    let at = s.iter().position(|(n, _)| *n == name)?;
    let (_, v) = s.swap_remove(at);
    STASHED.store(!s.is_empty(), Ordering::Relaxed);
    Some(v)
}

/// The connection-string configs whose passwords the filter takes out of CONFIG SET.
pub const NAMES: [&str; 2] = ["member.pg-url", "member.pg-rebuild-url"];

/// One reading of the link settings, for one connection attempt.
pub struct Link {
    /// The config it comes from (`member.pg-url`), for messages.
    pub name: &'static str,
    /// The connection string, passwords masked: safe in any message.
    pub masked: String,
    url_password: Option<String>,
    password_file: String,
}

impl Default for PgUrl {
    fn default() -> Self {
        Self::new()
    }
}

impl PgUrl {
    /// `member.pg-url`.
    pub const fn new() -> PgUrl {
        Self::named(NAMES[0])
    }

    /// Another connection-string config, by its full name.
    pub const fn named(name: &'static str) -> PgUrl {
        PgUrl {
            name,
            stored: Mutex::new(Stored {
                masked: String::new(),
                password: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.stored.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a connection string. The text is rejected, without being quoted, when it cannot
    /// be read (its password could not be told apart), holds a control character (as written,
    /// or once unquoted or percent-decoded: `ConnInfo::parse`) or asks for an unknown `sslmode`.
    ///
    /// A text whose password is the mask keeps the password set before, unless the command
    /// filter took a new one out of this CONFIG SET's argument (then that one counts).
    pub fn store(&self, text: &str) -> Result<(), String> {
        let stashed = take_stash(self.name);
        let name = self.name;
        if text == UNREADABLE {
            let why = match stashed {
                Some(Err(e)) => e,
                _ => "unreadable",
            };
            return Err(format!("{name}: {why} (the value is not shown)"));
        }
        let info = ConnInfo::parse(text).map_err(|e| format!("{name}: {e}"))?;
        info.tls().map_err(|e| format!("{name}: {e}"))?;
        let mut s = self.lock();
        let password = match (info.password(), stashed) {
            (Some(MASK), Some(Ok(p))) => Some(p),
            (Some(MASK), _) => s.password.take(),
            (other, _) => other.map(str::to_string),
        };
        *s = Stored {
            masked: info.masked(),
            password,
        };
        Ok(())
    }

    /// Stores `default` when nothing was set yet.
    pub fn default_if_empty(&self, default: &str) {
        if self.lock().masked.is_empty() {
            let _ = self.store(default);
        }
    }

    /// The text as CONFIG GET shows it.
    pub fn shown(&self) -> String {
        self.lock().masked.clone()
    }

    /// The settings one connection attempt uses.
    pub fn link(&self, password_file: String) -> Link {
        let s = self.lock();
        Link {
            name: self.name,
            masked: s.masked.clone(),
            url_password: s.password.clone(),
            password_file,
        }
    }
}

impl ConfigurationValue<RedisString> for PgUrl {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        // The bytes as they are, not through a C string (`text::refusal` says why).
        RedisString::create_from_slice(std::ptr::null_mut(), self.shown().as_bytes())
    }

    fn set(&self, _: &ConfigurationContext, val: RedisString) -> Result<(), RedisError> {
        let text = crate::config::text::check(self.name, val.as_slice())
            .map_err(crate::config::text::refusal)?;
        self.store(text).map_err(crate::config::text::refusal)
    }
}

impl Link {
    /// The password to send: the file's content when `member.pg-password-file` is set (read
    /// now, so a rotated file counts from the next connection), else the one in the URL.
    pub fn password(&self, info: &ConnInfo) -> Result<Option<String>, String> {
        if !self.password_file.is_empty() {
            return read_password_file(&self.password_file).map(Some);
        }
        match (info.password(), &self.url_password) {
            (Some(MASK), None) => Err(format!(
                "{} holds the masked password {MASK} and no real one: set the full \
                 connection string again, or use member.pg-password-file",
                self.name
            )),
            (Some(_), p) => Ok(p.clone()),
            (None, _) => Ok(None),
        }
    }
}

/// Largest password file read, in bytes.
pub const MAX_PASSWORD_FILE: usize = 4096;

/// The file's content without its trailing line break(s): a regular file of at most
/// `MAX_PASSWORD_FILE` bytes, opened without blocking (`secret_file`), UTF-8 text without
/// control characters. Errors name the path, never the content.
pub fn read_password_file(path: &str) -> Result<String, String> {
    let bytes = crate::config::secret_file::read(path, MAX_PASSWORD_FILE)
        .map_err(|e| format!("cannot read member.pg-password-file {path}: {e}"))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("member.pg-password-file {path} is not UTF-8 text"))?;
    let password = text.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(format!("member.pg-password-file {path} is empty"));
    }
    if crate::config::text::has_control(password) {
        return Err(format!(
            "member.pg-password-file {path} holds a control character (only a trailing line \
             break is allowed)"
        ));
    }
    Ok(password.to_string())
}

/// `msg` with every occurrence of `password` masked: a last guard for texts that come from
/// elsewhere (driver and server messages). Passwords under 4 bytes are left alone, as
/// masking them would garble the message and hide nothing.
pub fn scrub(msg: &str, password: Option<&str>) -> String {
    match password {
        Some(p) if p.len() >= 4 => msg.replace(p, MASK),
        _ => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `store` takes the process-wide stash: tests that store run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn a_masked_password_set_back_keeps_the_real_one() {
        let _serial = serial();
        let u = PgUrl::new();
        u.store("postgres://app:s3cret@h/db").unwrap();
        assert_eq!(u.shown(), "postgres://app:***@h/db");
        // What CONFIG GET showed, set back (and with another database): the password stays.
        u.store("postgres://app:***@h/other").unwrap();
        let link = u.link(String::new());
        let info = ConnInfo::parse(&link.masked).unwrap();
        assert_eq!(link.password(&info).unwrap().as_deref(), Some("s3cret"));
        // A new password replaces it; none removes it.
        u.store("host=h user=app password=n3w").unwrap();
        assert_eq!(u.shown(), "host=h user=app password=***");
        let link = u.link(String::new());
        let info = ConnInfo::parse(&link.masked).unwrap();
        assert_eq!(link.password(&info).unwrap().as_deref(), Some("n3w"));
        u.store("host=h user=app").unwrap();
        u.store("host=h user=app password=***").unwrap();
        let link = u.link(String::new());
        let info = ConnInfo::parse(&link.masked).unwrap();
        let e = link.password(&info).unwrap_err();
        assert!(e.contains("masked"), "{e}");
    }

    #[test]
    fn the_filters_stash_is_taken_once() {
        let _serial = serial();
        let u = PgUrl::new();
        u.store("host=h password=old").unwrap();
        stash(vec![(NAMES[0], Ok("new".into()))]);
        u.store("host=h password=***").unwrap();
        assert_eq!(u.lock().password.as_deref(), Some("new"));
        u.store("host=h password=***").unwrap();
        assert_eq!(u.lock().password.as_deref(), Some("new"));
        stash(vec![(NAMES[0], Ok("other".into()))]);
        stash_clear();
        u.store("host=h password=***").unwrap();
        assert_eq!(u.lock().password.as_deref(), Some("new"));
        stash(vec![(NAMES[0], Err("a quoted value is not terminated"))]);
        let e = u.store(UNREADABLE).unwrap_err();
        assert!(e.contains("not terminated"), "{e}");
        assert_eq!(u.lock().password.as_deref(), Some("new"));
    }

    #[test]
    fn each_config_takes_its_own_stashed_password() {
        let _serial = serial();
        let main = PgUrl::new();
        let rebuild = PgUrl::named(NAMES[1]);
        stash(vec![
            (NAMES[0], Ok("one".into())),
            (NAMES[1], Ok("two".into())),
        ]);
        rebuild.store("host=standby password=***").unwrap();
        main.store("host=primary password=***").unwrap();
        assert_eq!(main.lock().password.as_deref(), Some("one"));
        assert_eq!(rebuild.lock().password.as_deref(), Some("two"));
        assert_eq!(rebuild.link(String::new()).name, "member.pg-rebuild-url");
        let e = rebuild.store("host=h password='unterminated").unwrap_err();
        assert!(e.starts_with("member.pg-rebuild-url:"), "{e}");
        // Empty: no rebuild source of its own.
        rebuild.store("").unwrap();
        assert_eq!(rebuild.shown(), "");
    }

    #[test]
    fn a_rejected_text_changes_nothing_and_is_not_quoted() {
        let _serial = serial();
        let u = PgUrl::new();
        u.store("host=h password=keep").unwrap();
        let e = u.store("host=h password='secret-unterminated").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        let e = u
            .store("host=h password=secret sslmode=verify-everything")
            .unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(u.shown(), "host=h password=***");
        assert_eq!(u.lock().password.as_deref(), Some("keep"));
    }

    #[test]
    fn the_password_file_wins_and_is_read_each_time() {
        let _serial = serial();
        let dir = std::env::temp_dir().join(format!("member-pwfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "first\n").unwrap();
        let u = PgUrl::new();
        u.store("host=h password=in-url").unwrap();
        let link = u.link(f.to_string_lossy().into_owned());
        let info = ConnInfo::parse(&link.masked).unwrap();
        assert_eq!(link.password(&info).unwrap().as_deref(), Some("first"));
        std::fs::write(&f, "second\r\n").unwrap();
        assert_eq!(link.password(&info).unwrap().as_deref(), Some("second"));
        std::fs::write(&f, "\n").unwrap();
        assert!(link.password(&info).unwrap_err().contains("is empty"));
        std::fs::remove_file(&f).unwrap();
        let e = link.password(&info).unwrap_err();
        assert!(e.starts_with("cannot read member.pg-password-file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_text_with_a_control_character_changes_nothing() {
        let _serial = serial();
        let u = PgUrl::new();
        u.store("host=h password=keep").unwrap();
        for bad in [
            "dbname='ac\0l' password=x",
            "postgres://u:x@h/db?sslrootcert=a%00b",
        ] {
            let e = u.store(bad).unwrap_err();
            assert!(
                e.starts_with("member.pg-url: the connection string holds"),
                "{e}"
            );
        }
        assert_eq!(u.shown(), "host=h password=***");
        assert_eq!(u.lock().password.as_deref(), Some("keep"));
    }

    #[test]
    fn a_password_file_is_bounded_and_plain_text() {
        let dir = std::env::temp_dir().join(format!("member-pwbound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        let p = f.to_str().unwrap();
        std::fs::write(&f, "a\0b\n").unwrap();
        let e = read_password_file(p).unwrap_err();
        assert!(e.contains("holds a control character"), "{e}");
        std::fs::write(&f, "x".repeat(MAX_PASSWORD_FILE + 1)).unwrap();
        let e = read_password_file(p).unwrap_err();
        assert!(e.contains("larger than 4096 bytes"), "{e}");
        std::fs::write(&f, "x".repeat(MAX_PASSWORD_FILE)).unwrap();
        assert_eq!(read_password_file(p).unwrap().len(), MAX_PASSWORD_FILE);
        let e = read_password_file("/dev/zero").unwrap_err();
        assert!(
            e.starts_with("cannot read member.pg-password-file /dev/zero: it is a device"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn scrub_masks_long_passwords_only() {
        assert_eq!(
            scrub("auth for s3cret failed", Some("s3cret")),
            "auth for *** failed"
        );
        assert_eq!(scrub("a b", Some("a")), "a b");
        assert_eq!(scrub("x", None), "x");
    }
}
