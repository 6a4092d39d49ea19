//! The ring of tokenization keys this node holds (read from the file `member.token-key-file`
//! names, never shown anywhere; docs/security.md, "Key rings") and the gate every client item
//! passes: canonicalize, then tokenize under the key the set was created with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

use crate::model::canon::{self, Canon};
use crate::model::error;
use crate::model::set_def::SetDef;
use crate::model::token::{Key, Tokenize};
use crate::model::token_chain;
use crate::model::token_ring::{Ring, MAX_FILE_BYTES};

/// The loaded ring, if any. Written by the config and `MEMBER.KEYS RELOAD` (main thread),
/// read by commands.
static RING: RwLock<Option<Ring>> = RwLock::new(None);

/// Set once the module's configs are loaded (`started`): from then on a bad file is refused.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Why the key file named at start-up was not loaded, logged by `started`.
static START_ERROR: Mutex<Option<String>> = Mutex::new(None);
/// The path the loaded ring came from (what `reload` reads again).
static PATH: Mutex<String> = Mutex::new(String::new());

/// The tokenized sets this node serves, as `(set, key fingerprint)`: a ring that would drop
/// one of their keys is refused. Told once, at module load (`uses_keys`), by the layer that
/// knows the sets.
static IN_USE: OnceLock<KeysInUse> = OnceLock::new();

/// What tells the tokenized sets and their keys' fingerprints.
pub type KeysInUse = fn() -> Vec<(String, String)>;

/// Makes every ring loaded from now on keep the keys `sets` says are in use. Call once, from
/// module load.
pub fn uses_keys(sets: KeysInUse) {
    let _ = IN_USE.set(sets);
}

fn ring() -> std::sync::RwLockReadGuard<'static, Option<Ring>> {
    RING.read().unwrap_or_else(|e| e.into_inner())
}

/// Reads the ring at `path` (an empty path unloads every key) and installs it whole. On any
/// error the ring held before stays, and the error is the reply's text; it never quotes the
/// file. A ring that lacks a key of the old ring that some set uses is refused, the set named.
fn load_file(path: &str) -> Result<(), String> {
    let new = if path.is_empty() {
        None
    } else {
        Some(read(path).map_err(|why| format!("member.token-key-file {path}: {why}"))?)
    };
    let mut held = RING.write().unwrap_or_else(|e| e.into_inner());
    if STARTED.load(Ordering::Acquire) {
        dropped_in_use(held.as_ref(), new.as_ref()).map_or(Ok(()), |(set, fp)| {
            Err(format!(
                "member.token-key-file {path}: the key set '{set}' uses (fingerprint {fp}) is \
                 not in it; a key a set uses cannot be dropped (drop the set, or keep the key \
                 in the ring: docs/security.md)"
            ))
        })?;
    }
    *held = new;
    *PATH.lock().unwrap_or_else(|e| e.into_inner()) = path.to_string();
    Ok(())
}

/// The first set whose key `old` holds and `new` does not, with its fingerprint.
fn dropped_in_use(old: Option<&Ring>, new: Option<&Ring>) -> Option<(String, String)> {
    let sets = IN_USE.get()?;
    let old = old?;
    sets().into_iter().find(|(_, fp)| {
        old.by_fingerprint(fp).is_some() && new.and_then(|n| n.by_fingerprint(fp)).is_none()
    })
}

/// `load_file` for the config: refused at CONFIG SET; at start-up the path is kept without a
/// key (the sets that are not tokenized keep serving), tokenized sets answer "no key is
/// loaded", and `started` logs why. (A path that is not printable text never gets here: the
/// config refuses it even at start-up, `config::KeyFile`.)
pub fn set_file(path: &str) -> Result<(), String> {
    match load_file(path) {
        Err(e) if !STARTED.load(Ordering::Acquire) => {
            *RING.write().unwrap_or_else(|e| e.into_inner()) = None;
            *PATH.lock().unwrap_or_else(|e| e.into_inner()) = path.to_string();
            *START_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            Ok(())
        }
        res => res,
    }
}

/// `MEMBER.KEYS RELOAD`: reads the file the config names again, the same path (the server
/// calls no setter for a value that does not change), under `load_file`'s rules. Returns the
/// number of keys now held.
pub fn reload() -> Result<usize, String> {
    let path = PATH.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if path.is_empty() {
        return Err("ERR no key file to reload: member.token-key-file is not set".into());
    }
    load_file(&path).map_err(|e| format!("ERR {e}"))?;
    Ok(ring().as_ref().map_or(0, |r| r.entries().len()))
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

fn read(path: &str) -> Result<Ring, String> {
    // A FIFO, a device or a directory is refused before it is read (`secret_file`).
    let mut text = crate::config::secret_file::read(path, MAX_FILE_BYTES).map_err(|e| {
        if e.starts_with("the file is larger") {
            format!("{e}: it must hold only the key, or key ids and keys, in hex")
        } else {
            e
        }
    })?;
    let ring = Ring::parse(&text).map_err(|e| e.text());
    // The keys' text is not kept beyond this call.
    text.fill(0);
    ring
}

/// The key of fingerprint `fp` in `ring`, or the error every command on its set answers.
#[inline]
fn key_of<'r>(ring: &'r Option<Ring>, fp: &str) -> Result<&'r Key, &'static str> {
    match ring.as_ref() {
        None => Err(error::TOKEN_NO_KEY),
        Some(r) => r.by_fingerprint(fp).ok_or(error::TOKEN_KEY_CHANGED),
    }
}

/// The keys of a set's chain (its first key, then each key it was rotated to) from `ring`,
/// or the error every command on the set answers when the ring lacks any of them.
fn chain_of<'r>(ring: &'r Option<Ring>, chain: &str) -> Result<Vec<&'r Key>, &'static str> {
    chain
        .split(crate::model::token::CHAIN_SEPARATOR)
        .map(|fp| key_of(ring, fp))
        .collect()
}

