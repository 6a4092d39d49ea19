//! The bytes of a forwarded request and of its answer on the cluster bus ("Canonical forwarding
//! over the cluster bus" in docs/cluster-placement.md), of one owner's part of a MEXISTS or MADD
//! and of a cluster-wide rebuild's request (docs/cluster-commands.md): versioned,
//! length-prefixed, checked whole on the way in. Pure.

/// Layout version, the first byte of every message. A message of another version is refused
/// (its sender's client times out), never guessed at.
pub const VERSION: u8 = 1;

const KIND_REQUEST: u8 = 1;
const KIND_ANSWER: u8 = 2;
const KIND_REBUILD: u8 = 3;
const KIND_MANY: u8 = 4;
const KIND_INFO: u8 = 5;
const KIND_CATALOG: u8 = 6;

/// Most fields one `Answer::Fields` may carry (MEMBER.INFO has about 80).
pub const MAX_FIELDS: usize = 512;

/// Most items one `Many` message may carry: a MEXISTS or MADD names at most this many.
pub const MAX_MANY: usize = 1000;

/// What a forwarded request asks of the owner of the item's canonical slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Exists,
    Explain,
    Add,
    Del,
    /// A rotating set's write made elsewhere stored (or deleted) this twin, whose slot the
    /// receiver holds: apply its effects (filter bits, cache, replicas), no statement
    /// (docs/security.md, "In a cluster").
    TwinAdd,
    TwinDel,
    /// A rotating set's write elsewhere is about to store (or delete) this twin, whose slot
    /// the receiver holds: hold its mark (an ADD's recent mark, a DEL's) before the statement
    /// runs, for `expires_at` seconds (docs/security.md, "A gap the cluster history checker
    /// found").
    TwinBeginAdd,
    TwinBeginDel,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Exists => 0,
            Op::Explain => 1,
            Op::Add => 2,
            Op::Del => 3,
            Op::TwinAdd => 4,
            Op::TwinDel => 5,
            Op::TwinBeginAdd => 6,
            Op::TwinBeginDel => 7,
        }
    }

    fn from_code(c: u8) -> Option<Op> {
        Some(match c {
            0 => Op::Exists,
            1 => Op::Explain,
            2 => Op::Add,
            3 => Op::Del,
            4 => Op::TwinAdd,
            5 => Op::TwinDel,
            6 => Op::TwinBeginAdd,
            7 => Op::TwinBeginDel,
            _ => return None,
        })
    }
}

/// One request about one canonical item. `entity` and `scope` are final (the receiver does not
/// canonicalize again); `expires_at` is an ADD's expiry in unix seconds, or how long a
/// `TwinBegin*` mark holds, in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: u64,
    pub op: Op,
    pub set: String,
    pub entity: String,
    pub scope: String,
    pub expires_at: Option<f64>,
}

/// The owner's reply to a request, as the asking client will get it.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// `:n`
    Int(i64),
    /// `[n, path]` (MEMBER.EXPLAIN)
    Explain(i64, String),
    /// An error line, prefix included.
    Error(String),
    /// Not an answer yet: the asked node started the work and answers when it ends (a
    /// cluster-wide REBUILD SYNC); the asking node waits on while that node is up.
    Started,
    /// One integer per item of a `Many` request, in its order.
    Ints(Vec<i64>),
    /// A node's MEMBER.INFO fields of a set, in their order (an `Info` request's answer).
    Fields(Vec<(String, String)>),
}

/// MEMBER.INFO of one set, asked of every node by the node that received it: your fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Info {
    pub id: u64,
    pub set: String,
}

/// One owner's part of a MEXISTS (`op` = `Exists`) or MADD (`Add`): canonical (entity, scope)
/// pairs of slots the asked node holds, answered with `Answer::Ints` in the same order, or one
/// error for the whole part.
#[derive(Clone, Debug, PartialEq)]
pub struct Many {
    pub id: u64,
    pub op: Op,
    pub set: String,
    pub expires_at: Option<f64>,
    pub items: Vec<(String, String)>,
}

