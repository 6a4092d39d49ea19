//! A real cluster for the cluster tests: 3 primaries and 3 replicas of the server under test
//! (`valkey-server`, or `MEMBER_SERVER`), each with libmember loaded and pointed at one fresh
//! database, joined by `<cli> --cluster create … --cluster-replicas 1`. Started once per test
//! process ([`Cluster::shared`]) and killed with it, like every server of the harness; a second
//! one, started on first use too, is for the tests that move or mark a slot
//! ([`Cluster::shared_exclusive`]); a test or the benchmark may start its own
//! ([`Cluster::start`], [`Cluster::start_primaries_only`]).

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use redis::{Connection, Value};

use super::member::{cmd, ok, wait_catalog_loaded};
use super::{free_port, fresh_db, server_binary, start_with, wait_until, TestDb, Valkey};

/// A test that stalls a node of the shared cluster (SIGSTOP) holds this exclusively
/// ([`stall_exclusive`]); the tests that would see that stall as a wrong timeout hold it shared
/// ([`stall_shared`]).
static STALL: RwLock<()> = RwLock::new(());

/// `slot` marked migrating from `from` to `to` (`CLUSTER SETSLOT … IMPORTING` on `to`, then
/// `… MIGRATING` on `from`), as a reshard's first step, with no key moved. Dropped, the slot is
/// STABLE on both again, whatever the test did meanwhile, for the other tests of the cluster.
pub struct Migrating<'a> {
    from: &'a Node,
    to: &'a Node,
    slot: u16,
}

impl<'a> Migrating<'a> {
    pub fn start(from: &'a Node, to: &'a Node, slot: u16) -> Self {
        let id = |n: &Node| -> String {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut n.conn())
                .unwrap()
        };
        let mark = |n: &Node, state: &str, other: &Node| {
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id(other))
                .query::<()>(&mut n.conn())
                .unwrap_or_else(|e| panic!("SETSLOT {slot} {state} on {}: {e}", n.addr()));
        };
        // Made first, so that a SETSLOT that fails still leaves the slot stable.
        let m = Migrating { from, to, slot };
        mark(to, "IMPORTING", from);
        mark(from, "MIGRATING", to);
        m
    }
}

impl Drop for Migrating<'_> {
    fn drop(&mut self) {
        for n in [self.from, self.to] {
            let _: redis::RedisResult<()> = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(self.slot)
                .arg("STABLE")
                .query(&mut n.conn());
        }
    }
}

pub fn stall_shared() -> RwLockReadGuard<'static, ()> {
    STALL.read().unwrap_or_else(|e| e.into_inner())
}

pub fn stall_exclusive() -> RwLockWriteGuard<'static, ()> {
    STALL.write().unwrap_or_else(|e| e.into_inner())
}

/// Sets a config on one node for as long as this lives, then puts the old value back (even if
/// the test fails half-way).
pub struct ConfigFor<'a> {
    node: &'a Node,
    name: &'static str,
    old: String,
}

impl<'a> ConfigFor<'a> {
    pub fn set(node: &'a Node, name: &'static str, value: &str) -> Self {
        let mut c = node.conn();
        let v: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(&mut c)
            .unwrap();
        ok(&mut c, &["CONFIG", "SET", name, value]);
        ConfigFor {
            node,
            name,
            old: v[1].clone(),
        }
    }
}

impl Drop for ConfigFor<'_> {
    fn drop(&mut self) {
        let _ = cmd(
            &mut self.node.conn(),
            &["CONFIG", "SET", self.name, &self.old],
        );
    }
}

/// The longest [`while_stopped`] holds a node: under the shared cluster's
/// `cluster-node-timeout` (5 s), so no other node ever flags it as failing.
const HOLD_MAX: Duration = Duration::from_secs(4);

