//! MEMBER.ALTER <set> ROTATE-KEY <id>: starts the online rotation of a tokenized set's key
//! to the ring's key `<id>` (docs/security.md, "Rotating a tokenized set's key online").
//! Refused while any node of the database (`MEMBER.KEYS NODES`) lacks that key. The rotation
//! then goes on by itself on the primaries (`upkeep/rotation.rs`); MEMBER.INFO shows it.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::command::{block_timeout, may_block, set_name};
use crate::config::token_key;
use crate::db::sql;
use crate::db::sql::rotation::{self, StartRefused};
use crate::db::{pool, DbErr};
use crate::model::error;
use crate::server::block::{Blocked, Completion};
use crate::server::reply;
use crate::upkeep::node_report;

/// Whether `args` (a MEMBER.ALTER call) asks for a rotation.
pub fn asks(args: &[RedisString]) -> bool {
    args.get(2)
        .is_some_and(|a| a.as_slice().eq_ignore_ascii_case(b"ROTATE-KEY"))
}

pub fn rotate_key(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, set, _, id] = args.as_slice() else {
        return Err(RedisError::WrongArity);
    };
    let name = set_name(set)?;
    crate::sets::acl::check_set(ctx, &name, crate::sets::acl::Access::Write)?;
    let id = String::from_utf8_lossy(id.as_slice()).into_owned();
    let Some(fp) = token_key::fingerprint_of_id(&id) else {
        return Err(RedisError::String(format!(
            "ERR no key with id '{}' in this node's ring (MEMBER.KEYS LIST)",
            id.escape_default()
        )));
    };
    may_block(ctx)?;
    let fallback = Started {
        name: name.clone(),
        id: id.clone(),
        result: Err(DbErr::Unavailable(error::WORKER_LOST.into()).reply_text()),
    };
    let blocked = Blocked::block(ctx, block_timeout(), Box::new(fallback));
    // The start gives up on a busy table in time for its own reply (three quarters of the
    // client's wait), rather than starting after the client was told UNAVAILABLE.
    let deadline = std::time::Instant::now() + block_timeout() * 3 / 4;
    pool::run(move |db| {
        let result = start(db, &name, &id, &fp, deadline);
        blocked.finish(Box::new(Started { name, id, result }));
    });
    Ok(RedisValue::NoReply)
}

/// Every node holds the key, then the catalog starts the rotation: the old chain's length.
fn start(
    db: &mut crate::db::Db,
    name: &str,
    id: &str,
    fp: &str,
    deadline: std::time::Instant,
) -> Result<usize, String> {
    let missing = sql::nodes_lacking(db, sql::Needed::Key(fp), node_report::FRESH)
        .map_err(|e| e.reply_text())?;
    if !missing.is_empty() {
        return Err(format!(
            "ERR key '{id}' is not loaded on every node: {} lack it (run ids, MEMBER.KEYS NODES); \
             put it in their rings and run MEMBER.KEYS RELOAD on each",
            missing.join(", ")
        ));
    }
    let older = sql::nodes_older(db, node_report::FRESH).map_err(|e| e.reply_text())?;
    if !older.is_empty() {
        return Err(format!(
            "ERR {} run(s) a build of libmember older than this node's, which cannot follow a \
             key rotation (run ids, MEMBER.KEYS NODES): put this build on every node first",
            older.join(", ")
        ));
    }
    match rotation::start(db, name, fp, deadline).map_err(|e| e.reply_text())? {
        Ok(n) => Ok(n),
        Err(StartRefused::UnknownSet) => Err(error::UNKNOWN_SET.to_string()),
        Err(StartRefused::NotTokenized) => Err(format!(
            "ERR set '{name}' is not a tokenized set of its own table: it has no key to rotate"
        )),
        Err(StartRefused::Running(phase)) => Err(format!(
            "ERR set '{name}' is rotating already (phase {phase}): see MEMBER.INFO"
        )),
        Err(StartRefused::Busy) => Err(error::ROTATION_BUSY.to_string()),
        Err(StartRefused::InChain) => Err(format!(
            "ERR set '{name}' already uses key '{id}': a rotation moves it to a key it never used"
        )),
    }
}

struct Started {
    name: String,
    id: String,
    result: Result<usize, String>,
}

impl Completion for Started {
    fn apply(&mut self, ctx: &Context) {
        if let Ok(n) = self.result {
            reply::log(
                ctx,
                reply::Level::Notice,
                &format!(
                    "libmember: rotation of set '{}' to key '{}' started (from a chain of {n} \
                     key(s)): rewriting every row in place to the new form",
                    self.name, self.id
                ),
            );
            crate::upkeep::rotation::started_here(&self.name);
            crate::sets::catalog::reread();
        }
    }

    fn reply(&mut self, _ctx: &Context) -> RedisResult {
        match &self.result {
            Ok(_) => Ok(RedisValue::SimpleStringStatic("OK")),
            Err(e) => Err(RedisError::String(e.clone())),
        }
    }
}