/// MEMBER.REBUILD of one set, asked of every primary by the node that received it: rebuild
/// the slots you own. `sync`: answer the rows loaded once the rebuild ends (after a
/// `Started`), else `Int(0)` once it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Rebuild {
    pub id: u64,
    pub set: String,
    pub sync: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Request(Request),
    Answer(u64, Answer),
    Rebuild(Rebuild),
    Many(Many),
    Info(Info),
    /// The catalog changed (a CREATE, ALTER or DROP ran on the sender): read it again now.
    /// Sent to every node; no answer.
    CatalogChanged,
}

/// Longest text field: set names are at most 40 bytes, canonical entities and scopes far less
/// than this, error lines are cut to it.
const MAX_TEXT: usize = u16::MAX as usize;

fn put_text(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

fn put_expiry(out: &mut Vec<u8>, expires_at: Option<f64>) {
    match expires_at {
        Some(at) => {
            out.push(1);
            out.extend_from_slice(&at.to_bits().to_le_bytes());
        }
        None => out.push(0),
    }
}

/// The bytes of `m`.
pub fn encode(m: &Message) -> Vec<u8> {
    let mut out = vec![VERSION];
    match m {
        Message::Request(r) => {
            out.push(KIND_REQUEST);
            out.extend_from_slice(&r.id.to_le_bytes());
            out.push(r.op.code());
            put_text(&mut out, &r.set);
            put_text(&mut out, &r.entity);
            put_text(&mut out, &r.scope);
            put_expiry(&mut out, r.expires_at);
        }
        Message::Answer(id, a) => {
            out.push(KIND_ANSWER);
            out.extend_from_slice(&id.to_le_bytes());
            match a {
                Answer::Int(n) => {
                    out.push(0);
                    out.extend_from_slice(&n.to_le_bytes());
                }
                Answer::Explain(n, path) => {
                    out.push(1);
                    out.extend_from_slice(&n.to_le_bytes());
                    put_text(&mut out, path);
                }
                Answer::Error(text) => {
                    out.push(2);
                    put_text(&mut out, text);
                }
                Answer::Started => out.push(3),
                Answer::Ints(v) => {
                    out.push(4);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    for n in v {
                        out.extend_from_slice(&n.to_le_bytes());
                    }
                }
                Answer::Fields(v) => {
                    out.push(5);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    for (k, x) in v {
                        put_text(&mut out, k);
                        put_text(&mut out, x);
                    }
                }
            }
        }
        Message::Rebuild(r) => {
            out.push(KIND_REBUILD);
            out.extend_from_slice(&r.id.to_le_bytes());
            put_text(&mut out, &r.set);
            out.push(u8::from(r.sync));
        }
        Message::CatalogChanged => out.push(KIND_CATALOG),
        Message::Info(r) => {
            out.push(KIND_INFO);
            out.extend_from_slice(&r.id.to_le_bytes());
            put_text(&mut out, &r.set);
        }
        Message::Many(m) => {
            out.push(KIND_MANY);
            out.extend_from_slice(&m.id.to_le_bytes());
            out.push(m.op.code());
            put_text(&mut out, &m.set);
            put_expiry(&mut out, m.expires_at);
            out.extend_from_slice(&(m.items.len() as u32).to_le_bytes());
            for (entity, scope) in &m.items {
                put_text(&mut out, entity);
                put_text(&mut out, scope);
            }
        }
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("truncated");
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn expiry(&mut self) -> Result<Option<f64>, &'static str> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let at = f64::from_bits(self.u64()?);
                if !at.is_finite() {
                    return Err("bad expiry");
                }
                Ok(Some(at))
            }
            _ => Err("bad expiry flag"),
        }
    }
    fn set_name(&mut self) -> Result<String, &'static str> {
        let set = self.text()?;
        if !crate::model::set_def::valid_set_name(set.as_bytes()) {
            return Err("bad set name");
        }
        Ok(set)
    }
    fn text(&mut self) -> Result<String, &'static str> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().unwrap()) as usize;
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| "text not UTF-8")?;
        if s.contains('\0') {
            return Err("text holds NUL");
        }
        Ok(s.to_string())
    }
}

