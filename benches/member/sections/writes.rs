//! Section `writes`: MEMBER.ADD of new items against a single-row INSERT … ON CONFLICT DO
//! NOTHING, 64 clients.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::*;

impl Bench {
    pub(crate) fn adds(&mut self) {
        const THREADS: usize = 64;
        progress("ADD vs single-row INSERT, 64 clients");
        let port = self.port;
        let half = self.half();
        let url = self.db.url();
        let seq = AtomicU64::new(0);
        let add = || {
            thread_load(
                THREADS,
                half,
                |_| vk_conn(port),
                |c, _| {
                    let item = format!("add:{}", seq.fetch_add(1, Ordering::Relaxed));
                    let v: i64 = redis::cmd("MEMBER.ADD")
                        .arg(SET)
                        .arg(&item)
                        .query(c)
                        .map_err(|e| e.to_string())?;
                    Ok(v == 1)
                },
            )
        };
        let insert = || {
            thread_load(
                THREADS,
                half,
                |_| {
                    let mut pg = pg_connect(&url);
                    let st = pg
                        .prepare(&format!(
                            "INSERT INTO {TABLE} (entity_id) VALUES ($1) ON CONFLICT DO NOTHING"
                        ))
                        .unwrap();
                    (pg, st)
                },
                |(pg, st), _| {
                    let item = format!("ins:{}", seq.fetch_add(1, Ordering::Relaxed));
                    let n = pg.execute(&*st, &[&item]).map_err(|e| e.to_string())?;
                    Ok(n == 1)
                },
            )
        };
        let (a, i) = abba(&add, &insert);
        self.r.pair(
            "Writes, 64 clients",
            "MEMBER.ADD of new items",
            &a,
            &i,
            None,
            None,
            "INSERT … ON CONFLICT DO NOTHING, 64 connections",
        );
    }
}
