//! The cluster-message API's receiving end and the requests this node waits on
//! (docs/cluster-placement.md, "Canonical forwarding over the cluster bus"; the raw send and
//! the answers are `responder.rs`): a node forwards a request about a canonical item to the
//! primary holding its slot, and that node answers with a message back; a node that received
//! MEMBER.MEXISTS or MEMBER.MADD asks each owner of the items' slots for its part, and one that
//! received MEMBER.REBUILD asks every primary to rebuild (docs/cluster-commands.md). The asking
//! client (or the cluster-wide call's part) waits in a main-thread table until exactly one of:
//! the answer, the timeout, a failed send, the asked node failing; a `Responder` always
//! answers once.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::raw::{c_char, c_uchar};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use redis_module::{raw, Context};

use super::peers::{node_up, NODE_ID_LEN};
use super::responder::{send, Answered, Responder, MSG_TYPE};
use super::wire::{self, Answer, Info, Many, Message, Rebuild, Request};
use crate::server::block::{Blocked, Fail};
use crate::server::timer::{self, TimerId};
use crate::{model::error, server::mainq, server::reply};

/// Requests sent to another node (INFO `forwarded_sent`).
pub static SENT: AtomicU64 = AtomicU64::new(0);
/// Sent requests whose client got the timeout: no answer within `member.db-timeout-ms`.
pub static TIMEOUTS: AtomicU64 = AtomicU64::new(0);
/// Requests received from other nodes and run here (INFO `forwarded_served`).
pub static SERVED: AtomicU64 = AtomicU64::new(0);
/// Requests received and refused: the slot was not held here, or the set not known yet.
pub static REFUSED: AtomicU64 = AtomicU64::new(0);

/// What runs a request received from another node (the command layer's).
pub type Serve = fn(&Context, Request, Responder);

/// What runs a cluster-wide rebuild's request received from another node (the command layer's).
pub type ServeRebuild = fn(&Context, Rebuild, Responder);

/// What runs one owner's part of a MEXISTS or MADD received from another node (the command
/// layer's).
pub type ServeMany = fn(&Context, Many, Responder);

/// What answers a cluster-wide MEMBER.INFO's request for this node's fields.
pub type ServeInfo = fn(&Context, Info, Responder);

/// The command layer's handlers of received messages.
pub struct Handlers {
    pub serve: Serve,
    pub rebuild: ServeRebuild,
    pub many: ServeMany,
    pub info: ServeInfo,
    /// Another node changed the catalog: read it again at the next sweep.
    pub catalog_changed: fn(),
}

static SERVE: OnceLock<Handlers> = OnceLock::new();

/// Registers the message receiver and the handlers it passes requests to. Call once at load,
/// in cluster mode only.
pub fn init(ctx: &Context, handlers: Handlers) {
    let _ = SERVE.set(handlers);
    // SAFETY: module load, the module's context, a callback of the API's type.
    unsafe {
        raw::RedisModule_RegisterClusterMessageReceiver.unwrap()(ctx.ctx, MSG_TYPE, Some(receive))
    };
}

/// Why an asked node's answer never came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// The message could not be sent (unknown node, link down).
    Unreachable,
    /// No answer within the request's timeout.
    Timeout,
    /// The node started the work (`Answer::Started`), then the cluster marked it failing or
    /// forgot it.
    Failed,
}

/// What a cluster-wide call does with one node's answer (main thread, called exactly once).
pub type Then = Box<dyn FnOnce(&Context, Result<Answer, Lost>)>;

/// Who waits for an answer: a blocked client, or a part of a cluster-wide call.
enum Waiter {
    Client(Blocked),
    Call(Then),
}

/// A waiter for another node's answer.
struct Pending {
    waiter: Waiter,
    /// The node asked: only its answer counts.
    node: Vec<u8>,
    /// No answer is given after this; `None` once the node said `Started`: then the wait
    /// lasts while the cluster holds the node up.
    deadline: Option<Instant>,
    /// The wait's timer (`expire`), stopped when the answer comes first
    /// (`server::timer`: a timer left to fire costs the server a context, and delays others).
    timer: TimerId,
}

/// How often a wait without deadline checks that its node is still up.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

thread_local! {
    static PENDING: RefCell<HashMap<u64, Pending>> = RefCell::new(HashMap::new());
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
}

/// How many clients wait on another node now.
pub fn pending() -> usize {
    PENDING.with(|p| p.borrow().len())
}

/// Sends `req` to node `node` and finishes `blocked` with the answer, or with `UNAVAILABLE`
/// if none arrives within `timeout` or the message cannot be sent. The request's id is
/// assigned here.
pub fn forward(ctx: &Context, node: &str, blocked: Blocked, mut req: Request, timeout: Duration) {
    if node == super::peers::my_id() {
        return serve_here(ctx, blocked, req);
    }
    let id = next_id();
    req.id = id;
    let payload = wire::encode(&Message::Request(req));
    wait_for(ctx, node, id, &payload, Waiter::Client(blocked), timeout);
}

