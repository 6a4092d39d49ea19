//! The history of a chaos run: every client operation with its start, end, arguments and
//! reply, and every fault with its time. Times are microseconds since the run began.

use std::sync::Mutex;
use std::time::Instant;

/// The client operations: the module's three, and a row an application inserts into an
/// attached set's table itself, without telling the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Add,
    Del,
    Exists,
    /// An INSERT into an attached set's table, outside the module (docs/attach.md): a member
    /// from its commit (the op's end) in the database, and to be answered as one by the
    /// module from [`Rules::outside_us`](super::checker::Rules) after it.
    Insert,
}

impl Kind {
    pub fn command(self) -> &'static str {
        match self {
            Kind::Add => "MEMBER.ADD",
            Kind::Del => "MEMBER.DEL",
            Kind::Exists => "MEMBER.EXISTS",
            Kind::Insert => "INSERT (outside the module)",
        }
    }
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An integer reply: the answer.
    Int(i64),
    /// An error reply (its text), or a lost connection (`conn: …`): no answer.
    Failed(String),
}

impl Outcome {
    pub fn answer(&self) -> Option<i64> {
        match self {
            Outcome::Int(n) => Some(*n),
            Outcome::Failed(_) => None,
        }
    }

    /// A short class for counting: `UNAVAILABLE`, `LOADING`, `READONLY`, `conn`, `ERR …`.
    pub fn class(&self) -> String {
        match self {
            Outcome::Int(n) => format!("reply {n}"),
            Outcome::Failed(t) if t.starts_with("conn:") => "conn".into(),
            Outcome::Failed(t) => {
                let code = t.split_whitespace().next().unwrap_or("");
                if code == "ERR" {
                    // Keep a little more of ERR texts: they are the unexpected ones.
                    t.chars().take(60).collect()
                } else {
                    code.to_string()
                }
            }
        }
    }
}

/// One operation of one client on one item.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    pub kind: Kind,
    pub set: String,
    pub item: String,
    /// Port of the server it was sent to.
    pub port: u16,
    /// Sent to the replica (a read): judged with the replica's window ([`Rules::replica`]).
    ///
    /// [`Rules::replica`]: super::checker::Rules
    pub replica: bool,
    pub start: u64,
    pub end: u64,
    pub outcome: Outcome,
}

impl Op {
    pub fn describe(&self) -> String {
        let reply = match &self.outcome {
            Outcome::Int(n) => n.to_string(),
            Outcome::Failed(t) => format!("error {t:?}"),
        };
        format!(
            "client {} {} {} {} [{:.3} s, {:.3} s] on {}:{} -> {reply}",
            self.client,
            self.kind.command(),
            self.set,
            self.item,
            self.start as f64 / 1e6,
            self.end as f64 / 1e6,
            if self.replica { "replica " } else { "" },
            self.port
        )
    }
}

/// One fault tried: when it began and ended, its kind, what exactly was done, and whether it
/// was injected at all (a command that failed, or nothing there to break, injects nothing).
#[derive(Clone, Debug)]
pub struct Fault {
    pub start: u64,
    pub end: u64,
    pub kind: &'static str,
    pub detail: String,
    pub injected: bool,
}

/// Collects operations and faults from every thread.
pub struct Recorder {
    t0: Instant,
    ops: Mutex<Vec<Op>>,
    faults: Mutex<Vec<Fault>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            t0: Instant::now(),
            ops: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
        }
    }

    /// Microseconds since the run began.
    pub fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    pub fn op(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }

    pub fn fault(&self, f: Fault) {
        eprintln!(
            "chaos: fault {:>8.3} s {:<16} {}{}",
            f.start as f64 / 1e6,
            f.kind,
            if f.injected { "" } else { "NOT INJECTED: " },
            f.detail
        );
        self.faults.lock().unwrap().push(f);
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// How many operations were recorded so far.
    pub fn op_count(&self) -> usize {
        self.ops.lock().unwrap().len()
    }

    pub fn faults(&self) -> Vec<Fault> {
        self.faults.lock().unwrap().clone()
    }
}
