//! The one list of the module's commands: one row per command, read by registration
//! (`register.rs`: name, entry point, flags), COMMAND INFO and COMMAND DOCS (`declare.rs`:
//! arity, routing key, summary, complexity, arguments), the `@member` ACL category (public
//! rows), redaction (where the items sit) and the hot path (the raw entry points of
//! MEMBER.EXISTS and MEMBER.MEXISTS).
//! A new command is one row here (and its section in docs/commands.md, which a test checks).

pub mod declare;
pub mod docs;
pub mod entry;
pub mod register;
pub mod row;

use redis_module::{Context, RedisResult, RedisString};

use crate::command::table::docs::Arg;
use crate::command::table::row::{Audience, Command, Item, Route, Run, UNDOCUMENTED};
use crate::command::{
    admin::alter, admin::create, admin::drop, admin::keys, admin::rebuild, batch, info, internal,
    lookup, write,
};
use crate::hooks::redact::Shape;

/// MEMBER.EXISTS <set> <item> [SCOPE <scope>]: its raw entry point reads this row.
pub const EXISTS: Command = Command {
    name: entry::NAME,
    run: Run::Raw(entry::entry),
    flags: "readonly fast",
    arity: -3,
    route: Route::ByItem(Item::Read),
    audience: Audience::Public,
    items: Some(entry::ITEMS),
    docs: UNDOCUMENTED,
}
.doc(
    "Tells whether an item is a member of a set",
    Some("O(1); one database read when neither the filter nor the cache decides"),
    &[SET, ITEM, SCOPE],
);

/// MEMBER.MEXISTS <set> [SCOPE <scope>] ITEMS <item> [<item> …]: the batch hot path, whose
/// raw entry point reads this row.
pub const MEXISTS: Command = Command {
    name: entry::MANY_NAME,
    run: Run::Raw(entry::mexists_entry),
    flags: "readonly",
    arity: -4,
    route: Route::BySet(Item::Read),
    audience: Audience::Public,
    items: Some(entry::MANY_ITEMS),
    docs: UNDOCUMENTED,
}
.doc(
    "Tells for each of up to 1000 items whether it is a member of a set",
    Some("O(N) where N is the number of items; one database query for those neither the filter nor the cache decides"),
    &[SET, SCOPE, ITEMS],
);

