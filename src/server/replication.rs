//! What the primary sends its replicas and the AOF: derived-state effects and the internal
//! commands (`MEMBER._SET`, `MEMBER._LOAD`, ...) that `command/internal.rs` applies on the
//! other side. Main thread; held back, in order, while the server pauses replica traffic.

use redis_module::{Context, ContextFlags, RedisString};

use crate::model::set_def::{SetDef, SourceSync};

/// Sends a derived-state effect to replicas and the AOF (never the database write itself).
///
/// While the server pauses replica traffic (`CLIENT PAUSE WRITE`, `FAILOVER`), propagating
/// from a module aborts the server (valkey-io/valkey#1921): effects are then queued, in
/// order, and sent by `flush_replication` once the pause ends. The local effects and the
/// client's reply do not wait.
pub fn replicate(ctx: &Context, command: &str, args: &[&[u8]]) {
    let must_queue = replica_traffic_paused() || HELD.with(|h| !h.borrow().is_empty());
    if must_queue {
        let owned = args.iter().map(|a| a.to_vec()).collect();
        HELD.with(|h| h.borrow_mut().push((command.to_string(), owned)));
    } else {
        ctx.replicate(command, args);
    }
}

/// `replicate` for arguments that are already server strings: they are passed by reference,
/// so even a large payload is not copied on the main thread.
pub fn replicate_strings(ctx: &Context, command: &str, args: &[&RedisString]) {
    let must_queue = replica_traffic_paused() || HELD.with(|h| !h.borrow().is_empty());
    if must_queue {
        let owned = args.iter().map(|a| a.as_slice().to_vec()).collect();
        HELD.with(|h| h.borrow_mut().push((command.to_string(), owned)));
    } else {
        ctx.replicate(command, args);
    }
}

thread_local! {
    static HELD: std::cell::RefCell<Vec<(String, Vec<Vec<u8>>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn replica_traffic_paused() -> bool {
    // SAFETY: a plain query of server state, on the main thread.
    unsafe { redis_module::raw::RedisModule_AvoidReplicaTraffic.unwrap()() != 0 }
}

/// Sends the effects held back during a pause, once it is over (main-thread timer).
pub fn flush_replication(ctx: &Context) {
    if replica_traffic_paused() {
        return;
    }
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    for (command, args) in held {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        ctx.replicate(&command, args.as_slice());
    }
}

/// True when this context executes on behalf of the primary or while loading the AOF: the
/// only callers internal commands accept.
pub fn from_replication_or_load(ctx: &Context) -> bool {
    ctx.get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
}

/// Replicates a rebuilt filter as `MEMBER._LOAD`: `payload` was serialized before `adds`
/// (the journal) were folded into the filter now installed, so they travel with it.
pub fn replicate_built_filter(
    ctx: &Context,
    key: &RedisString,
    payload: &RedisString,
    adds: &[u128],
) {
    if adds.is_empty() {
        replicate_strings(ctx, "MEMBER._LOAD", &[key, payload]);
    } else {
        let blob: Vec<u8> = adds.iter().flat_map(|h| h.to_le_bytes()).collect();
        // Binary: not `create_string`, which goes through a C string and rejects NUL bytes.
        let blob = RedisString::create_from_slice(ctx.ctx, &blob);
        replicate_strings(ctx, "MEMBER._LOAD", &[key, payload, &blob]);
    }
}

/// Replicates a set definition as `MEMBER._SET`, with its catalog row's identity.
pub fn replicate_set(ctx: &Context, d: &SetDef, id: Option<i64>) {
    let mut fields = vec![
        d.name.clone(),
        d.error_rate.to_string(),
        d.capacity.to_string(),
        d.cache_ttl.to_string(),
        d.recent_ttl.to_string(),
        d.normalize.name().to_string(),
    ];
    match d.tokenize.fingerprint() {
        // An attached set: every field (unreadable to versions without SOURCE, which must not
        // serve it from a `member_<set>` table).
        _ if d.source.is_some() => {
            let src = d.source.as_ref().expect("checked");
            let updated = match &src.sync {
                SourceSync::Updated(u) => u.clone(),
                SourceSync::Log => String::new(),
            };
            fields.extend([
                id.map(|id| id.to_string()).unwrap_or_default(),
                d.tokenize.name().to_string(),
                d.tokenize.fingerprint().unwrap_or_default().to_string(),
                src.schema.clone(),
                src.table.clone(),
                src.column.clone(),
                src.scope_column.clone().unwrap_or_default(),
                updated,
                src.sync.name().to_string(),
            ]);
        }
        // The form earlier versions wrote and read.
        None => fields.extend(id.map(|id| id.to_string())),
        // Unreadable to versions without tokenization: they must not serve the set as plain.
        Some(fp) => fields.extend([
            id.map(|id| id.to_string()).unwrap_or_default(),
            d.tokenize.name().to_string(),
            fp.to_string(),
        ]),
    }
    let args: Vec<&[u8]> = fields.iter().map(|f| f.as_bytes()).collect();
    replicate(ctx, "MEMBER._SET", &args);
}
