//! Section `memory`: filter bits per member against a Valkey SET of the members, and the
//! false-positive rate measured over absent probes against the one MEMBER.INFO promises.

use crate::*;

impl Bench {
    pub(crate) fn memory(&mut self) {
        progress("memory and false-positive rate");
        let mut c = self.vk.conn();
        let info = set_info_all(&mut c);
        let bytes = num(&info, "filter_bytes");
        let items = num(&info, "filter_items");
        let bits = bytes * 8.0 / items;
        let set_bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(APP_SET)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut c)
            .unwrap_or(0);
        let set_bits = set_bytes as f64 * 8.0 / self.opts.members as f64;
        self.r.row(
            "Memory",
            "filter size per member at 1 % FPR (filter_bytes × 8 / filter_items)",
            format!("{bits:.2} bits ({:.2} B)", bits / 8.0),
            format!(
                "{set_bits:.0} bits ({:.1} B) (Valkey SET of the members)",
                set_bits / 8.0
            ),
            Some(bits / set_bits.max(1e-9)),
            "≤ 10 bits",
            Some(bits <= 10.0),
        );
        let filter_mem: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(format!("member:{SET}:bloom"))
            .query(&mut c)
            .unwrap_or(-1);
        self.r.note(format!(
            "filter: {} bits, {} hashes, {} items, {} bytes (MEMORY USAGE of the filter key: {} bytes), \
             fill {}, filter_fpr_est {}",
            info.get("filter_bits").map_or("?", |s| s.as_str()),
            info.get("filter_hashes").map_or("?", |s| s.as_str()),
            info.get("filter_items").map_or("?", |s| s.as_str()),
            info.get("filter_bytes").map_or("?", |s| s.as_str()),
            filter_mem,
            info.get("filter_fill").map_or("?", |s| s.as_str()),
            info.get("filter_fpr_est").map_or("?", |s| s.as_str()),
        ));

        // False positives: probes the filter did not reject (they went on to the database).
        let probes = self.opts.fpr_probes;
        let before = set_info_all(&mut c);
        let st = raw_total(self.port, probes, &|i: u64, buf: &mut Vec<u8>| {
            let item = format!("fp:{i}");
            push_cmd(buf, &[b"MEMBER.EXISTS", SET.as_bytes(), item.as_bytes()]);
            Expect::No
        });
        let after = set_info_all(&mut c);
        let d = |k: &str| num(&after, k) - num(&before, k);
        let calls = d("exists_calls");
        let passed = calls - d("path_bloom_negative");
        let fpr = passed / calls.max(1.0);
        // The promise is what MEMBER.INFO estimates for the filter as it stands (issue 11);
        // the configured rate is only its ceiling.
        let promised = num(&before, "filter_fpr_est");
        let ratio = fpr / promised.max(1e-12);
        self.r.row(
            "Memory",
            format!(
                "false-positive rate over {} absent probes, vs MEMBER.INFO filter_fpr_est ({})",
                thousands(probes),
                before.get("filter_design").map_or("?", |s| s.as_str()),
            ),
            format!("{:.3} % ({} passed the filter)", fpr * 100.0, passed as u64),
            format!(
                "{:.3} % promised ({:.1} % configured)",
                promised * 100.0,
                CONFIGURED_FPR * 100.0
            ),
            Some(ratio),
            "0.85–1.15×",
            Some((0.85..=1.15).contains(&ratio)),
        );
        // Issue 11: half the false positives of the Bloom filter alone (1.005 % at 9.60 bits
        // a member, measured at 1 000 000 members) for the same memory or less.
        let vs_bloom = fpr / 0.01005;
        self.r.row(
            "Memory",
            "false-positive rate vs a Bloom filter alone at 9.60 bits a member",
            format!("{:.3} % at {bits:.2} bits", fpr * 100.0),
            "1.005 % at 9.60 bits".to_string(),
            Some(vs_bloom),
            "≤ 0.5× at ≤ 9.60 bits",
            Some(vs_bloom <= 0.5 && bits <= 9.60),
        );
        if st.errors > 0 || st.wrong > 0 || calls as u64 != probes {
            self.r.note(format!(
                "FPR probes: {} EXISTS counted for {probes} sent, {} error replies, {} wrong answers ({})",
                calls as u64,
                st.errors,
                st.wrong,
                st.first_error.as_deref().unwrap_or("-")
            ));
        }
    }
}
