//! Every error reply libmember sends, with its exact text, in one place.
//! Tests and the README quote these strings; change them here and nowhere else.

/// Prefix of the one error that means "the source of truth could not answer": PostgreSQL is
/// down, unreachable, or slower than `member.db-timeout-ms`. Never replaced by a 0 or a 1.
pub const UNAVAILABLE: &str = "UNAVAILABLE";

pub const WRONG_ARITY: &str = "ERR wrong number of arguments";
pub const SYNTAX: &str = "ERR syntax error";
pub const BAD_SET_NAME: &str = "ERR invalid set name: use 1 to 40 characters from [a-z0-9_]";
pub const UNKNOWN_SET: &str = "ERR no such set: create it with MEMBER.CREATE";
pub const EMPTY_ITEM: &str = "ERR item is empty";
pub const ITEM_TOO_LONG: &str = "ERR item is longer than 1024 bytes";
pub const ITEM_NOT_TEXT: &str = "ERR item must be valid UTF-8 without NUL bytes";
pub const ITEM_EMPTY_AFTER_NORMALIZE: &str = "ERR item is empty after normalization";
/// The normalized form (what is stored) must fit the item limit too: a rebuild canonicalizes
/// the stored form again and would refuse it (its member would lose its filter bits).
pub const ITEM_TOO_LONG_AFTER_NORMALIZE: &str =
    "ERR item is longer than 1024 bytes after normalization";
pub const SCOPE_TOO_LONG: &str = "ERR scope is longer than 256 bytes";
pub const SCOPE_NOT_TEXT: &str = "ERR scope must be valid UTF-8 without NUL bytes";
pub const BAD_TTL: &str = "ERR TTL must be an integer between 1 and 315360000 seconds";
pub const BAD_EXPIREAT: &str =
    "ERR EXPIREAT must be a unix time in seconds, in the future and within 10 years";
pub const TTL_AND_EXPIREAT: &str = "ERR TTL and EXPIREAT cannot be combined";
pub const BAD_ERROR_RATE: &str = "ERR ERROR must be a number between 0.000001 and 0.5";
pub const BAD_CAPACITY: &str = "ERR CAPACITY must be an integer between 1 and 4000000000";
pub const BAD_CACHE_TTL: &str = "ERR CACHE-TTL must be an integer between 1 and 31536000 seconds";
pub const BAD_RECENT_TTL: &str = "ERR RECENT-TTL must be an integer between 1 and 86400 seconds";
pub const BAD_NORMALIZE: &str = "ERR NORMALIZE must be one of none, lower, username";
pub const BAD_TOKENIZE: &str = "ERR TOKENIZE must be one of none, hmac-sha256";
pub const TOKENIZE_NEEDS_KEY: &str =
    "ERR TOKENIZE hmac-sha256 needs a key: point member.token-key-file at the key file first";
/// Every item command on a tokenized set while this node holds no key.
pub const TOKEN_NO_KEY: &str = "ERR set is tokenized and no key is loaded: point \
     member.token-key-file at the file holding the set's key";
/// Every item command on a tokenized set whose stored key fingerprint is not the loaded key's.
pub const TOKEN_KEY_CHANGED: &str = "ERR set is tokenized under another key than the one \
     loaded (key fingerprints differ, see MEMBER.INFO): load the set's own key with \
     member.token-key-file";
pub const NO_ITEMS: &str =
    "ERR syntax error: the items must follow the options, as ITEMS <item> [<item> ...]";
/// MEMBER.MEXISTS / MEMBER.MADD past `command::batch::MAX_ITEMS` items.
pub const TOO_MANY_ITEMS: &str = "ERR too many items: at most 1000 per call";
/// Cluster, MEXISTS/MADD: an owner of some of the call's items did not answer its part in time.
pub const MANY_TIMEOUT: &str = "UNAVAILABLE a node holding some of the items' canonical slots did \
     not answer within member.db-timeout-ms";
/// Cluster, MEXISTS/MADD: an owner of some of the call's items could not be sent its part.
pub const MANY_UNREACHABLE: &str =
    "UNAVAILABLE a node holding some of the items' canonical slots is not reachable over the cluster bus";
/// Cluster, MADD: no primary serves the canonical slot of one of the items (as last polled).
pub const MANY_NO_OWNER: &str =
    "TRYAGAIN libmember: no node serves the canonical slot of one of the items; retry";
/// Cluster, MADD: one of the items' canonical slots is moving (a reshard): nothing was written.
pub const MANY_MOVING: &str =
    "TRYAGAIN libmember: the canonical slot of one of the items is moving; retry";
