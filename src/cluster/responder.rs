//! The sending end of the cluster bus: a received request's one answer (`Responder`), and the
//! raw send of one message to one node. Receiving, and the table of requests this node waits
//! on, are `bus.rs`.

use std::ffi::CString;
use std::os::raw::c_char;

use redis_module::{raw, Context, RedisError, RedisResult, RedisValue};

use super::wire::{self, Answer, Message};
use crate::server::block::{Blocked, Completion};
use crate::{model::error, server::mainq};

/// The module message type of libmember's requests and answers (types are per module).
pub(super) const MSG_TYPE: u8 = 1;

/// Where the answer to one received request goes. Answers exactly once: through `answer`, or
/// when dropped unanswered (from any thread) with `UNAVAILABLE`, on the main thread.
pub struct Responder {
    to: To,
    id: u64,
    done: bool,
}

/// Who asked.
enum To {
    /// Another node, by id.
    Node(Vec<u8>),
    /// A client of this node (`forward` to this node itself), answered directly.
    Here(Option<Blocked>),
}

impl Responder {
    /// The one answer owed to request `id` of node `to`.
    pub(super) fn new(to: Vec<u8>, id: u64) -> Responder {
        Responder {
            to: To::Node(to),
            id,
            done: false,
        }
    }

    /// The answer owed to a client of this node blocked in `blocked`; dropped unanswered, the
    /// client gets the handle's fallback.
    pub fn here(blocked: Blocked) -> Responder {
        Responder {
            to: To::Here(Some(blocked)),
            id: 0,
            done: false,
        }
    }

    /// The blocked client of a request this node serves for one of its own clients, to be
    /// finished directly (from a worker too); else this responder back.
    pub fn into_local(mut self) -> Result<Blocked, Responder> {
        match &mut self.to {
            To::Here(b) => {
                self.done = true;
                Ok(b.take()
                    .expect("a local responder holds its client until answered"))
            }
            To::Node(_) => Err(self),
        }
    }

    /// Sends `result` (an integer, an EXPLAIN pair, an array of integers or an error) back to
    /// the asking node, or to the client of this node that asked. Main thread.
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
                all => match all
                    .iter()
                    .map(|v| match v {
                        RedisValue::Integer(n) => Some(*n),
                        _ => None,
                    })
                    .collect::<Option<Vec<i64>>>()
                {
                    Some(ints) => Answer::Ints(ints),
                    None => Answer::Error(error::INTERNAL.into()),
                },
            },
            Ok(_) => Answer::Error(error::INTERNAL.into()),
            Err(e) => Answer::Error(e.to_string()),
        };
        self.deliver(ctx, a);
    }

    /// Sends this node's MEMBER.INFO fields back to the asking node. Main thread.
    pub fn fields(mut self, ctx: &Context, fields: Vec<(String, String)>) {
        self.done = true;
        self.deliver(ctx, Answer::Fields(fields));
    }

    /// Tells the asking node the work started and the answer follows when it ends: it then
    /// waits while this node is up instead of for its timeout. Main thread.
    pub fn started(&self, ctx: &Context) {
        if let To::Node(to) = &self.to {
            send(
                ctx,
                to,
                &wire::encode(&Message::Answer(self.id, Answer::Started)),
            );
        }
    }

    fn deliver(&mut self, ctx: &Context, a: Answer) {
        match &mut self.to {
            // A failed send leaves the asking client to its timeout.
            To::Node(to) => {
                send(ctx, to, &wire::encode(&Message::Answer(self.id, a)));
            }
            To::Here(b) => {
                if let Some(b) = b.take() {
                    b.finish(Box::new(Answered(Some(a))));
                }
            }
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        // A local client's handle answers with its fallback by being dropped (any thread).
        let To::Node(to) = &mut self.to else {
            return;
        };
        let to = Responder::new(std::mem::take(to), self.id);
        mainq::post(Box::new(move |ctx| {
            to.answer(ctx, Err(RedisError::Str(error::WORKER_LOST)))
        }));
    }
}

/// Another node's answer, replied through the blocked-client plumbing (and `reply.rs`).
pub(super) struct Answered(pub(super) Option<Answer>);

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
            Some(Answer::Ints(v)) => Ok(RedisValue::Array(
                v.into_iter().map(RedisValue::Integer).collect(),
            )),
            Some(Answer::Fields(_)) => Err(RedisError::Str(error::INTERNAL)),
            Some(Answer::Started) | None => Err(RedisError::Str(error::INTERNAL)),
        }
    }
}

/// Sends one message to the node whose id is `node`. False when the node is unknown or its
/// link is down.
pub(super) fn send(ctx: &Context, node: &[u8], payload: &[u8]) -> bool {
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