/// Runs `f` while `node` is stopped (SIGSTOP; SIGCONT once `f` returns), so the node answers
/// nothing, on a client link or the cluster bus, for exactly as long as `f` needs, however
/// slow the machine. `f` starts once the node leaves a PING unanswered for 100 ms (a probe
/// connected beforehand: a new connection's handshake would itself wait for the node); this
/// returns once the node answers again. Should `f` outlast [`HOLD_MAX`], the node is let go
/// then and the test fails saying so, rather than let a failover start. Hold
/// [`stall_exclusive`] around it.
pub fn while_stopped<R>(node: &Node, f: impl FnOnce() -> R) -> R {
    let mut probe = node.conn();
    probe
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let pid = node.vk.child.id() as libc::pid_t;
    // SAFETY: plain syscalls on our own child.
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGSTOP) },
        0,
        "SIGSTOP {}",
        node.addr()
    );
    let (done, until_done) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        // Done (or `f` panicked and dropped the sender): let the node go at once.
        let held_too_long = matches!(
            until_done.recv_timeout(HOLD_MAX),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        );
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        held_too_long
    });
    assert!(
        wait_until(Duration::from_secs(10), || redis::cmd("PING")
            .query::<String>(&mut probe)
            .is_err()),
        "{} never stopped answering",
        node.addr()
    );
    let out = f();
    let _ = done.send(());
    let held_too_long = watchdog.join().unwrap();
    assert!(
        !held_too_long,
        "{} was let go after {HOLD_MAX:?}, before the call under test returned",
        node.addr()
    );
    let mut awake = node.conn();
    let _: String = redis::cmd("PING").query(&mut awake).unwrap();
    out
}

/// How many primaries; each gets one replica.
pub const PRIMARIES: usize = 3;

/// One server of the cluster.
pub struct Node {
    pub vk: Valkey,
    /// `CLUSTER MYID`.
    pub id: String,
    pub primary: bool,
    /// For a replica, the port of its primary.
    pub primary_port: Option<u16>,
    /// Killed by a test and not started again.
    pub down: bool,
}

impl Node {
    pub fn port(&self) -> u16 {
        self.vk.port()
    }

    /// `127.0.0.1:<port>`, as MOVED and ASK name it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    pub fn conn(&self) -> Connection {
        self.vk.conn()
    }
}

/// A slot range and the node serving it, from `CLUSTER SLOTS`.
#[derive(Clone, Debug)]
pub struct SlotRange {
    pub first: u16,
    pub last: u16,
    pub primary_port: u16,
}

/// A shared cluster, with the test's hold on its slot layout (`()` for [`Cluster::shared`],
/// whose layout never changes).
pub struct Shared<G> {
    cluster: &'static Cluster,
    _layout: G,
}

impl<G> std::ops::Deref for Shared<G> {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        self.cluster
    }
}

pub struct Cluster {
    /// The fresh database of the shared PostgreSQL it runs on (`None`: on a database of the
    /// caller's, [`Cluster::start_primaries_on`]).
    db: Option<TestDb>,
    pub nodes: Vec<Node>,
    /// The connection kept for the harness's own questions ([`Cluster::keyslot`],
    /// [`Cluster::slots`]), with the port it goes to.
    kept: Mutex<Option<(u16, Connection)>>,
}

/// The cluster-mode CLI that goes with the server under test.
pub fn cli_binary() -> String {
    if server_binary().contains("redis") {
        "redis-cli".into()
    } else {
        "valkey-cli".into()
    }
}

