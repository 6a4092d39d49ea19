//! Bench section `tokenize`: what `TOKENIZE hmac-sha256` costs — one HMAC-SHA-256 per call,
//! timed alone in this process, and MEMBER.EXISTS of absent items on a tokenized set against
//! the same on a plain set of the same size (valkey-benchmark, 50 connections, A B B A).

use std::time::Instant;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::{abba, progress, vb_absent_exists, vk_conn, Bench};

const PLAIN: &str = "tok_plain";
const TOKENIZED: &str = "tok_hmac";
const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const SECTION: &str = "Tokenization (TOKENIZE hmac-sha256)";

/// Nanoseconds per token of a 20-byte item, made as the module makes it (`src/model/token.rs`: the
/// keyed HMAC state cloned per call, `item NUL scope` absorbed, the digest hex-encoded).
fn hmac_ns() -> f64 {
    let key: Vec<u8> = (0u8..32).collect();
    let keyed = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).unwrap();
    let items: Vec<String> = (0..1024).map(|i| format!("absent:{:013}", i)).collect();
    let n = 400_000usize;
    let mut sink = 0u8;
    let t0 = Instant::now();
    for i in 0..n {
        let mut m = keyed.clone();
        m.update(items[i % items.len()].as_bytes());
        m.update(&[0]);
        let out = m.finalize().into_bytes();
        let mut hex = String::with_capacity(64);
        for b in out.iter() {
            hex.push(char::from_digit((b >> 4) as u32, 16).unwrap());
            hex.push(char::from_digit((b & 15) as u32, 16).unwrap());
        }
        sink ^= hex.as_bytes()[0];
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    std::hint::black_box(sink);
    ns
}

impl Bench {
    pub(crate) fn tokenize(&mut self) {
        progress("tokenize: one HMAC-SHA-256 per call, alone and on the negative path");
        let ns = hmac_ns();
        self.r.row(
            SECTION,
            "one token (HMAC-SHA-256 of a 20-byte item, hex), in-process",
            format!("{ns:.0} ns"),
            "-",
            None,
            "(figure)",
            None,
        );

        let dir = std::env::temp_dir().join(format!("member-bench-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("key dir");
        let path = dir.join("token.key");
        std::fs::write(&path, KEY_HEX).expect("key file");
        let mut c = vk_conn(self.port);
        let path_s = path.to_str().unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("member.token-key-file")
            .arg(path_s)
            .query(&mut c)
            .expect("CONFIG SET member.token-key-file");
        for (set, extra) in [(PLAIN, None), (TOKENIZED, Some("hmac-sha256"))] {
            let mut k = redis::cmd("MEMBER.CREATE");
            k.arg(set).arg("CAPACITY").arg(self.opts.members);
            if let Some(mode) = extra {
                k.arg("TOKENIZE").arg(mode);
            }
            let _: () = k.query(&mut c).expect("MEMBER.CREATE");
        }
        let half = self.opts.secs / 2.0;
        let port = self.port;
        for pipeline in [16usize, 1] {
            progress(&format!(
                "tokenize: EXISTS of absent items, tokenized vs plain set, pipeline {pipeline}"
            ));
            let exists = |set: &'static str| move || vb_absent_exists(port, pipeline, half, set);
            let (plain, tok) = abba(exists(PLAIN), exists(TOKENIZED));
            // With the server saturated, the difference of the time per call is the server's
            // extra work per call.
            let extra_ns = (1.0 / tok.rps() - 1.0 / plain.rps()) * 1e9;
            self.r.row(
                SECTION,
                format!(
                    "EXISTS of absent items, pipeline {pipeline}, 50 conns: tokenized vs plain"
                ),
                format!(
                    "{}/s ({extra_ns:+.0} ns a call)",
                    crate::thousands(tok.rps() as u64)
                ),
                format!("{}/s (plain set)", crate::thousands(plain.rps() as u64)),
                Some(tok.rps() / plain.rps().max(1e-9)),
                "(cost of one HMAC a call)",
                None,
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
