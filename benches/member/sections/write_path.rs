//! Section `writepath` (issue 30): new items written through the module (MEMBER.ADD, MADD of
//! 100) and outside it (a single-row INSERT into the set's own table, its change-log trigger
//! firing) against a bare single-row INSERT … ON CONFLICT DO NOTHING into a table of the same
//! shape without triggers, all at the same concurrency, with what each row costs PostgreSQL
//! and the server.
//!
//! Load generators are the C ones on both sides: valkey-benchmark for the module, pgbench for
//! the INSERTs. Sides run in the order P A M T T M A P and each side's two runs are pooled.

use crate::pg_cpu::PgCpu;
use crate::*;

const SECTION: &str = "Write path: new items, 32 clients (valkey-benchmark / pgbench)";
const CLIENTS: usize = 32;
/// Items per MADD.
const MADD: usize = 100;
/// The trigger-less twin of the set's table: same columns, defaults and indexes.
const PLAIN: &str = "wp_plain";

/// What one run of one side wrote and what it cost.
#[derive(Clone, Copy, Default)]
struct Run {
    rows: f64,
    secs: f64,
    /// PostgreSQL CPU (all its processes), ms.
    pg_ms: f64,
    /// valkey-server CPU (all its threads), ms.
    vk_ms: f64,
    /// Transaction ids drawn (write transactions committed or not).
    xids: f64,
    /// Batched statements the module's workers sent, and the points they carried.
    batches: f64,
    points: f64,
}

impl Run {
    fn add(self, o: Run) -> Run {
        Run {
            rows: self.rows + o.rows,
            secs: self.secs + o.secs,
            pg_ms: self.pg_ms + o.pg_ms,
            vk_ms: self.vk_ms + o.vk_ms,
            xids: self.xids + o.xids,
            batches: self.batches + o.batches,
            points: self.points + o.points,
        }
    }
    fn rps(&self) -> f64 {
        self.rows / self.secs.max(1e-9)
    }
    fn per_row_us(&self, ms: f64) -> f64 {
        ms * 1000.0 / self.rows.max(1.0)
    }
}