pub const DUPLICATE_OPTION: &str = "ERR option given more than once";
/// A new set whose table `member_<set>` would take the name of one of the module's own
/// tables or of another set's index (README "Commands", MEMBER.CREATE).
pub const RESERVED_SET_NAME: &str = "ERR set name is reserved: catalog, changes, names \
     starting with catalog_ or changes_ and names ending in _updated_at, _slot or _pkey name \
     the module's own tables and indexes";
pub const SET_EXISTS_DIFFERENT: &str =
    "ERR set already exists with different settings (see MEMBER.INFO)";
/// MEMBER.ALTER without a setting to change.
pub const ALTER_NOTHING: &str =
    "ERR MEMBER.ALTER needs at least one of ERROR, CAPACITY, CACHE-TTL, RECENT-TTL";
/// MEMBER.ALTER … NORMALIZE: never allowed.
pub const ALTER_NORMALIZE: &str = "ERR NORMALIZE cannot be changed: the set's rows, cached \
     entries and filter bits are all stored in its normalized form (items that were distinct \
     could become one); create a new set with the new NORMALIZE and copy the rows into it";
/// MEMBER.ALTER … TOKENIZE: never allowed.
pub const ALTER_TOKENIZE: &str = "ERR TOKENIZE cannot be changed: the set's rows are stored as \
     they were made (tokens cannot be turned back into items, nor items into tokens without \
     the raw items); create a new set and refill it from the source of the raw items";
pub const NEEDS_BLOCKING: &str =
    "ERR this call needs the database and cannot block inside MULTI/EXEC, Lua or functions";
pub const REBUILD_RUNNING: &str = "ERR a rebuild of this set is already running (see MEMBER.INFO)";
pub const CATALOG_NOT_LOADED: &str =
    "UNAVAILABLE set catalog not loaded yet: PostgreSQL has not answered since start-up";
pub const DB_TIMEOUT: &str =
    "UNAVAILABLE source of truth did not answer within member.db-timeout-ms";
pub const WORKER_LOST: &str = "UNAVAILABLE database worker failed before answering";
/// Cluster: the node holding the item's canonical slot did not answer a forwarded request in time.
pub const FORWARD_TIMEOUT: &str = "UNAVAILABLE the node holding the item's canonical slot did not \
     answer within member.db-timeout-ms";
/// Cluster: the node holding the item's canonical slot could not be sent the request.
pub const FORWARD_UNREACHABLE: &str =
    "UNAVAILABLE the node holding the item's canonical slot is not reachable over the cluster bus";
/// Cluster, a rotating set: the write was stored, but the owner of its twin's slot did not
/// confirm the twin's effects, so it is not acknowledged (docs/security.md, "In a cluster").
pub const TWIN_UNCONFIRMED: &str = "UNAVAILABLE the write was stored, but the node holding the \
     slot of its rotated form did not confirm it; retry (a retried write is idempotent)";
/// Cluster, a rotating set: the owner of the write's twin's slot did not mark the twin's write
/// as begun (refused, unreachable, no answer within half of `member.db-timeout-ms`), or the
/// write could not start in time after it did; so the write was not made (docs/security.md,
/// "A gap the cluster history checker found").
pub const TWIN_NOT_BEGUN: &str = "TRYAGAIN libmember: the node holding the slot of the item's \
     rotated form did not mark the write as begun in time; nothing was stored; retry";
/// MEMBER.ALTER ROTATE-KEY: the set's table stayed locked by other sessions through every
/// try of the start within three quarters of `member.db-timeout-ms` (its DDL waits briefly,
/// so that lookups never queue behind it): nothing changed.
pub const ROTATION_BUSY: &str = "TRYAGAIN libmember: the set's table stayed locked by other \
     sessions; the rotation did not start; retry";
/// A rotating set's write planned with its twin reached the database after the rotation's
/// drain ended (its `twin` column dropped): the statement stored nothing, and a retry is
/// planned in the form the set has now (docs/security.md).
pub const ROTATION_ENDED: &str = "TRYAGAIN libmember: the set's key rotation ended while this \
     write was in flight; nothing was stored; retry";
/// Cluster: no primary serves the item's canonical slot (as last polled).
pub const NO_OWNER: &str = "TRYAGAIN libmember: no node serves the item's canonical slot; retry";
/// Cluster: a forwarded request reached a node that no longer (or not yet) holds the slot.
pub const SLOT_MOVING: &str = "TRYAGAIN libmember: the item's canonical slot is moving; retry";
/// Cluster: a forwarded request named a set the owner is still learning from the catalog.
pub const SET_BEING_LEARNED: &str =
    "TRYAGAIN libmember: the node holding the item's canonical slot is learning the set; retry";
