//! Section `mixed`: 95 % absent / 5 % present with a warm cache, against GET of the cache keys,
//! against the application-level pattern (`app_lookup`) and against a PostgreSQL point query.

use crate::*;

impl Bench {
    pub(crate) fn mixed(&mut self) {
        let port = self.port;
        let warm = self.warm;
        let half = self.half();
        let mut c = self.vk.conn();
        let before = set_info_all(&mut c);
        for pipeline in [16usize, 1] {
            progress(&format!(
                "mixed 95 % absent / 5 % present: EXISTS vs GET of the cache key, 50 connections, pipeline {pipeline}"
            ));
            let load = RawLoad {
                threads: 2,
                conns_per_thread: 25,
                pipeline,
                limit: Limit::Time(half),
            };
            let exists = |rng: &mut Rng, buf: &mut Vec<u8>| {
                let (item, present) = mixed_item(rng, warm);
                push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
                if present {
                    Expect::Yes
                } else {
                    Expect::No
                }
            };
            let get = |rng: &mut Rng, buf: &mut Vec<u8>| {
                let (item, present) = mixed_item(rng, warm);
                let key = format!("{HIT_PREFIX}{item}\0");
                push_cmd(buf, &[b"GET", key.as_bytes()]);
                if present {
                    Expect::Yes
                } else {
                    Expect::No
                }
            };
            let (g, e) = abba(
                || raw_load(port, &load, &get),
                || raw_load(port, &load, &exists),
            );
            let what = if pipeline > 1 {
                format!("mixed, pipeline {pipeline}, 50 conns")
            } else {
                "mixed, no pipeline, 50 conns".to_string()
            };
            self.r.pair(
                "Mixed 95 % absent / 5 % present, warm cache",
                &what,
                &e,
                &g,
                Some(0.95),
                Some(1.2),
                "GET of the same items' cache keys",
            );
            let tag = if pipeline > 1 { "P16" } else { "P1" };
            self.r
                .bars
                .push((format!("mixed, {tag}: GET"), g.p50_ms, g.p99_ms, false));
            self.r
                .bars
                .push((format!("mixed, {tag}: EXISTS"), e.p50_ms, e.p99_ms, true));
        }
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        self.r.note(format!(
            "mixed EXISTS paths: {:.2} % bloom-negative, {:.2} % cache-hit, {:.2} % db-miss (false positives, \
             each waiting for PostgreSQL and holding up the rest of its pipeline), {:.3} % db-hit",
            100.0 * d("path_bloom_negative") / d("exists_calls").max(1.0),
            100.0 * d("path_cache_hit") / d("exists_calls").max(1.0),
            100.0 * d("path_db_miss") / d("exists_calls").max(1.0),
            100.0 * d("path_db_hit") / d("exists_calls").max(1.0),
        ));

        // One lookup per call, 16 threads with a connection each: the module vs the
        // application-level pattern vs PostgreSQL alone.
        const THREADS: usize = 16;
        progress("mixed, 16 threads: EXISTS vs the application-level pattern vs a PostgreSQL point query");
        let url = self.db.url();
        let exists = || {
            thread_load(
                THREADS,
                half,
                |_| vk_conn(port),
                |c, rng| {
                    let (item, present) = mixed_item(rng, warm);
                    let v: i64 = redis::cmd("MEMBER.EXISTS")
                        .arg(SET)
                        .arg(&item)
                        .query(c)
                        .map_err(|e| e.to_string())?;
                    Ok((v == 1) == present)
                },
            )
        };
        let app = || {
            thread_load(
                THREADS,
                half,
                |_| {
                    let (pg, st) = pg_point_query(&url);
                    (vk_conn(port), pg, st)
                },
                |(vk, pg, st), rng| {
                    let (item, present) = mixed_item(rng, warm);
                    app_lookup(vk, pg, st, &item).map(|a| a == present)
                },
            )
        };
        let direct = || {
            thread_load(
                THREADS,
                half,
                |_| pg_point_query(&url),
                |(pg, st), rng| {
                    let (item, present) = mixed_item(rng, warm);
                    let row = pg.query_opt(&*st, &[&item]).map_err(|e| e.to_string())?;
                    Ok(row.is_some() == present)
                },
            )
        };
        let (e, a) = abba(&exists, &app);
        let (e2, p) = abba(&exists, &direct);
        let e = Stats::pool(&[e, e2]);
        let section = "Mixed 95 % absent / 5 % present, warm cache";
        self.r.pair(
            section,
            "mixed, 16 threads × 1 conn: vs app pattern",
            &e,
            &a,
            None,
            None,
            "SISMEMBER+SISMEMBER+GET pipeline, SELECT+SET on a miss",
        );
        self.r.pair(
            section,
            "mixed, 16 threads × 1 conn: vs PostgreSQL",
            &e,
            &p,
            None,
            None,
            "prepared point query per lookup",
        );
    }
}

/// The application-level pattern, as a user would write it with plain Valkey commands and SQL:
/// one pipeline with the gate set, the recent set and the cache key; SELECT on a miss, then
/// fill the cache.
pub(crate) fn app_lookup(
    vk: &mut redis::Connection,
    pg: &mut postgres::Client,
    st: &postgres::Statement,
    item: &str,
) -> Result<bool, String> {
    let key = format!("{APP_HIT}{item}");
    let (gate, recent, cached): (bool, bool, Option<Vec<u8>>) = redis::pipe()
        .cmd("SISMEMBER")
        .arg(APP_SET)
        .arg(item)
        .cmd("SISMEMBER")
        .arg(APP_RECENT)
        .arg(item)
        .cmd("GET")
        .arg(&key)
        .query(vk)
        .map_err(|e| e.to_string())?;
    if !gate && !recent {
        return Ok(false);
    }
    if cached.is_some() {
        return Ok(true);
    }
    super::seeds_app::query_and_fill(vk, pg, st, item, &key)
}