/// The server's CPU so far (user + system of every thread), ms.
fn server_cpu_ms(c: &mut redis::Connection) -> f64 {
    ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .map(|f| {
            info_stat(c, "cpu", f)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum::<f64>()
        * 1000.0
}

/// The next transaction id (draws one itself).
fn xid(pg: &mut postgres::Client) -> f64 {
    pg.query_one("SELECT pg_current_xact_id()::text::int8", &[])
        .map(|r| r.get::<_, i64>(0) as f64)
        .unwrap_or(0.0)
}

impl Bench {
    /// Runs `load` (returning rows written and seconds) with every counter read around it.
    fn write_run(&self, cpu: &PgCpu, load: impl FnOnce() -> (f64, f64)) -> Run {
        let mut c = self.vk.conn();
        let mut pg = self.db.client();
        let (x0, p0, v0) = (xid(&mut pg), cpu.sample(), server_cpu_ms(&mut c));
        let (b0, n0) = (
            member_counter(&mut c, "member_db_batches"),
            member_counter(&mut c, "member_db_batched_points"),
        );
        let (rows, secs) = load();
        let (p1, v1) = (cpu.sample(), server_cpu_ms(&mut c));
        Run {
            rows,
            secs,
            pg_ms: p0.ms_to(&p1),
            vk_ms: v1 - v0,
            xids: xid(&mut pg) - x0 - 1.0,
            batches: member_counter(&mut c, "member_db_batches") - b0,
            points: member_counter(&mut c, "member_db_batched_points") - n0,
        }
    }

    pub(crate) fn write_path(&mut self) {
        let mut pg = self.db.client();
        pg.batch_execute(&format!(
            "DROP TABLE IF EXISTS {PLAIN}; CREATE TABLE {PLAIN} (LIKE {TABLE} INCLUDING ALL)"
        ))
        .expect("create the trigger-less table");
        let cpu = PgCpu::of(&mut pg);
        let secs = self.opts.secs / 2.0;
        let port = self.port;
        // The module's sides are sized by a first estimate of their rate, for about `secs`.
        let add_cmd = ["MEMBER.ADD", SET, "wp:a:__rand_int__"];
        let mut madd_cmd: Vec<String> = ["MEMBER.MADD", SET, "ITEMS"].map(String::from).to_vec();
        madd_cmd.extend(std::iter::repeat_n("wp:m:__rand_int__".to_string(), MADD));
        let madd_args: Vec<&str> = madd_cmd.iter().map(String::as_str).collect();
        progress("write path: calibrating ADD and MADD");
        let cal_add = vb_run(port, CLIENTS, 1, 20_000, Some(ABSENT_KEYSPACE), &add_cmd).rps();
        let cal_madd = vb_run(port, CLIENTS, 1, 500, Some(ABSENT_KEYSPACE), &madd_args).rps();
        let n_add = ((cal_add * secs) as u64).max(10_000);
        let n_madd = ((cal_madd * secs) as u64).max(200);

        // The same single-row INSERT into the bare table and into the set's own (its trigger
        // fires), new random keys.
        let insert_into = |table: &str, prefix: &str| {
            self.write_run(&cpu, || {
                let st = pgbench_script(
                    &self.db,
                    &format!(
                        "\\set id random(1, 1000000000)\n\
                         INSERT INTO {table} (entity_id) VALUES ('{prefix}' || :id::int8) ON CONFLICT DO NOTHING;\n"
                    ),
                    CLIENTS,
                    secs,
                );
                (st.ops as f64, st.secs)
            })
        };
        let plain = || insert_into(PLAIN, "wpp");
        let trig = || insert_into(TABLE, "wpt");
        let add = || {
            self.write_run(&cpu, || {
                let st = vb_run(port, CLIENTS, 1, n_add, Some(ABSENT_KEYSPACE), &add_cmd);
                (st.ops as f64, st.secs)
            })
        };
        let madd = || {
            self.write_run(&cpu, || {
                let st = vb_run(port, CLIENTS, 1, n_madd, Some(ABSENT_KEYSPACE), &madd_args);
                (st.ops as f64 * MADD as f64, st.secs)
            })
        };
        progress("write path: bare INSERT, ADD, MADD, INSERT with the trigger, then in reverse");
        let (p1, a1, m1, t1) = (plain(), add(), madd(), trig());
        let (t2, m2, a2, p2) = (trig(), madd(), add(), plain());
        let (p, a, m, t) = (p1.add(p2), a1.add(a2), m1.add(m2), t1.add(t2));
        self.write_path_rows(&p, &a, &m, &t);
    }

    fn write_path_rows(&mut self, p: &Run, a: &Run, m: &Run, t: &Run) {
        let base = format!(
            "{} (pgbench, single-row INSERT … ON CONFLICT DO NOTHING into a table without triggers)",
            rate(p.rps())
        );
        for (what, run, target, min) in [
            ("MEMBER.ADD of new items, rows/s", a, "≥ 1.0×", 1.0),
            ("MEMBER.MADD of 100 new items, rows/s", m, "≥ 3×", 3.0),
            (
                "outside single-row INSERT into the set's table (change-log trigger fires), rows/s",
                t,
                "≥ 0.8×",
                0.8,
            ),
        ] {
            let ratio = run.rps() / p.rps().max(1e-9);
            self.r.row(
                SECTION,
                what,
                rate(run.rps()),
                base.clone(),
                Some(ratio),
                target,
                Some(ratio >= min),
            );
        }
        for (what, run) in [
            ("bare INSERT", p),
            ("MEMBER.ADD", a),
            ("MEMBER.MADD 100", m),
            ("INSERT with the trigger", t),
        ] {
            let batches = if run.batches > 0.0 {
                format!(
                    ", {:.3} statements per row ({:.1} rows per batched statement)",
                    run.batches / run.rows.max(1.0),
                    run.points / run.batches
                )
            } else {
                String::new()
            };
            self.r.row(
                SECTION,
                format!("diagnostic, per written row: {what}"),
                format!(
                    "PostgreSQL CPU {:.1} µs, server CPU {:.1} µs, {:.3} transactions{batches}",
                    run.per_row_us(run.pg_ms),
                    run.per_row_us(run.vk_ms),
                    run.xids / run.rows.max(1.0),
                ),
                "—",
                None,
                "—",
                None,
            );
        }
    }
}