/// Cluster: a primary asked to rebuild its slots of a set is still learning the set from the
/// catalog (a retry finds the rebuilds that started still running, or done).
pub const REBUILD_SET_BEING_LEARNED: &str =
    "TRYAGAIN libmember: a primary is learning the set from the catalog; retry";
/// Cluster: a node asked to rebuild its slots of a set is no longer a primary.
pub const REBUILD_NOT_PRIMARY: &str =
    "TRYAGAIN libmember: a node asked to rebuild is no longer a primary; retry";

/// The error reply for a failed database call: `UNAVAILABLE <detail>` when the database could
/// not be reached or answered too slowly, `ERR <detail>` when it answered with an error.
pub fn db_error(unavailable: bool, detail: &str) -> String {
    let detail = detail.replace(['\r', '\n'], " ");
    // A complete reply of its own (`WORKER_LOST`), not a detail to wrap.
    if unavailable && detail.starts_with(UNAVAILABLE) {
        return detail;
    }
    if unavailable {
        format!("{UNAVAILABLE} source of truth unavailable: {detail}")
    } else {
        format!("ERR database error: {detail}")
    }
}

/// True for the errors about one item (`at_item` names its position); false for those about
/// the scope or the set, which every item of a call shares.
pub fn names_item(err: &str) -> bool {
    [
        EMPTY_ITEM,
        ITEM_TOO_LONG,
        ITEM_NOT_TEXT,
        ITEM_EMPTY_AFTER_NORMALIZE,
        ITEM_TOO_LONG_AFTER_NORMALIZE,
    ]
    .contains(&err)
}

/// An item of a multi-item call failed validation (`err`, one of the item errors above):
/// the whole call fails and names the item's position among the ITEMS, from 1.
pub fn at_item(pos: usize, err: &str) -> String {
    format!(
        "ERR item {pos}: {}",
        err.strip_prefix("ERR ").unwrap_or(err)
    )
}

/// A bug was contained (a panic while applying or answering a completed request).
pub const INTERNAL: &str = "ERR libmember: internal error (logged; please report it)";

/// MEMBER.CREATE … SOURCE (docs/attach.md): refusals decided from the arguments alone.
pub const SOURCE_NAME: &str = "ERR SOURCE must be <schema>.<table>: exact names, split at the \
     first dot, 1 to 63 bytes each, without NUL bytes";
pub const SOURCE_NEEDS_COLUMN: &str =
    "ERR SOURCE needs COLUMN <column>: the column holding the items";
pub const SOURCE_OPTION_ALONE: &str = "ERR COLUMN, SCOPE-COLUMN, UPDATED-COLUMN and SYNC are \
     options of an attached set: give SOURCE <schema>.<table> too";
pub const SOURCE_BAD_IDENT: &str =
    "ERR column names must be 1 to 63 bytes of UTF-8 without NUL bytes";
pub const SOURCE_NEEDS_SYNC: &str = "ERR an attached set needs a sync mode for writes made \
     outside the module: SYNC log (change-log triggers on the table, the full guarantee) or \
     UPDATED-COLUMN <column> (polls a timestamp column, may miss late commits; see \
     docs/attach.md)";
pub const SOURCE_SYNC_BOTH: &str = "ERR SYNC log and UPDATED-COLUMN exclude each other: choose one";
pub const SOURCE_BAD_SYNC: &str = "ERR SYNC must be log (or give UPDATED-COLUMN <column> instead)";
pub const SOURCE_USERNAME: &str = "ERR NORMALIZE username cannot be used with SOURCE: lookups \
     in the table must match in SQL, and username normalization (NFKC, case folding) has no \
     SQL form; use none or lower";
pub const SOURCE_TOKENIZE: &str = "ERR TOKENIZE cannot be used with SOURCE: the table holds the \
     items in clear, so tokens could never match its rows";
/// MEMBER.CREATE … SOURCE of a table `member.attach-allow` does not list (docs/attach.md).
pub const SOURCE_NOT_ALLOWED: &str = "ERR SOURCE table is not allowed by member.attach-allow: \
     attaching a table is an operator's decision (see docs/attach.md)";
/// MEMBER.CREATE … SOURCE of one of the module's own relations, whatever the allow list says.
pub const SOURCE_MODULE_OWN: &str = "ERR SOURCE is one of the module's own relations (its \
     catalog, its change log or a set's table): it can never be attached";
