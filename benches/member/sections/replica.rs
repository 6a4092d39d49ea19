//! Section `replica`: MEMBER.EXISTS of absent items on a replica that answers "absent" from its
//! filter (link up, caught up: docs/replicas.md) against the same load on its primary, A B B A
//! with valkey-benchmark. The replica's gate is one integer comparison the lookup path makes
//! on the primary too, so the two should serve alike.

use std::time::Duration;

use crate::*;

const SECTION: &str = "Replica (valkey-benchmark)";

impl Bench {
    pub(crate) fn replica(&mut self) {
        progress("replica: a replica of the bench's server, linked and caught up");
        let replicaof = format!("127.0.0.1 {}", self.port);
        let mut extra = Self::extra(&self.opts);
        extra.push(("replicaof", replicaof));
        let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let replica = start_loaded(&self.db.url(), &extra);
        let mut c = replica.conn();
        let serving = support::wait_until(Duration::from_secs(600), || {
            info_stat(&mut c, "member", "member_serves_absent").as_deref() == Some("1")
                && set_info_all(&mut c)
                    .get("filter_serves_absent")
                    .map(String::as_str)
                    == Some("1")
        });
        assert!(
            serving,
            "the replica never served \"absent\":\n{}",
            replica.log()
        );
        let (primary, port) = (self.port, replica.port());
        let half = self.opts.secs / 2.0;
        for pipeline in [16usize, 1] {
            progress(&format!(
                "replica: EXISTS of absent items, replica vs primary, pipeline {pipeline}"
            ));
            let exists = |port: u16| move || vb_absent_exists(port, pipeline, half, SET);
            let (on_primary, on_replica) = abba(exists(primary), exists(port));
            self.r.pair(
                SECTION,
                &format!("EXISTS of absent items, pipeline {pipeline}, 50 conns: replica"),
                &on_replica,
                &on_primary,
                Some(0.95),
                None,
                "the same load on the primary",
            );
        }
        let withheld = member_counter(&mut c, "member_filter_withheld_lookups");
        self.r.note(format!(
            "replica: lookups its filter did not settle while measured: {withheld}"
        ));
    }
}
