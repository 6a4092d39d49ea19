//! A small cluster client for history tests: one connection per node, a slot table from
//! `CLUSTER SLOTS`, `MOVED` and `ASK` followed (`ASKING` first), nothing else retried, so a
//! recorded operation ran at most once and the node that answered it is known.

use std::collections::HashMap;
use std::time::Duration;

use redis::{Connection, ErrorKind, RedisError, RedisResult, Value};

/// CRC16-XMODEM, the cluster's key hash.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key (or an item: the module declares it the routing key), with the
/// `{tag}` rule: a non-empty tag between the first `{` and the next `}` is hashed instead.
pub fn keyslot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

/// The port in a `MOVED`/`ASK` target (`host:port`).
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit(':').next()?.parse().ok()
}

/// True for an error that says nothing reached or came back from the server.
pub fn is_conn_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_connection_refusal()
}

/// Routes per-item commands (`<CMD> <set> <item> …`) by the item's slot, and set-wide ones by
/// the set name's.
pub struct Router {
    /// Ports asked for the slot table, in order, until one answers.
    seeds: Vec<u16>,
    /// The primary port of each slot, 0 while unknown.
    table: Vec<u16>,
    conns: HashMap<u16, Connection>,
    /// Read/write timeout of every connection.
    timeout: Duration,
    /// The table must be read again before the next command (a node stopped answering).
    stale: bool,
}

impl Router {
    pub fn new(seeds: Vec<u16>, timeout: Duration) -> Router {
        Router {
            seeds,
            table: vec![0; 16384],
            conns: HashMap::new(),
            timeout,
            stale: true,
        }
    }

    fn conn(&mut self, port: u16) -> RedisResult<&mut Connection> {
        if !self.conns.contains_key(&port) {
            let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
            let con = c.get_connection_with_timeout(Duration::from_millis(500))?;
            con.set_read_timeout(Some(self.timeout))?;
            con.set_write_timeout(Some(self.timeout))?;
            self.conns.insert(port, con);
        }
        Ok(self.conns.get_mut(&port).unwrap())
    }

    /// Reads the slot table again if a node stopped answering since the last read. Call it
    /// before an operation's clock starts: it may wait on nodes that are down.
    pub fn prepare(&mut self) {
        if !self.stale {
            return;
        }
        for port in self.seeds.clone() {
            let Ok(c) = self.conn(port) else { continue };
            let Ok(v) = redis::cmd("CLUSTER").arg("SLOTS").query::<Vec<Value>>(c) else {
                self.conns.remove(&port);
                continue;
            };
            for r in v {
                let Value::Array(f) = r else { continue };
                let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(n))) =
                    (f.first(), f.get(1), f.get(2))
                else {
                    continue;
                };
                let Some(Value::Int(p)) = n.get(1) else {
                    continue;
                };
                for s in *first..=*last {
                    self.table[s as usize] = *p as u16;
                }
            }
            self.stale = false;
            return;
        }
    }

    /// Sends `args` (`args[2]` is the routing item) to the item's primary, following up to
    /// five redirections. Returns the port that gave the last reply (or failed) and the reply.
    /// A lost connection is returned as is (never retried: the command may have run).
    pub fn call(&mut self, args: &[&str]) -> (u16, RedisResult<Value>) {
        self.call_by(args[2], args)
    }

    /// [`Router::call`] routed by `route` (the set name, for MEXISTS and MADD).
    pub fn call_by(&mut self, route: &str, args: &[&str]) -> (u16, RedisResult<Value>) {
        let slot = keyslot(route.as_bytes()) as usize;
        let mut port = match self.table[slot] {
            0 => self.seeds[0],
            p => p,
        };
        let mut asking = false;
        let mut k = redis::cmd(args[0]);
        for a in &args[1..] {
            k.arg(*a);
        }
        for _ in 0..5 {
            let res = self.conn(port).and_then(|c| {
                if asking {
                    redis::cmd("ASKING").query::<Value>(c)?;
                }
                k.query::<Value>(c)
            });
            let target = match &res {
                Err(e) => e.redirect_node().and_then(|(a, _)| port_of(a)),
                Ok(_) => None,
            };
            match (res, target) {
                (Err(e), Some(to)) if e.kind() == ErrorKind::Moved => {
                    self.table[slot] = to;
                    port = to;
                    asking = false;
                }
                (Err(e), Some(to)) if e.kind() == ErrorKind::Ask => {
                    port = to;
                    asking = true;
                }
                (Err(e), _) if is_conn_error(&e) => {
                    self.conns.remove(&port);
                    self.stale = true;
                    return (port, Err(e));
                }
                (res, _) => return (port, res),
            }
        }
        (
            port,
            Err(RedisError::from((
                ErrorKind::ClientError,
                "more than five redirections",
            ))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::keyslot;

    #[test]
    fn keyslot_follows_the_cluster_rules() {
        // Values from the cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(keyslot(b"123456789"), 12739);
        assert_eq!(keyslot(b"foo"), 12182);
        assert_eq!(keyslot(b"{user1000}.following"), keyslot(b"user1000"));
        assert_ne!(keyslot(b"foo{}{bar}"), keyslot(b"bar"));
        assert_eq!(keyslot(b"foo{{bar}}zap"), keyslot(b"{bar"));
    }
}
