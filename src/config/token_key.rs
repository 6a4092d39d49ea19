//! The tokenization key this node holds (read from the file `member.token-key-file` names,
//! never shown anywhere) and the gate every client item passes: canonicalize, then tokenize.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

use crate::model::canon::{self, Canon};
use crate::model::error;
use crate::model::set_def::SetDef;
use crate::model::token::{Key, Tokenize, MAX_KEY_BYTES};

/// The loaded key, if any. Written by the config (main thread), read by commands.
static KEY: RwLock<Option<Key>> = RwLock::new(None);

/// Set once the module's configs are loaded (`started`): from then on a bad file is refused.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Why the key file named at start-up was not loaded, logged by `started`.
static START_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Largest key file read: the longest key in hex with room for white space around it.
const MAX_FILE_BYTES: usize = MAX_KEY_BYTES * 2 + 64;

/// Reads and installs the key from `path` (an empty path unloads it). On any error the key
/// held before stays, and the error is the text CONFIG SET reports; it never quotes the file.
fn load_file(path: &str) -> Result<(), String> {
    let key = if path.is_empty() {
        None
    } else {
        Some(read(path).map_err(|why| format!("member.token-key-file {path}: {why}"))?)
    };
    *KEY.write().unwrap_or_else(|e| e.into_inner()) = key;
    Ok(())
}

/// `load_file` for the config: refused at CONFIG SET; at start-up the path is kept without a
/// key (the sets that are not tokenized keep serving), tokenized sets answer "no key is
/// loaded", and `started` logs why. (A path that is not printable text never gets here: the
/// config refuses it even at start-up, `config::KeyFile`.)
pub fn set_file(path: &str) -> Result<(), String> {
    match load_file(path) {
        Err(e) if !STARTED.load(Ordering::Acquire) => {
            *KEY.write().unwrap_or_else(|e| e.into_inner()) = None;
            *START_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            Ok(())
        }
        res => res,
    }
}

/// Called from module load once the configs are applied: logs a key file that could not be
/// read, and makes later bad files refused.
pub fn started(ctx: &redis_module::Context) {
    STARTED.store(true, Ordering::Release);
    if let Some(e) = START_ERROR.lock().unwrap_or_else(|e| e.into_inner()).take() {
        crate::server::reply::log(
            ctx,
            crate::server::reply::Level::Warning,
            &format!("libmember: no tokenization key loaded ({e}); tokenized sets answer errors"),
        );
    }
}

fn read(path: &str) -> Result<Key, String> {
    // A FIFO, a device or a directory is refused before it is read (`secret_file`).
    let mut text = crate::config::secret_file::read(path, MAX_FILE_BYTES).map_err(|e| {
        if e.starts_with("the file is larger") {
            format!("{e}: it must hold only the key in hex")
        } else {
            e
        }
    })?;
    let key = Key::from_file_text(&text).map_err(|e| e.text().to_string());
    // The key's text is not kept beyond this call.
    text.fill(0);
    key
}

/// The loaded key's fingerprint, if a key is loaded (what MEMBER.CREATE stores).
pub fn fingerprint() -> Option<String> {
    KEY.read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|k| k.fingerprint().to_string())
}

/// Whether a set tokenized as `t` can serve with the key loaded now: `Ok` when it is not
/// tokenized or the fingerprints match, else the error every command on it answers.
pub fn check(t: &Tokenize) -> Result<(), &'static str> {
    match t.fingerprint() {
        None => Ok(()),
        Some(fp) => match KEY.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            None => Err(error::TOKEN_NO_KEY),
            Some(k) if k.fingerprint() != fp => Err(error::TOKEN_KEY_CHANGED),
            Some(_) => Ok(()),
        },
    }
}

/// MEMBER.INFO's `token_key` field for a set tokenized as `t`.
pub fn status(t: &Tokenize) -> &'static str {
    match (t.is_on(), check(t)) {
        (false, _) => "none",
        (true, Ok(())) => "loaded",
        (true, Err(e)) if e == error::TOKEN_NO_KEY => "missing",
        (true, Err(_)) => "changed",
    }
}

/// The one gate from client input to canonical form, for every command that names items:
/// `canon::canonicalize` under the set's normalization, then, for a tokenized set, the token
/// in place of item and scope. A tokenized set without its key answers only errors (never a
/// 0 computed under the wrong key), and raises the redaction flag of the running command.
pub fn canonical<'a>(
    def: &SetDef,
    item: &'a [u8],
    scope: &'a [u8],
) -> Result<Canon<'a>, &'static str> {
    let Some(fp) = def.tokenize.fingerprint() else {
        return canon::canonicalize(def.normalize, item, scope);
    };
    crate::server::redaction::needed();
    let guard = KEY.read().unwrap_or_else(|e| e.into_inner());
    let key = match guard.as_ref() {
        None => return Err(error::TOKEN_NO_KEY),
        Some(k) if k.fingerprint() != fp => return Err(error::TOKEN_KEY_CHANGED),
        Some(k) => k,
    };
    let (entity, scope) = canon::canonical_text(def.normalize, item, scope)?;
    Ok(key.tokenize(&entity, scope))
}

/// [`canonical`] for every item of one call (MEXISTS, MADD), the key checked and held once
/// rather than once an item, and the tokens written into `tokens` (one buffer for the call,
/// which the forms borrow: no allocation a token); an untokenized set's normalized forms go
/// to `forms` the same way (`canon::canonicalize_all`). The error names the first item that
/// fails (0-based) as [`canonical`] would, item by item: a key error is the first item's.
pub fn canonical_all<'a>(
    def: &SetDef,
    items: &[&'a [u8]],
    scope: &'a [u8],
    tokens: &'a mut Vec<u8>,
    forms: &'a mut String,
) -> Result<Vec<Canon<'a>>, (usize, &'static str)> {
    let Some(fp) = def.tokenize.fingerprint() else {
        return canon::canonicalize_all(def.normalize, items, scope, forms);
    };
    crate::server::redaction::needed();
    let guard = KEY.read().unwrap_or_else(|e| e.into_inner());
    let key = match guard.as_ref() {
        None => return Err((0, error::TOKEN_NO_KEY)),
        Some(k) if k.fingerprint() != fp => return Err((0, error::TOKEN_KEY_CHANGED)),
        Some(k) => k,
    };
    // The canonical texts only: their hashes would be thrown away for the tokens'.
    let texts = items
        .iter()
        .enumerate()
        .map(|(i, item)| canon::canonical_text(def.normalize, item, scope).map_err(|e| (i, e)))
        .collect::<Result<Vec<_>, _>>()?;
    tokens.clear();
    tokens.resize(TOKEN_LEN * texts.len(), 0);
    let pairs: Vec<(&str, &str)> = texts.iter().map(|(e, s)| (&**e, *s)).collect();
    key.tokens_into(&pairs, tokens);
    drop(guard);
    let tokens: &'a [u8] = tokens;
    Ok(tokens
        .chunks_exact(TOKEN_LEN)
        .map(|t| {
            // SAFETY: `token_into` writes lowercase hex digits only, which are ASCII.
            let token = unsafe { std::str::from_utf8_unchecked(t) };
            Canon {
                entity: std::borrow::Cow::Borrowed(token),
                scope: "",
                hash: canon::hash_parts(token, ""),
            }
        })
        .collect())
}

/// Hex digits in a token.
const TOKEN_LEN: usize = 64;