/// A request about an item whose canonical slot is this node's own but not its raw slot's
/// (the one the command was routed by): served from a timer just after the command, as if it
/// had come from another node. While a command runs, the server finds every key the module
/// opens only in the slot of the command's routing argument, so the canonical slot's keys
/// (its exact-match entries) would not be found inside it.
pub fn serve_here(ctx: &Context, blocked: Blocked, req: Request) {
    ctx.create_timer(
        Duration::ZERO,
        |ctx, (req, blocked): (Request, Blocked)| match SERVE.get() {
            Some(h) => mainq::with_db0(ctx, |ctx| (h.serve)(ctx, req, Responder::here(blocked))),
            None => drop(blocked),
        },
        (req, blocked),
    );
}

/// Asks node `node` to rebuild its slots of `req.set`; `then` gets its answer (`Int(rows)`,
/// `Int(0)` for an ASYNC start, or an error line), or why none came: no answer within
/// `timeout` (a SYNC request's `Started` lifts the timeout while the node stays up), a failed
/// send, the node failing. The request's id is assigned here.
pub fn ask_rebuild(ctx: &Context, node: &str, mut req: Rebuild, timeout: Duration, then: Then) {
    let id = next_id();
    req.id = id;
    let payload = wire::encode(&Message::Rebuild(req));
    wait_for(ctx, node, id, &payload, Waiter::Call(then), timeout);
}

/// Asks node `node` to run `req` (a rotating set's twin effect: `Op::TwinAdd`, `Op::TwinDel`);
/// `then` gets its answer, or why none came within `timeout`. The request's id is assigned
/// here.
pub fn ask(ctx: &Context, node: &str, mut req: Request, timeout: Duration, then: Then) {
    let id = next_id();
    req.id = id;
    let payload = wire::encode(&Message::Request(req));
    wait_for(ctx, node, id, &payload, Waiter::Call(then), timeout);
}

/// Asks node `node` for its part of a MEXISTS or MADD; `then` gets its answer (`Ints`, one
/// per item in order, or an error line), or why none came within `timeout`. The request's id
/// is assigned here.
pub fn ask_many(ctx: &Context, node: &str, mut req: Many, timeout: Duration, then: Then) {
    let id = next_id();
    req.id = id;
    let payload = wire::encode(&Message::Many(req));
    wait_for(ctx, node, id, &payload, Waiter::Call(then), timeout);
}

/// Tells every other node that the catalog changed (this node just ran a CREATE, ALTER or
/// DROP), so each reads it again at its next sweep instead of at its next periodic check.
/// Best effort: a node the message misses still finds the change at that check.
pub fn catalog_changed(ctx: &Context) {
    let payload = wire::encode(&Message::CatalogChanged);
    let Ok(len) = u32::try_from(payload.len()) else {
        return;
    };
    // SAFETY: main thread; a null target broadcasts to every node; payload outlives the call.
    unsafe {
        raw::RedisModule_SendClusterMessage.unwrap()(
            ctx.ctx,
            std::ptr::null(),
            MSG_TYPE,
            payload.as_ptr().cast::<c_char>(),
            len,
        )
    };
}

/// Asks node `node` for its MEMBER.INFO fields of `req.set`; `then` gets its answer
/// (`Fields`, or an error line), or why none came within `timeout`.
pub fn ask_info(ctx: &Context, node: &str, mut req: Info, timeout: Duration, then: Then) {
    let id = next_id();
    req.id = id;
    let payload = wire::encode(&Message::Info(req));
    wait_for(ctx, node, id, &payload, Waiter::Call(then), timeout);
}

fn next_id() -> u64 {
    NEXT_ID.with(|n| {
        let id = n.get();
        n.set(id.wrapping_add(1));
        id
    })
}

/// Sends `payload` (request `id`) to `node` and enters its waiter in the table.
fn wait_for(ctx: &Context, node: &str, id: u64, payload: &[u8], waiter: Waiter, timeout: Duration) {
    if !send(ctx, node.as_bytes(), payload) {
        return give_up(ctx, waiter, Lost::Unreachable);
    }
    SENT.fetch_add(1, Ordering::Relaxed);
    let deadline = Some(Instant::now() + timeout);
    let node = node.as_bytes().to_vec();
    let timer = timer::after(ctx, timeout, expire, id);
    PENDING.with(|p| {
        p.borrow_mut().insert(
            id,
            Pending {
                waiter,
                node,
                deadline,
                timer,
            },
        )
    });
}

/// A waiter whose answer will not come.
fn give_up(ctx: &Context, waiter: Waiter, why: Lost) {
    if why == Lost::Timeout {
        TIMEOUTS.fetch_add(1, Ordering::Relaxed);
    }
    match waiter {
        Waiter::Client(blocked) => {
            let text = match why {
                Lost::Unreachable => error::FORWARD_UNREACHABLE,
                Lost::Timeout | Lost::Failed => error::FORWARD_TIMEOUT,
            };
            blocked.finish(Box::new(Fail(text.into())));
        }
        Waiter::Call(then) => then(ctx, Err(why)),
    }
}

