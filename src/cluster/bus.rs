//! The only home of the raw cluster-message API (docs/cluster-placement.md, "Canonical forwarding
//! over the cluster bus"): a node forwards a request about a canonical item to the primary holding
//! its slot, and that node answers with a message back. The asking client waits in a main-thread
//! table until exactly one of: the answer, the timeout, a failed send; a `Responder` always answers
//! once.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::raw::{c_char, c_uchar};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisError, RedisResult, RedisValue};

use super::wire::{self, Answer, Message, Request};
use crate::server::block::{Blocked, Completion, Fail};
use crate::{model::error, server::mainq, server::reply};

/// The module message type of libmember's requests and answers (types are per module).
const MSG_TYPE: u8 = 1;

/// Length of a cluster node id (`REDISMODULE_NODE_ID_LEN`); ids are not NUL-terminated.
const NODE_ID_LEN: usize = 40;

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

static SERVE: OnceLock<Serve> = OnceLock::new();

/// Registers the message receiver; requests are handed to `serve`. Call once at load, in
/// cluster mode only.
pub fn init(ctx: &Context, serve: Serve) {
    let _ = SERVE.set(serve);
    // SAFETY: module load, the module's context, a callback of the API's type.
    unsafe {
        raw::RedisModule_RegisterClusterMessageReceiver.unwrap()(ctx.ctx, MSG_TYPE, Some(receive))
    };
}

/// A client waiting for another node's answer.
struct Pending {
    blocked: Blocked,
    /// The node asked: only its answer counts.
    node: Vec<u8>,
    /// No answer is given to the client after this.
    deadline: Instant,
}

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
    let id = NEXT_ID.with(|n| {
        let id = n.get();
        n.set(id.wrapping_add(1));
        id
    });
    req.id = id;
    let payload = wire::encode(&Message::Request(req));
    if !send(ctx, node.as_bytes(), &payload) {
        blocked.finish(Box::new(Fail(error::FORWARD_UNREACHABLE.into())));
        return;
    }
    SENT.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + timeout;
    let node = node.as_bytes().to_vec();
    PENDING.with(|p| {
        p.borrow_mut().insert(
            id,
            Pending {
                blocked,
                node,
                deadline,
            },
        )
    });
    ctx.create_timer(timeout, expire, id);
}

/// The request's time is up: its client gets the timeout error, if still waiting.
fn expire(_ctx: &Context, id: u64) {
    if let Some(p) = PENDING.with(|p| p.borrow_mut().remove(&id)) {
        TIMEOUTS.fetch_add(1, Ordering::Relaxed);
        p.blocked
            .finish(Box::new(Fail(error::FORWARD_TIMEOUT.into())));
    }
}

/// An answer arrived: finish its client, unless it is gone or its time was up (an answer past
/// the deadline is dropped, so a forwarded ADD is acknowledged within the timeout or never).
fn answered(sender: &[u8], id: u64, a: Answer) {
    let p = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        match p.get(&id) {
            Some(w) if w.node == sender => p.remove(&id),
            _ => None,
        }
    });
    let Some(p) = p else {
        return;
    };
    if Instant::now() > p.deadline {
        TIMEOUTS.fetch_add(1, Ordering::Relaxed);
        p.blocked
            .finish(Box::new(Fail(error::FORWARD_TIMEOUT.into())));
        return;
    }
    p.blocked.finish(Box::new(Answered(Some(a))));
}

/// Another node's answer, replied through the blocked-client plumbing (and `reply.rs`).
struct Answered(Option<Answer>);

impl Completion for Answered {
    fn apply(&mut self, _ctx: &Context) {}
    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match self.0.take() {
            Some(Answer::Int(n)) => Ok(RedisValue::Integer(n)),
            Some(Answer::Explain(n, path)) => Ok(RedisValue::Array(vec![
                RedisValue::Integer(n),
                RedisValue::SimpleString(path),
            ])),
            Some(Answer::Error(text)) => Err(RedisError::String(text)),
            None => Err(RedisError::Str(error::INTERNAL)),
        }
    }
}

/// Where the answer to one received request goes. Answers exactly once: through `answer`, or
/// when dropped unanswered (from any thread) with `UNAVAILABLE`, on the main thread.
pub struct Responder {
    to: Vec<u8>,
    id: u64,
    done: bool,
}

impl Responder {
    /// Sends `result` (an integer, an EXPLAIN pair or an error) back to the asking node.
    /// Main thread.
    pub fn answer(mut self, ctx: &Context, result: RedisResult) {
        self.done = true;
        let a = match result {
            Ok(RedisValue::Integer(n)) => Answer::Int(n),
            Ok(RedisValue::Array(v)) => match v.as_slice() {
                [RedisValue::Integer(n), RedisValue::SimpleStringStatic(p)] => {
                    Answer::Explain(*n, p.to_string())
                }
                [RedisValue::Integer(n), RedisValue::SimpleString(p)] => {
                    Answer::Explain(*n, p.clone())
                }
                _ => Answer::Error(error::INTERNAL.into()),
            },
            Ok(_) => Answer::Error(error::INTERNAL.into()),
            Err(e) => Answer::Error(e.to_string()),
        };
        // A failed send leaves the asking client to its timeout.
        send(ctx, &self.to, &wire::encode(&Message::Answer(self.id, a)));
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let to = Responder {
            to: std::mem::take(&mut self.to),
            id: self.id,
            done: false,
        };
        self.done = true;
        mainq::post(Box::new(move |ctx| {
            to.answer(ctx, Err(RedisError::Str(error::WORKER_LOST)))
        }));
    }
}

/// Sends one message to the node whose id is `node`. False when the node is unknown or its
/// link is down.
fn send(ctx: &Context, node: &[u8], payload: &[u8]) -> bool {
    let (Ok(target), Ok(len)) = (CString::new(node), u32::try_from(payload.len())) else {
        return false;
    };
    // SAFETY: main thread; target is a NUL-terminated node id and payload outlives the call.
    let rc = unsafe {
        raw::RedisModule_SendClusterMessage.unwrap()(
            ctx.ctx,
            target.as_ptr(),
            MSG_TYPE,
            payload.as_ptr().cast::<c_char>(),
            len,
        )
    };
    rc == raw::REDISMODULE_OK as i32
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
            let to = Responder {
                to: sender,
                id: req.id,
                done: false,
            };
            match SERVE.get() {
                Some(serve) => mainq::with_db0(&ctx, |ctx| serve(ctx, req, to)),
                None => drop(to),
            }
        }
        Ok(Message::Answer(id, a)) => answered(&sender, id, a),
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