/// The fingerprint of the ring's current key (its first), if a key is loaded: what
/// MEMBER.CREATE stores.
pub fn fingerprint() -> Option<String> {
    ring()
        .as_ref()
        .map(|r| r.current().key.fingerprint().to_string())
}

/// Whether a set tokenized as `t` can serve with the ring loaded now: `Ok` when it is not
/// tokenized or the ring holds its key, else the error every command on it answers.
pub fn check(t: &Tokenize) -> Result<(), &'static str> {
    match t.fingerprint() {
        None => Ok(()),
        Some(chain) => chain_of(&ring(), chain).map(|_| ()),
    }
}

/// The ring's ids of the keys a set tokenized as `t` uses (MEMBER.INFO's `token_key_id`),
/// first to last, joined by `>` as the chain is: empty when the set is not tokenized or the
/// ring holds none of them, `?` for one key the ring lacks.
pub fn id_of(t: &Tokenize) -> String {
    let held = ring();
    let Some(r) = held.as_ref().filter(|_| t.is_on()) else {
        return String::new();
    };
    let ids: Vec<&str> = t
        .chain()
        .into_iter()
        .map(|fp| r.entry_of(fp).map_or("?", |e| e.id.as_str()))
        .collect();
    if ids.iter().all(|id| *id == "?") {
        return String::new();
    }
    ids.join(">")
}

/// The ring's keys as `(id, fingerprint)`, in the file's order (the current one first).
pub fn entries() -> Vec<(String, String)> {
    ring().as_ref().map_or_else(Vec::new, |r| {
        r.entries()
            .iter()
            .map(|e| (e.id.clone(), e.key.fingerprint().to_string()))
            .collect()
    })
}

/// The ring as `INFO member` shows it: how many keys, and each key's id and fingerprint in
/// the file's order, the current one first (`k2:1a2b…,k1:3c4d…`; never a key).
pub fn ring_fields() -> [(&'static str, String); 2] {
    let entries = entries();
    let shown: Vec<String> = entries
        .iter()
        .map(|(id, fp)| format!("{id}:{fp}"))
        .collect();
    [
        ("token_ring_keys", entries.len().to_string()),
        ("token_ring", shown.join(",")),
    ]
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
    let Some(chain) = def.tokenize.fingerprint() else {
        return canon::canonicalize(def.normalize, item, scope);
    };
    crate::server::redaction::needed();
    let guard = ring();
    // A set never rotated (nearly every one): its key alone, nothing allocated for a chain.
    if !chain.contains(crate::model::token::CHAIN_SEPARATOR) {
        let key = key_of(&guard, chain)?;
        let (entity, scope) = canon::canonical_text(def.normalize, item, scope)?;
        return Ok(key.tokenize(&entity, scope));
    }
    let keys = chain_of(&guard, chain)?;
    let (entity, scope) = canon::canonical_text(def.normalize, item, scope)?;
    let token = token_chain::chain_token(&keys, &entity, scope);
    let hash = canon::hash_parts(&token, "");
    Ok(Canon {
        entity: std::borrow::Cow::Owned(token),
        scope: "",
        hash,
    })
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
    let Some(chain) = def.tokenize.fingerprint() else {
        return canon::canonicalize_all(def.normalize, items, scope, forms);
    };
    crate::server::redaction::needed();
    let guard = ring();
    let keys = chain_of(&guard, chain).map_err(|e| (0, e))?;
    // The canonical texts only: their hashes would be thrown away for the tokens'.
    let texts = items
        .iter()
        .enumerate()
        .map(|(i, item)| canon::canonical_text(def.normalize, item, scope).map_err(|e| (i, e)))
        .collect::<Result<Vec<_>, _>>()?;
    tokens.clear();
    tokens.resize(TOKEN_LEN * texts.len(), 0);
    let pairs: Vec<(&str, &str)> = texts.iter().map(|(e, s)| (&**e, *s)).collect();
    keys[0].tokens_into(&pairs, tokens);
    // A rotated set's tokens are wrapped under each later key; every token of one chain has
    // the same length (`<n>:` and 64 digits), so the buffer keeps one stride.
    let mut stride = TOKEN_LEN;
    if keys.len() > 1 {
        let wrapped: Vec<String> = tokens
            .chunks_exact(TOKEN_LEN)
            .map(|t| {
                let first = std::str::from_utf8(t).expect("hex digits are ASCII");
                token_chain::wrap_all(&keys[1..], first.to_string())
            })
            .collect();
        stride = wrapped.first().map_or(TOKEN_LEN, String::len);
        *tokens = wrapped.concat().into_bytes();
    }
    drop(guard);
    let tokens: &'a [u8] = tokens;
    Ok(tokens
        .chunks_exact(stride)
        .map(|t| {
            // SAFETY: `token_into` and `wrap` write ASCII digits, `:` and lowercase hex only.
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

/// `previous` (a stored token) wrapped under the ring's key of fingerprint `fp`: its next
/// link, the form a rotation to that key stores (`token_chain::wrap`).
pub fn wrap(fp: &str, previous: &str) -> Result<String, String> {
    let guard = ring();
    let key = key_of(&guard, fp).map_err(str::to_string)?;
    token_chain::wrap(key, previous).ok_or_else(|| "a stored row is not a token".to_string())
}

/// The fingerprint of the ring's key of id `id`, if the ring holds one.
pub fn fingerprint_of_id(id: &str) -> Option<String> {
    entries()
        .into_iter()
        .find(|(i, _)| i == id)
        .map(|(_, fp)| fp)
}