/// The request's timer: past its deadline, its waiter gets the timeout; waiting without one
/// (after `Started`), it gets `Failed` once the cluster marks the node failing, else the
/// timer looks again later.
fn expire(ctx: &Context, id: u64) {
    let now = Instant::now();
    let (lost, again) = PENDING.with(|p| {
        let p = p.borrow();
        let Some(w) = p.get(&id) else {
            return (None, None);
        };
        match w.deadline {
            Some(d) if now >= d => (Some(Lost::Timeout), None),
            Some(d) => (None, Some(d - now)),
            None if !node_up(ctx, &w.node) => (Some(Lost::Failed), None),
            None => (None, Some(LIVENESS_CHECK)),
        }
    });
    if let Some(after) = again {
        let t = timer::after(ctx, after, expire, id);
        PENDING.with(|p| {
            if let Some(w) = p.borrow_mut().get_mut(&id) {
                w.timer = t;
            }
        });
    }
    if let Some(why) = lost {
        if let Some(p) = PENDING.with(|p| p.borrow_mut().remove(&id)) {
            give_up(ctx, p.waiter, why);
        }
    }
}

/// An answer arrived: finish its waiter, unless it is gone or its time was up (an answer past
/// the deadline is dropped, so a forwarded ADD is acknowledged within the timeout or never).
/// `Started` only lifts the deadline of a waiter of a cluster-wide call.
fn answered(ctx: &Context, sender: &[u8], id: u64, a: Answer) {
    let p = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        match p.get_mut(&id) {
            Some(w) if w.node == sender && a == Answer::Started => {
                if matches!(w.waiter, Waiter::Call(_))
                    && w.deadline.is_some_and(|d| Instant::now() <= d)
                {
                    w.deadline = None;
                }
                None
            }
            Some(w) if w.node == sender => p.remove(&id),
            _ => None,
        }
    });
    let Some(p) = p else {
        return;
    };
    // The timer has not fired (it would have removed or re-armed this wait, on this thread).
    let _ = timer::cancel::<u64>(ctx, p.timer);
    if p.deadline.is_some_and(|d| Instant::now() > d) {
        return give_up(ctx, p.waiter, Lost::Timeout);
    }
    match p.waiter {
        Waiter::Client(blocked) => blocked.finish(Box::new(Answered(Some(a)))),
        Waiter::Call(then) => then(ctx, Ok(a)),
    }
}

/// The receiver: a request is run here, an answer finishes its client.
///
/// # Safety
/// Called by the server on the main thread with a valid context, a sender id of
/// `NODE_ID_LEN` bytes and `len` bytes of payload.
unsafe extern "C" fn receive(
    ctx: *mut raw::RedisModuleCtx,
    sender_id: *const c_char,
    _type: u8,
    payload: *const c_uchar,
    len: u32,
) {
    let ctx = Context::new(ctx);
    if sender_id.is_null() || (payload.is_null() && len > 0) {
        return;
    }
    // SAFETY: the server passes its sender's id and the message's payload, live for the call.
    let (sender, bytes) = unsafe {
        (
            std::slice::from_raw_parts(sender_id.cast::<u8>(), NODE_ID_LEN).to_vec(),
            if len == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(payload, len as usize)
            },
        )
    };
    // A panic must not unwind into the server; whatever it owned answers by being dropped.
    let run = catch_unwind(AssertUnwindSafe(|| match wire::decode(bytes) {
        Ok(Message::Request(req)) => {
            let to = Responder::new(sender, req.id);
            match SERVE.get() {
                Some(h) => mainq::with_db0(&ctx, |ctx| (h.serve)(ctx, req, to)),
                None => drop(to),
            }
        }
        Ok(Message::Rebuild(req)) => {
            let to = Responder::new(sender, req.id);
            match SERVE.get() {
                Some(h) => (h.rebuild)(&ctx, req, to),
                None => drop(to),
            }
        }
        Ok(Message::Info(req)) => {
            let to = Responder::new(sender, req.id);
            match SERVE.get() {
                Some(h) => mainq::with_db0(&ctx, |ctx| (h.info)(ctx, req, to)),
                None => drop(to),
            }
        }
        Ok(Message::Many(req)) => {
            let to = Responder::new(sender, req.id);
            match SERVE.get() {
                Some(h) => mainq::with_db0(&ctx, |ctx| (h.many)(ctx, req, to)),
                None => drop(to),
            }
        }
        Ok(Message::Answer(id, a)) => answered(&ctx, &sender, id, a),
        Ok(Message::CatalogChanged) => {
            if let Some(h) = SERVE.get() {
                (h.catalog_changed)()
            }
        }
        Err(e) => reply::log(
            &ctx,
            reply::Level::Warning,
            &format!("libmember: cluster message dropped: {e}"),
        ),
    }));
    if run.is_err() {
        reply::log(
            &ctx,
            reply::Level::Warning,
            "libmember: internal error serving a cluster message (contained)",
        );
    }
}