/// Every command of the module. Per-item commands route by the item (argv[2]), the catalog
/// commands (CREATE, ALTER, DROP), REBUILD, INFO, MEXISTS and MADD by the set name (argv[1]),
/// both declared NOT_KEY: never an ACL key. NODEINFO declares no key and runs on any node; the
/// internal commands declare one too, for the slot of what they replicate (`internal` below).
/// (MEXISTS and MADD: the receiving node splits the items by slot owner; INFO asks every
/// node.)
///
/// One row per line, its documentation on the next: a table reads better than rustfmt's one
/// argument per line.
#[rustfmt::skip]
pub const COMMANDS: &[Command] = &[
    public("member.create", create::create, "write deny-oom", -2, Route::BySet(Item::Insert), None)
        .doc("Creates a set, or attaches one to a table of the application", Some("O(N) where N is the number of rows already in the set's table, read off the main thread"), &[SET, ERROR, CAPACITY, CACHE_TTL, RECENT_TTL, NORMALIZE, TOKENIZE, SOURCE]),
    public("member.alter", alter::alter, "write deny-oom", -3, Route::BySet(Item::Update), None)
        .doc("Changes a set's settings without downtime, or moves a tokenized set to another key", Some("O(1); a new ERROR or CAPACITY rebuilds the filter off the main thread; ROTATE-KEY rewrites every row in the background"), &[SET, ALTERATION]),
    public("member.drop", drop::drop, "write", -2, Route::BySet(Item::Delete), None)
        .doc("Removes a set, and with DELETE-DATA its table", None, &[SET, Arg::pure("delete-data", "DELETE-DATA").optional()]),
    public("member.add", write::add, "write deny-oom", -3, Route::ByItem(Item::Insert), Some(Shape::Item))
        .doc("Makes an item a member of a set", Some("O(1), plus one database write"), &[SET, ITEM, SCOPE, EXPIRY]),
    EXISTS,
    public("member.del", write::del, "write", -3, Route::ByItem(Item::Delete), Some(Shape::Item))
        .doc("Removes an item from a set", Some("O(1), plus one database write"), &[SET, ITEM, SCOPE]),
    public("member.explain", lookup::explain, "readonly", -3, Route::ByItem(Item::Read), Some(Shape::Item))
        .doc("Tells whether an item is a member of a set, and which path decided it", Some("O(1); one database read when neither the filter nor the cache decides"), &[SET, ITEM, SCOPE]),
    MEXISTS,
    public("member.madd", batch::madd, "write deny-oom", -4, Route::BySet(Item::Insert), Some(Shape::Many))
        .doc("Makes up to 1000 items members of a set", Some("O(N) where N is the number of items, plus one database statement"), &[SET, SCOPE, EXPIRY, ITEMS]),
    public("member.info", info::wide::info, "readonly", 2, Route::BySet(Item::Read), None)
        .doc("Shows a set's settings, filter, rebuild, sync and counters, in a cluster over every node", Some("O(1); in a cluster O(N) where N is the number of nodes"), &[SET]),
    public("member.nodeinfo", info::nodeinfo, "readonly", -1, Route::Anywhere, None)
        .doc("Shows a set as the node that receives the call serves it, or lists the sets it serves", Some("O(1); without a set O(N) where N is the number of sets"), &[Arg::string("set").optional()]),
    public("member.rebuild", rebuild::rebuild, "write", -2, Route::BySet(Item::Update), None)
        .doc("Rebuilds a set's filter from its table, in a cluster on every primary", Some("O(N) where N is the number of members, read off the main thread"), &[SET, REBUILD_MODE]),
    public("member.keys", keys::keys, "admin", 2, Route::Anywhere, None)
        .doc("Reloads this node's ring of tokenization keys from its file, lists it, or lists every node's ring as reported to the database", Some("O(N) where N is the number of keys, or of nodes for NODES"), &[Arg::one_of("action", &[Arg::pure("reload", "RELOAD"), Arg::pure("list", "LIST"), Arg::pure("nodes", "NODES")])]),
    internal("member._add", internal::add, "write deny-oom", 4, Route::ByItem(Item::Insert))
        .doc("Internal (replication and AOF only): a committed ADD's filter and cache effects", None, &[SET, ENTITY, Arg::string("scope")]),
    internal("member._del", internal::del, "write", 4, Route::ByItem(Item::Delete))
        .doc("Internal (replication and AOF only): a committed DEL's cache invalidation", None, &[SET, ENTITY, Arg::string("scope")]),
    internal("member._load", internal::load, "write deny-oom", -3, Route::Anywhere)
        .doc("Internal (replication and AOF only): a whole filter, then the adds that landed while its rebuild streamed", None, &[KEY, Arg::string("payload"), Arg::string("adds").optional()]),
    internal("member._set", internal::set, "write", -7, Route::BySet(Item::Update))
        .doc("Internal (replication and AOF only): a set definition made on the primary", None, &[SET, Arg::double("error-rate"), Arg::integer("capacity"), Arg::integer("cache-ttl"), Arg::integer("recent-ttl"), Arg::string("normalize"), SET_REST]),
    internal("member._drop", internal::drop, "write", 2, Route::BySet(Item::Delete))
        .doc("Internal (replication and AOF only): a set dropped on the primary", None, &[SET]),
    internal("member._own", internal::own, "write", 2, Route::Anywhere)
        .doc("Internal (replication and AOF of earlier versions only): a slot sentinel key, now deleted", None, &[KEY]),
];