/// MEMBER.ADD / MADD with TTL or EXPIREAT on an attached set.
pub const SOURCE_NO_EXPIRY: &str = "ERR TTL and EXPIREAT cannot be used on an attached set: \
     its members are the rows of its table, which has no expiry";

/// The error table of docs/commands.md and the texts the code sends agree: every documented
/// text is in the code, and every fixed text here is documented (on that page, or on
/// docs/attach.md for the attached sets' refusals).
#[cfg(test)]
mod documented {
    use std::path::Path;

    const COMMANDS_MD: &str = include_str!("../../docs/commands.md");
    const ATTACH_MD: &str = include_str!("../../docs/attach.md");
    const THIS_FILE: &str = include_str!("error.rs");

    /// Every `.rs` file under `dir`, as Rust reads its string literals: a `\` at the end of
    /// a line drops the line break and the next line's leading blanks.
    fn sources(dir: &Path, out: &mut String) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let mut lines = text.lines().peekable();
                while let Some(l) = lines.next() {
                    match l.strip_suffix('\\') {
                        Some(head) => {
                            out.push_str(head);
                            if let Some(next) = lines.peek_mut() {
                                *next = next.trim_start();
                            }
                        }
                        None => {
                            out.push_str(l);
                            out.push('\n');
                        }
                    }
                }
            }
        }
    }

    /// The texts in the first column of the Errors table: each backticked text, split where
    /// the row lists several.
    fn documented() -> Vec<&'static str> {
        let table = &COMMANDS_MD[COMMANDS_MD.find("\n## Errors").unwrap()..];
        let mut out = Vec::new();
        for row in table.lines().filter(|l| l.starts_with("| `")) {
            let first = row[1..].split(" | ").next().unwrap();
            out.extend(first.split('`').skip(1).step_by(2));
        }
        out
    }

    /// The fixed parts of a documented text, each of which some source text must hold: the
    /// text without its error code (the code adds `ERR ` and the like in one place), cut at
    /// its `<placeholders>`, at a `…` that stands for the rest, and where the code joins
    /// pieces (`: `) or quotes a value (`'`).
    fn fragments(text: &str) -> Vec<&str> {
        let text = text.split('…').next().unwrap();
        let text = ["ERR ", "UNAVAILABLE ", "NOPERM ", "TRYAGAIN "]
            .iter()
            .find_map(|code| text.strip_prefix(code))
            .unwrap_or(text);
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('<') {
            out.push(&rest[..open]);
            rest = rest[open..]
                .find('>')
                .map_or("", |close| &rest[open + close + 1..]);
        }
        out.push(rest);
        out.into_iter()
            .flat_map(|f| f.split(": "))
            .flat_map(|f| f.split('\''))
            .map(str::trim)
            .filter(|f| f.len() >= 4)
            .collect()
    }

    /// `text` with every run of blanks and line breaks as one space (a documented text may
    /// be wrapped).
    fn one_line(text: &str) -> String {
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn every_documented_error_is_a_text_the_code_sends() {
        let mut code = String::new();
        sources(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path(),
            &mut code,
        );
        let texts = documented();
        assert!(
            texts.len() > 40,
            "the Errors table was not found: {texts:?}"
        );
        let mut missing = Vec::new();
        for text in texts {
            // The server's own errors, not the module's.
            if ["READONLY", "MOVED", "ERR wrong number of arguments"]
                .iter()
                .any(|server| text.starts_with(server))
            {
                continue;
            }
            for f in fragments(text) {
                if !code.contains(f) {
                    missing.push(format!("`{text}`: no source text holds `{f}`"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "documented, not sent:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn every_fixed_error_text_is_documented() {
        let docs = one_line(&format!("{COMMANDS_MD}\n{ATTACH_MD}"));
        let mut n = 0;
        let mut missing = Vec::new();
        for decl in THIS_FILE.split("pub const ").skip(1) {
            let Some(body) = decl.split_once("= \"").map(|(_, b)| b) else {
                continue;
            };
            let text: String = {
                let raw = &body[..body.find("\";").unwrap()];
                let mut s = String::new();
                let mut lines = raw.lines();
                if let Some(first) = lines.next() {
                    s.push_str(first.trim_end_matches('\\'));
                }
                for l in lines {
                    s.push_str(l.trim_start().trim_end_matches('\\'));
                }
                s
            };
            n += 1;
            if !docs.contains(&text) {
                missing.push(text);
            }
        }
        assert!(n > 40, "found only {n} texts");
        assert!(
            missing.is_empty(),
            "sent, not documented:\n{}",
            missing.join("\n")
        );
    }
}