/// `<cli> -c -p <port> args…` (following redirects), its standard output trimmed.
pub fn cli_follow(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new(cli_binary())
        .args(["-p", &port.to_string(), "-c"])
        .args(args)
        .output()
        .expect("run the cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// (pid, dir) of every node, for the exit handler: statics are never dropped.
pub(super) static NODES: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// The configs of the shared cluster's nodes besides the cluster's own plumbing.
const SHARED_CONFIGS: [(&str, &str); 3] = [
    ("cluster-node-timeout", "5000"),
    ("member.workers", "1"),
    // DEBUG RELOAD: filters round-trip through the RDB aux field.
    ("enable-debug-command", "yes"),
];

extern "C" fn kill_nodes_at_exit() {
    let Ok(mut nodes) = NODES.lock() else {
        return;
    };
    for (pid, dir) in nodes.drain(..) {
        // SAFETY: plain syscalls on our own children.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl Cluster {
    /// The process's cluster, started on first use (a few seconds), ready: every node reports
    /// `cluster_state:ok` and all 16384 slots, every replica is linked to its primary, and the
    /// module's catalog is loaded everywhere.
    ///
    /// No test moves a slot of this cluster, marks one migrating, or does anything else that
    /// makes a node accept a slot afresh (any `CLUSTER SETSLOT`, `DEBUG RELOAD`, a replica's
    /// dropped link): its slot layout is the one `--cluster create` made for as long as the
    /// process runs, every slot stays ready once ready, and any number of tests use it at
    /// once and may assert that a negative comes from the filter.
    pub fn shared() -> Shared<()> {
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        Shared {
            cluster: CLUSTER.get_or_init(|| Cluster::start(&[])),
            _layout: (),
        }
    }

    /// A second cluster like [`Cluster::shared`] (3 primaries, 3 replicas, the same configs),
    /// for the tests that move a slot, mark one migrating, or make a node accept slots afresh
    /// (which makes them wait out a new grace): one such test at a time, each leaving every
    /// slot where and as it found it. Kept apart from the shared one, so no test
    /// of that one ever waits for a slot move, nor a slot move for every test using it.
    pub fn shared_exclusive() -> Shared<MutexGuard<'static, ()>> {
        static TURN: Mutex<()> = Mutex::new(());
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        Shared {
            cluster: CLUSTER.get_or_init(|| Cluster::start(&[])),
            _layout: turn,
        }
    }

    /// A cluster of the caller's own, ready like [`Cluster::shared`], for tests that reshard it
    /// or kill its nodes. `configs` are given to every node and win over the shared cluster's
    /// (`cluster-node-timeout` 5000, `member.workers` 1, `enable-debug-command` yes). Its
    /// database is a fresh one.
    pub fn start(configs: &[(&str, &str)]) -> Cluster {
        Self::start_with_replicas(configs, 1)
    }

    /// [`Cluster::start`] with the 3 primaries alone, no replicas: for the benchmark, which
    /// measures primaries and wants no idle server sharing the CPUs or the memory figures.
    pub fn start_primaries_only(configs: &[(&str, &str)]) -> Cluster {
        Self::start_with_replicas(configs, 0)
    }

    /// [`Cluster::start_primaries_only`] on the database at `pg_url` instead of a fresh one of
    /// the shared PostgreSQL: for the failover tests, whose database is a primary with its
    /// standby (`failover::PgPair`), which no other test may share.
    pub fn start_primaries_on(pg_url: &str, configs: &[(&str, &str)]) -> Cluster {
        Self::start_on(Some(pg_url), configs, 0)
    }

    /// `replicas` per primary: 0 or 1.
    fn start_with_replicas(configs: &[(&str, &str)], replicas: usize) -> Cluster {
        Self::start_on(None, configs, replicas)
    }

    fn start_on(pg_url: Option<&str>, configs: &[(&str, &str)], replicas: usize) -> Cluster {
        let db = pg_url.is_none().then(fresh_db);
        let url = match (&db, pg_url) {
            (Some(db), _) => db.url(),
            (None, Some(u)) => u.to_string(),
            (None, None) => unreachable!(),
        };
        let mut own: Vec<(&str, &str)> = SHARED_CONFIGS
            .iter()
            .filter(|(k, _)| !configs.iter().any(|(c, _)| c == k))
            .copied()
            .collect();
        own.extend_from_slice(configs);
        let mut nodes = Vec::new();
        for _ in 0..PRIMARIES * (1 + replicas) {
            // The bus port defaults to port + 10000, which may not exist: pick one.
            let bus = free_port().to_string();
            let mut cfg = vec![
                ("cluster-enabled", "yes"),
                ("cluster-port", bus.as_str()),
                // Replicas sync at once instead of after the default 5 s wait.
                ("repl-diskless-sync-delay", "0"),
            ];
            cfg.extend_from_slice(&own);
            let vk = start_with(&url, &cfg);
            NODES
                .lock()
                .unwrap()
                .push((vk.pid(), vk.dir().to_path_buf()));
            let id: String = redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut vk.conn())
                .expect("CLUSTER MYID");
            nodes.push(Node {
                vk,
                id,
                primary: false,
                primary_port: None,
                down: false,
            });
        }
        static AT_EXIT: OnceLock<()> = OnceLock::new();
        AT_EXIT.get_or_init(|| {
            // SAFETY: registering a plain extern "C" fn.
            unsafe {
                libc::atexit(kill_nodes_at_exit);
            }
        });

        let out = Command::new(cli_binary())
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(Node::addr))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("run {} --cluster create: {e}", cli_binary()));
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && said.contains("[OK] All 16384 slots covered"),
            "{} --cluster create failed: {}\n{said}\n{}",
            cli_binary(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );

        let count = nodes.len();
        for n in &mut nodes {
            let mut c = n.conn();
            let ready = wait_until(Duration::from_secs(30), || {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&format!("cluster_known_nodes:{count}"))
            });
            assert!(ready, "node {} never saw the whole cluster", n.addr());
            let role: Vec<Value> = redis::cmd("ROLE").query(&mut c).expect("ROLE");
            n.primary = matches!(&role[0], Value::BulkString(b) if b == b"master");
            if !n.primary {
                let mut info = String::new();
                let linked = wait_until(Duration::from_secs(30), || {
                    info = redis::cmd("INFO")
                        .arg("replication")
                        .query(&mut c)
                        .unwrap_or_default();
                    info.contains("master_link_status:up")
                });
                assert!(linked, "replica {} never linked to its primary", n.addr());
                n.primary_port = info
                    .lines()
                    .find_map(|l| l.strip_prefix("master_port:"))
                    .and_then(|p| p.trim().parse().ok());
            }
            assert!(
                wait_catalog_loaded(&mut c, Duration::from_secs(20)),
                "catalog never loaded on {}:\n{}",
                n.addr(),
                n.vk.log()
            );
        }
        let cluster = Cluster {
            db,
            nodes,
            kept: Mutex::new(None),
        };
        assert_eq!(cluster.primaries().count(), PRIMARIES);
        let layout = cluster.slots();
        assert_eq!(layout.len(), PRIMARIES, "{layout:?}");
        for p in cluster.primaries() {
            let linked = cluster
                .replicas()
                .filter(|r| r.primary_port == Some(p.port()))
                .count();
            assert_eq!(linked, replicas, "replicas of {}", p.addr());
        }
        cluster
    }

    /// The primaries that are up.
    /// The cluster's database (not for [`Cluster::start_primaries_on`]'s, which the caller has).
    pub fn db(&self) -> &TestDb {
        self.db
            .as_ref()
            .expect("a cluster on the caller's own database has no TestDb")
    }

    pub fn primaries(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.primary && !n.down)
    }

    /// The replicas that are up.
    pub fn replicas(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| !n.primary && !n.down)
    }

    pub fn node_by_port(&self, port: u16) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// `CLUSTER SLOTS` as the first primary sees it. Replicas are listed there only once gossip
    /// has carried their replication offset (seconds after start): use [`Cluster::replica_of`].
    pub fn slots(&self) -> Vec<SlotRange> {
        let mut q = redis::cmd("CLUSTER");
        q.arg("SLOTS");
        parse_slots(self.ask(self.primaries().next().unwrap().port(), &q, "CLUSTER SLOTS"))
    }

    /// `q`'s reply from the node on `port`, over the one connection the harness keeps to the
    /// cluster (a new connection for each question made thousands of them per test, slow on a
    /// busy machine). A kept connection that fails (its node restarted, say) is replaced once.
    fn ask<T: redis::FromRedisValue>(&self, port: u16, q: &redis::Cmd, what: &str) -> T {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = kept.as_mut().filter(|(p, _)| *p == port) {
            if let Ok(v) = q.query(c) {
                return v;
            }
        }
        *kept = None;
        let mut c = self.node_by_port(port).conn();
        let v = q
            .query(&mut c)
            .unwrap_or_else(|e| panic!("{what} on 127.0.0.1:{port}: {e}"));
        *kept = Some((port, c));
        v
    }

    /// Waits until every node answers "absent" from the filter for every slot it serves
    /// (MEMBER.NODEINFO: `cluster_slots_ready` equals `cluster_slots_owned`).
    pub fn wait_ready(&self, set: &str) {
        for n in &self.nodes {
            let mut c = n.conn();
            let field = |c: &mut Connection, name: &str| super::member::set_info(c, set, name);
            let ready = wait_until(Duration::from_secs(30), || {
                // A failed read equals nothing, so it is a "not yet".
                field(&mut c, "cluster_slots_owned") == field(&mut c, "cluster_slots_ready")
            });
            assert!(
                ready,
                "{set} never ready on {}: owned {:?}, ready {:?}",
                n.addr(),
                field(&mut c, "cluster_slots_owned"),
                field(&mut c, "cluster_slots_ready")
            );
        }
    }

    /// `CLUSTER KEYSLOT <text>`, asked of a node.
    pub fn keyslot(&self, text: &str) -> u16 {
        let mut q = redis::cmd("CLUSTER");
        q.arg("KEYSLOT").arg(text);
        let port = self.nodes.iter().find(|n| !n.down).unwrap().port();
        self.ask(port, &q, "CLUSTER KEYSLOT")
    }

    /// The primary serving `slot`.
    pub fn owner(&self, slot: u16) -> &Node {
        let r = self
            .slots()
            .into_iter()
            .find(|r| (r.first..=r.last).contains(&slot))
            .unwrap_or_else(|| panic!("slot {slot} not served"));
        self.node_by_port(r.primary_port)
    }

    /// The replica of `primary` (from the replica's own `INFO replication`).
    pub fn replica_of(&self, primary: &Node) -> &Node {
        self.replicas()
            .find(|r| r.primary_port == Some(primary.port()))
            .unwrap_or_else(|| panic!("{} has no replica", primary.addr()))
    }

    /// A cluster-aware client (the `redis` crate's), seeded with the first node.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClientBuilder::new(vec![self.nodes[0].vk.url()])
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(60))
            .build()
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// Creates `set` through the primary its name routes to (CREATE's routing key is the set
    /// name), then waits until every node, replicas included, knows it: the other primaries
    /// learn it from the catalog, replicas from their primary.
    pub fn create_everywhere(&self, set: &str) {
        self.create_everywhere_with(set, &[]);
    }

    /// [`Cluster::create_everywhere`] with CREATE's options (`["NORMALIZE", "none"]`, …).
    pub fn create_everywhere_with(&self, set: &str, options: &[&str]) {
        let n = self.set_owner(set);
        let mut c = n.conn();
        let v: Value = redis::cmd("MEMBER.CREATE")
            .arg(set)
            .arg(options)
            .query(&mut c)
            .unwrap_or_else(|e| panic!("MEMBER.CREATE {set} on {}: {e}", n.addr()));
        assert!(matches!(v, Value::Okay), "{v:?}");
        for n in &self.nodes {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(20), || set_known(&mut c, set)),
                "{} never learned set {set}\n{}",
                n.addr(),
                catalog_state(n, set)
            );
        }
    }

    /// DROPs `set` on the primary its name routes to, then waits until every node has
    /// forgotten it (the twin of [`Cluster::create_everywhere`]).
    pub fn drop_everywhere(&self, set: &str) {
        let n = self.set_owner(set);
        let v: Value = redis::cmd("MEMBER.DROP")
            .arg(set)
            .query(&mut n.conn())
            .unwrap_or_else(|e| panic!("MEMBER.DROP {set} on {}: {e}", n.addr()));
        assert!(matches!(v, Value::Okay), "{v:?}");
        for n in &self.nodes {
            let mut c = n.conn();
            assert!(
                wait_until(Duration::from_secs(20), || !set_known(&mut c, set)),
                "{} still knows set {set}\n{}",
                n.addr(),
                catalog_state(n, set)
            );
        }
    }

    /// The primary that serves the slot of the set name: where CREATE, ALTER and DROP of
    /// `set` are routed.
    pub fn set_owner(&self, set: &str) -> &Node {
        self.owner(self.keyslot(set))
    }
}