/// Reads a message, all of it: anything short, long, of another version or otherwise odd is
/// an error (the message is dropped; the asking client times out).
pub fn decode(b: &[u8]) -> Result<Message, &'static str> {
    let mut r = Reader(b);
    if r.u8()? != VERSION {
        return Err("unknown message version");
    }
    let m = match r.u8()? {
        KIND_REQUEST => {
            let id = r.u64()?;
            let op = Op::from_code(r.u8()?).ok_or("unknown op")?;
            let set = r.set_name()?;
            let entity = r.text()?;
            if entity.is_empty() {
                return Err("empty entity");
            }
            let scope = r.text()?;
            let expires_at = r.expiry()?;
            Message::Request(Request {
                id,
                op,
                set,
                entity,
                scope,
                expires_at,
            })
        }
        KIND_ANSWER => {
            let id = r.u64()?;
            let a = match r.u8()? {
                0 => Answer::Int(r.u64()? as i64),
                1 => {
                    let n = r.u64()? as i64;
                    Answer::Explain(n, r.text()?)
                }
                2 => Answer::Error(r.text()?),
                3 => Answer::Started,
                4 => {
                    let n = r.u32()? as usize;
                    if n > MAX_MANY {
                        return Err("too many answers");
                    }
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        v.push(r.u64()? as i64);
                    }
                    Answer::Ints(v)
                }
                5 => {
                    let n = r.u32()? as usize;
                    if n > MAX_FIELDS {
                        return Err("too many fields");
                    }
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        let k = r.text()?;
                        v.push((k, r.text()?));
                    }
                    Answer::Fields(v)
                }
                _ => return Err("unknown answer"),
            };
            Message::Answer(id, a)
        }
        KIND_REBUILD => {
            let id = r.u64()?;
            let set = r.set_name()?;
            let sync = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err("bad sync flag"),
            };
            Message::Rebuild(Rebuild { id, set, sync })
        }
        KIND_INFO => {
            let id = r.u64()?;
            let set = r.set_name()?;
            Message::Info(Info { id, set })
        }
        KIND_CATALOG => Message::CatalogChanged,
        KIND_MANY => {
            let id = r.u64()?;
            let op = match Op::from_code(r.u8()?).ok_or("unknown op")? {
                op @ (Op::Exists | Op::Add) => op,
                _ => return Err("op not batched"),
            };
            let set = r.set_name()?;
            let expires_at = r.expiry()?;
            let n = r.u32()? as usize;
            if n == 0 || n > MAX_MANY {
                return Err("bad item count");
            }
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                let entity = r.text()?;
                if entity.is_empty() {
                    return Err("empty entity");
                }
                items.push((entity, r.text()?));
            }
            Message::Many(Many {
                id,
                op,
                set,
                expires_at,
                items,
            })
        }
        _ => return Err("unknown message kind"),
    };
    if !r.0.is_empty() {
        return Err("trailing bytes");
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: Op, expires_at: Option<f64>) -> Message {
        Message::Request(Request {
            id: u64::MAX - 7,
            op,
            set: "users".into(),
            entity: "straße ünï".into(),
            scope: "m1".into(),
            expires_at,
        })
    }

    #[test]
    fn every_message_round_trips() {
        let all = [
            request(Op::Exists, None),
            request(Op::Explain, None),
            request(Op::Add, Some(1_900_000_000.5)),
            request(Op::Del, None),
            request(Op::TwinAdd, None),
            request(Op::TwinDel, None),
            request(Op::TwinBeginAdd, Some(16.0)),
            request(Op::TwinBeginDel, Some(0.25)),
            Message::Answer(1, Answer::Int(1)),
            Message::Answer(2, Answer::Int(-3)),
            Message::Answer(3, Answer::Explain(0, "bloom-negative".into())),
            Message::Answer(4, Answer::Error("TRYAGAIN moving".into())),
            Message::Answer(5, Answer::Started),
            Message::Rebuild(Rebuild {
                id: 6,
                set: "users".into(),
                sync: true,
            }),
            Message::Rebuild(Rebuild {
                id: u64::MAX,
                set: "a_1".into(),
                sync: false,
            }),
            Message::Answer(7, Answer::Ints(vec![1, 0, 0, 1])),
            Message::Answer(8, Answer::Ints(vec![])),
            many(Op::Exists, None),
            many(Op::Add, Some(1_900_000_000.0)),
            Message::Info(Info {
                id: 12,
                set: "users".into(),
            }),
            Message::CatalogChanged,
            Message::Answer(
                13,
                Answer::Fields(vec![
                    ("name".into(), "users".into()),
                    ("sync_last_error".into(), String::new()),
                ]),
            ),
        ];
        for m in all {
            assert_eq!(decode(&encode(&m)), Ok(m.clone()), "{m:?}");
        }
    }

    fn many(op: Op, expires_at: Option<f64>) -> Message {
        Message::Many(Many {
            id: 11,
            op,
            set: "users".into(),
            expires_at,
            items: vec![("alice".into(), String::new()), ("bob".into(), "m1".into())],
        })
    }

    #[test]
    fn a_batch_part_is_refused_when_short_long_empty_or_not_a_batch_op() {
        let b = encode(&many(Op::Add, Some(5.0)));
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "many prefix of {n} bytes");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode(&long), Err("trailing bytes"));
        let with = |f: &dyn Fn(&mut Many)| {
            let Message::Many(mut m) = many(Op::Exists, None) else {
                unreachable!()
            };
            f(&mut m);
            decode(&encode(&Message::Many(m)))
        };
        assert_eq!(with(&|m| m.op = Op::Del), Err("op not batched"));
        assert_eq!(with(&|m| m.items.clear()), Err("bad item count"));
        assert_eq!(
            with(&|m| m.items = vec![("a".into(), String::new()); MAX_MANY + 1]),
            Err("bad item count")
        );
        assert_eq!(with(&|m| m.items[1].0 = String::new()), Err("empty entity"));
        assert_eq!(with(&|m| m.set = "No".into()), Err("bad set name"));
        let ints = encode(&Message::Answer(1, Answer::Ints(vec![0; MAX_MANY + 1])));
        assert_eq!(decode(&ints), Err("too many answers"));
        let field = ("a".to_string(), "1".to_string());
        let fields = Answer::Fields(vec![field; MAX_FIELDS + 1]);
        assert_eq!(
            decode(&encode(&Message::Answer(1, fields))),
            Err("too many fields")
        );
        let info = encode(&Message::Info(Info {
            id: 1,
            set: "users".into(),
        }));
        for n in 0..info.len() {
            assert!(decode(&info[..n]).is_err(), "info prefix of {n} bytes");
        }
    }

    #[test]
    fn anything_short_long_or_foreign_is_refused() {
        let b = encode(&request(Op::Add, Some(5.0)));
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode(&long), Err("trailing bytes"));
        let mut other = b.clone();
        other[0] = VERSION + 1;
        assert_eq!(decode(&other), Err("unknown message version"));
        let mut op = b.clone();
        op[10] = 9;
        assert_eq!(decode(&op), Err("unknown op"));
        let bad_set = Message::Request(Request {
            set: "Users".into(),
            ..match request(Op::Del, None) {
                Message::Request(r) => r,
                _ => unreachable!(),
            }
        });
        assert_eq!(decode(&encode(&bad_set)), Err("bad set name"));
        let nan = encode(&request(Op::Add, Some(f64::NAN)));
        assert_eq!(decode(&nan), Err("bad expiry"));
        let rebuild = |set: &str| {
            encode(&Message::Rebuild(Rebuild {
                id: 1,
                set: set.into(),
                sync: true,
            }))
        };
        let b = rebuild("users");
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "rebuild prefix of {n} bytes");
        }
        let mut flag = b.clone();
        *flag.last_mut().unwrap() = 2;
        assert_eq!(decode(&flag), Err("bad sync flag"));
        assert_eq!(decode(&rebuild("a b")), Err("bad set name"));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if i == 0 {
                        VERSION
                    } else {
                        (x >> 24) as u8
                    }
                })
                .collect();
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn long_error_text_is_cut_on_a_character_boundary() {
        let text = "é".repeat(40_000);
        let Ok(Message::Answer(_, Answer::Error(t))) =
            decode(&encode(&Message::Answer(9, Answer::Error(text))))
        else {
            panic!()
        };
        assert!(t.len() <= MAX_TEXT && t.chars().all(|c| c == 'é'));
    }
}
