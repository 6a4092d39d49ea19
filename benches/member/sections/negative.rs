//! Section `negative`: MEMBER.EXISTS of absent items against GET of a present key, by
//! valkey-benchmark, pipelined and not, plus a recurring pool of absent items.

use crate::*;

impl Bench {
    pub(crate) fn negative_path(&mut self) {
        let port = self.port;
        let half = self.opts.secs / 2.0;
        let mut c = self.vk.conn();
        let errors_before = info_stat(&mut c, "stats", "total_error_replies");
        for pipeline in [16usize, 1] {
            progress(&format!(
                "negative path: EXISTS of absent items vs GET, 50 connections, pipeline {pipeline}"
            ));
            let (get, ex) = abba(
                || vb_timed(port, pipeline, half, None, &["GET", PRESENT_KEY]),
                || vb_absent_exists(port, pipeline, half, SET),
            );
            let what = if pipeline > 1 {
                format!("absent items, pipeline {pipeline}, 50 conns")
            } else {
                "absent items, no pipeline, 50 conns".to_string()
            };
            self.r.pair(
                "Negative path (valkey-benchmark)",
                &what,
                &ex,
                &get,
                Some(0.95),
                None,
                "GET of a present key",
            );
            let tag = if pipeline > 1 { "P16" } else { "P1" };
            self.r.bars.push((
                format!("negative, {tag}: GET"),
                get.p50_ms,
                get.p99_ms,
                false,
            ));
            self.r.bars.push((
                format!("negative, {tag}: EXISTS absent"),
                ex.p50_ms,
                ex.p99_ms,
                true,
            ));
        }
        // Diagnostic: the same load with one absent item the filter rejects, so no probe is a
        // false positive that waits for PostgreSQL (holding up the rest of its pipeline).
        let rejected = (0..)
            .map(|i| format!("absent:rejected{i}"))
            .find(|item| {
                let (_, path): (i64, String) = redis::cmd("MEMBER.EXPLAIN")
                    .arg(SET)
                    .arg(item)
                    .query(&mut c)
                    .expect("MEMBER.EXPLAIN");
                path == "bloom-negative"
            })
            .unwrap();
        progress(
            "negative path, diagnostic: one filter-rejected item (no false positives), pipeline 16",
        );
        let (get, ex) = abba(
            || vb_timed(port, 16, half, None, &["GET", PRESENT_KEY]),
            || vb_timed(port, 16, half, None, &["MEMBER.EXISTS", SET, &rejected]),
        );
        self.r.pair(
            "Negative path (valkey-benchmark)",
            "diagnostic: one filter-rejected item (no false positives), pipeline 16, 50 conns",
            &ex,
            &get,
            None,
            None,
            "GET of a present key",
        );
        // The same absent probes drawn from a pool of 100 000 items that recur: each false
        // positive waits for PostgreSQL once, then the fp-cache tier answers it.
        progress("negative path: absent items from a recurring pool of 100 000, pipeline 16");
        let before = set_info_all(&mut c);
        let (get, ex) = abba(
            || vb_timed(port, 16, half, None, &["GET", PRESENT_KEY]),
            || {
                vb_timed(
                    port,
                    16,
                    half,
                    Some(REPEATED_KEYSPACE),
                    &["MEMBER.EXISTS", SET, "absent:__rand_int__"],
                )
            },
        );
        self.r.pair(
            "Negative path (valkey-benchmark)",
            "absent items from a recurring pool of 100 000, pipeline 16, 50 conns",
            &ex,
            &get,
            Some(0.95),
            None,
            "GET of a present key",
        );
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        self.r.note(format!(
            "recurring absent pool: {:.3} % of EXISTS answered by the fp-cache tier, {:.3} % waited for \
             PostgreSQL (first sight of a false positive); fp_cache_entries {}",
            100.0 * d("path_fp_cache") / d("exists_calls").max(1.0),
            100.0 * d("path_db_miss") / d("exists_calls").max(1.0),
            after.get("fp_cache_entries").map_or("?", |v| v.as_str()),
        ));
        self.against_redisbloom(&mut c);
        let errors_after = info_stat(&mut c, "stats", "total_error_replies");
        if errors_before != errors_after {
            self.r.note(format!(
                "valkey-benchmark runs got error replies: total_error_replies {errors_before:?} → {errors_after:?}"
            ));
        }
    }
}

/// RedisBloom's filter of the members, beside the set's.
const BF_KEY: &str = "bf:members";

impl Bench {
    /// The peer users compare with (seed 000's tool): RedisBloom's `BF.EXISTS` on the same
    /// server, under the same load, against a filter of the same members at the same error
    /// rate. BF.EXISTS answers its false positives 1 (about 1 % of absent items here); the set
    /// sends them to PostgreSQL and answers 0.
    fn against_redisbloom(&mut self, c: &mut redis::Connection) {
        if crate::servers::redisbloom().is_none() {
            self.r.note(
                "RedisBloom rows skipped: no target/servers/redisbloom-2.8.2/redisbloom.so \
                 (scripts/redisbloom.sh; make bench unpacks it)",
            );
            return;
        }
        let n = self.opts.members;
        progress(&format!(
            "negative path vs RedisBloom: loading {} members into BF.RESERVE {BF_KEY}",
            thousands(n)
        ));
        let _: redis::Value = redis::cmd("DEL").arg(BF_KEY).query(c).expect("DEL");
        let _: String = redis::cmd("BF.RESERVE")
            .arg(BF_KEY)
            .arg(CONFIGURED_FPR)
            .arg(n)
            .query(c)
            .expect("BF.RESERVE");
        let mut next = 1u64;
        while next <= n {
            let end = (next + 10_000).min(n + 1);
            let mut pipe = redis::pipe();
            for chunk in (next..end).collect::<Vec<_>>().chunks(1000) {
                let mut cmd = redis::cmd("BF.MADD");
                cmd.arg(BF_KEY);
                for i in chunk {
                    cmd.arg(format!("m{i}"));
                }
                pipe.add_command(cmd).ignore();
            }
            let _: () = pipe.query(c).expect("BF.MADD");
            next = end;
        }
        let port = self.port;
        let half = self.opts.secs / 2.0;
        for pipeline in [16usize, 1] {
            progress(&format!(
                "negative path: EXISTS of absent items vs RedisBloom's BF.EXISTS, pipeline {pipeline}"
            ));
            let (bf, ex) = abba(
                || {
                    vb_timed(
                        port,
                        pipeline,
                        half,
                        Some(ABSENT_KEYSPACE),
                        &["BF.EXISTS", BF_KEY, "absent:__rand_int__"],
                    )
                },
                || vb_absent_exists(port, pipeline, half, SET),
            );
            self.r.pair(
                "Negative path (valkey-benchmark)",
                &format!("absent items vs RedisBloom 2.8.2, pipeline {pipeline}, 50 conns"),
                &ex,
                &bf,
                Some(0.95),
                None,
                "BF.EXISTS of the same absent items",
            );
        }
        let _: redis::Value = redis::cmd("DEL").arg(BF_KEY).query(c).expect("DEL");
    }
}