impl Drop for Cluster {
    /// The nodes die with their `Valkey` handles; forget them in the exit handler's list too,
    /// so it never signals a process id that has been reused since.
    fn drop(&mut self) {
        let mut all = NODES.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(_, dir)| !self.nodes.iter().any(|n| n.vk.dir() == dir));
    }
}

/// What a node says of its catalog and of `set`, and its log's last lines: for the message of
/// a failed wait on the catalog.
fn catalog_state(n: &Node, set: &str) -> String {
    let mut c = n.conn();
    let info: String = redis::cmd("INFO")
        .arg("member")
        .query(&mut c)
        .unwrap_or_else(|e| e.to_string());
    let catalog: Vec<&str> = info.lines().filter(|l| l.contains("catalog")).collect();
    let fields = redis::cmd("MEMBER.NODEINFO")
        .arg(set)
        .query::<Value>(&mut c);
    format!(
        "{catalog:?}\nNODEINFO {set}: {fields:?}\nlog:\n{}",
        super::lifecycle::log_tail(&n.vk)
    )
}

fn set_known(c: &mut Connection, set: &str) -> bool {
    redis::cmd("MEMBER.NODEINFO")
        .arg(set)
        .query::<Value>(c)
        .is_ok()
}

fn int_of(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

pub(super) fn read_slots(c: &mut Connection) -> Vec<SlotRange> {
    parse_slots(
        redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(c)
            .expect("CLUSTER SLOTS"),
    )
}

fn parse_slots(v: Vec<Value>) -> Vec<SlotRange> {
    let mut out: Vec<SlotRange> = v
        .iter()
        .map(|r| {
            let Value::Array(f) = r else {
                panic!("CLUSTER SLOTS entry {r:?}")
            };
            let port = |node: &Value| match node {
                Value::Array(n) => int_of(&n[1]) as u16,
                other => panic!("CLUSTER SLOTS node {other:?}"),
            };
            SlotRange {
                first: int_of(&f[0]) as u16,
                last: int_of(&f[1]) as u16,
                primary_port: port(&f[2]),
            }
        })
        .collect();
    out.sort_by_key(|r| r.first);
    out
}