// The arguments the rows share. Names are unique within a command; `shown` is the placeholder
// docs/commands.md writes.
const SET: Arg = Arg::string("set");
const ITEM: Arg = Arg::string("item");
const SCOPE: Arg = Arg::string("scope").token("SCOPE").optional();
const ITEMS: Arg = Arg::string("item").token("ITEMS").multiple();
const SYNC: Arg = Arg::pure("sync", "SYNC").optional();
/// MEMBER.ALTER's two forms: settings, or an online key rotation (docs/security.md).
const ALTERATION: Arg = Arg::one_of(
    "alteration",
    &[
        Arg::block("settings", &[ERROR, CAPACITY, CACHE_TTL, RECENT_TTL, SYNC]),
        Arg::string("key-id").token("ROTATE-KEY").shown("id"),
    ],
);
const REBUILD_MODE: Arg = Arg::one_of(
    "mode",
    &[Arg::pure("sync", "SYNC"), Arg::pure("async", "ASYNC")],
)
.optional();
const EXPIRY: Arg = Arg::one_of(
    "expiry",
    &[
        Arg::integer("ttl").token("TTL").shown("s"),
        Arg::unix_time("expireat").token("EXPIREAT").shown("unix-s"),
    ],
)
.optional();
const ERROR: Arg = Arg::double("error").token("ERROR").shown("rate").optional();
const CAPACITY: Arg = Arg::integer("capacity")
    .token("CAPACITY")
    .shown("n")
    .optional();
const CACHE_TTL: Arg = Arg::integer("cache-ttl")
    .token("CACHE-TTL")
    .shown("s")
    .optional();
const RECENT_TTL: Arg = Arg::integer("recent-ttl")
    .token("RECENT-TTL")
    .shown("s")
    .optional();
const NORMALIZE: Arg = Arg::one_of(
    "normalize",
    &[
        Arg::pure("none", "none"),
        Arg::pure("lower", "lower"),
        Arg::pure("username", "username"),
    ],
)
.token("NORMALIZE")
.optional();
const TOKENIZE: Arg = Arg::one_of(
    "tokenize",
    &[
        Arg::pure("none", "none"),
        Arg::pure("hmac-sha256", "hmac-sha256"),
    ],
)
.token("TOKENIZE")
.optional();
/// CREATE's attach options (docs/attach.md).
const SOURCE: Arg = Arg::block(
    "source",
    &[
        Arg::string("table").token("SOURCE").shown("schema.table"),
        Arg::string("column").token("COLUMN").shown("col"),
        Arg::string("scope-column")
            .token("SCOPE-COLUMN")
            .shown("col")
            .optional(),
        Arg::one_of(
            "sync-mode",
            &[
                Arg::one_of("sync", &[Arg::pure("log", "log")]).token("SYNC"),
                Arg::string("updated-column")
                    .token("UPDATED-COLUMN")
                    .shown("col"),
            ],
        ),
    ],
)
.optional();
const ENTITY: Arg = Arg::string("entity");
const KEY: Arg = Arg::string("key");
/// `_SET`'s optional tail: the catalog identity, then a tokenized set's mode and key
/// fingerprint, then an attached set's source.
const SET_REST: Arg = Arg::block(
    "identity",
    &[
        Arg::string("id"),
        Arg::block(
            "tokenized",
            &[
                Arg::string("tokenize"),
                Arg::string("fingerprint"),
                Arg::block(
                    "source",
                    &[
                        Arg::string("schema"),
                        Arg::string("table"),
                        Arg::string("column"),
                        Arg::string("scope-column"),
                        Arg::string("updated-column"),
                        Arg::string("sync"),
                    ],
                )
                .optional(),
            ],
        )
        .optional(),
    ],
)
.optional();

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
        docs: UNDOCUMENTED,
    }
}

/// A replication and AOF command: not in `@member`, run without redaction. Those the
/// module replicates name a `NOT_KEY` routing argument (the entity, or the set's name), all
/// but `_LOAD` (below):
/// Valkey 9.1.2 fails every running atomic slot migration when a module replicates a command
/// without a key (`VM_Replicate` tests flags `clusterSlotByCommand` leaves unset for a keyless
/// command: "A module replicated a cross-slot command"); with one key the command has a slot.
/// Replicas and the AOF never route, so they run them as before. `_LOAD` stays keyless: a
/// migration streams a keyed command to its target, and the target's replicas would install
/// the source's whole filter; a rebuild that ends during an export fails that export instead
/// (docs/cluster.md, "Slot moves: classic and atomic").
const fn internal(
    name: &'static str,
    f: fn(&Context, Vec<RedisString>) -> RedisResult,
    flags: &'static str,
    arity: i32,
    route: Route,
) -> Command {
    Command {
        name,
        run: Run::Args(f),
        flags,
        arity,
        route,
        audience: Audience::Internal,
        items: None,
        docs: UNDOCUMENTED,
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
