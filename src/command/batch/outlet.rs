//! Where a batch's answer goes once a worker has it: the client waiting on this node, or a
//! main-thread callback (one part of a MEXISTS or MADD split across the cluster's owners, or a
//! part another node asked this one for). Either way the completion's effects are applied once
//! on the main thread, and the answer is delivered exactly once, even when the worker drops it.

use redis_module::{Context, RedisError, RedisResult};

use crate::cluster::responder::Responder;
use crate::command::{complete_asking, AskFirst, Deliver};
use crate::model::error;
use crate::server::block::{Blocked, Completion};
use crate::server::mainq;

/// What a part's answer is handed to, on the main thread (DB 0 selected), after its effects.
pub type Then = Box<dyn FnOnce(&Context, RedisResult) + Send>;

/// The receiver of one batch's completion.
pub enum Outlet {
    Client(Blocked),
    Part(Part),
}

/// A callback receiver: `then` gets the reply; dropped unfinished, `fallback`'s effects are
/// applied and `then` gets `UNAVAILABLE`.
pub struct Part {
    then: Option<Then>,
    fallback: Option<Box<dyn Completion>>,
}

impl Outlet {
    /// A callback receiver.
    pub fn part(then: Then) -> Outlet {
        Outlet::Part(Part {
            then: Some(then),
            fallback: None,
        })
    }

    /// The same receiver, with `fallback` applied (and for a client, replied) if it is
    /// dropped unfinished.
    pub fn with_fallback(self, fallback: Box<dyn Completion>) -> Outlet {
        match self {
            Outlet::Client(b) => Outlet::Client(b.with_fallback(fallback)),
            Outlet::Part(mut p) => {
                p.fallback = Some(fallback);
                Outlet::Part(p)
            }
        }
    }

    /// Delivers `done`: its `apply` and `reply` run on the main thread. Callable from any
    /// thread.
    pub fn finish(self, mut done: Box<dyn Completion>) {
        match self {
            Outlet::Client(b) => b.finish(done),
            Outlet::Part(mut p) => {
                p.fallback = None;
                let then = p.then.take();
                mainq::post(Box::new(move |ctx| {
                    done.apply(ctx);
                    let reply = done.reply(ctx);
                    if let Some(then) = then {
                        then(ctx, reply);
                    }
                }));
            }
        }
    }
}

impl Outlet {
    /// Delivers `done` as [`Outlet::finish`] does, but only once the requests it asks first
    /// (a rotating set's twins in a cluster: `AskFirst`) have been answered. Callable from any
    /// thread.
    pub fn finish_asking<D: Completion + AskFirst>(self, mut done: D) {
        let deliver: Deliver = match self {
            Outlet::Client(b) => {
                let to = Responder::here(b);
                Box::new(move |ctx, reply| to.answer(ctx, reply))
            }
            Outlet::Part(mut p) => {
                p.fallback = None;
                let then = p.then.take();
                Box::new(move |ctx, reply| {
                    if let Some(then) = then {
                        then(ctx, reply);
                    }
                })
            }
        };
        mainq::post(Box::new(move |ctx| {
            complete_asking(ctx, &mut done, deliver)
        }));
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        let (then, fallback) = (self.then.take(), self.fallback.take());
        if then.is_none() && fallback.is_none() {
            return;
        }
        mainq::post(Box::new(move |ctx| {
            if let Some(mut f) = fallback {
                f.apply(ctx);
            }
            if let Some(then) = then {
                then(ctx, Err(RedisError::Str(error::WORKER_LOST)));
            }
        }));
    }
}
