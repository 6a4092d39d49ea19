//! Filter designs side by side (issue 11): `cargo bench --bench filter [-- N ...]`, default
//! N = 1 000 000 and 100 000 000 members. No server: the filter alone, in one process, so the
//! ratios between rows are measured on the same machine in the same minute.
//!
//! Candidates, each fed the same 128-bit item hashes (uniform, like `canon::hash_parts`):
//! * `standard Bloom, 1 % (before)`: the filter as it shipped before issue 11 (enhanced double
//!   hashing over the whole array, k = 7 at 1 %), on 4 KiB pages and on huge pages;
//! * `blocked`: every probe inside one 512-bit block (one cache line), k bits of the block;
//! * `split-block`: one 512-bit block of 8 words, one bit in each word (Parquet/Impala style);
//! * `fuse8` / `fuse16`: xorf's static binary fuse filters (build once, no adds), 4 KiB pages;
//! * `fuse8 + blocked delta`: a fuse8 over 98 % of the members and a blocked Bloom over the
//!   2 % added since the build (what a rebuild followed by live adds leaves);
//! * `libmember`: `src/filter/bloom/mod.rs` as it ships (a fuse8 static part and a classic Bloom delta),
//!   right after a build of all members, built from 98 % with 2 % added since (also probed
//!   the measured alternative way, `contains_branch_free`), and as a Bloom filter alone; each
//!   with its large arrays on huge pages (`src/filter/bloom/large_array.rs`) and on 4 KiB pages.
//!
//! Per row: bits per member, measured FPR over 4 194 304 never-added items, ns per absent and
//! per present probe one at a time (a fence after each, as one command after another on a
//! server thread) and, for absent probes, as independent probes (the CPU overlaps their
//! misses) and batched (each probe prefetches the lines of the probe 8 items later, as
//! MEMBER.MEXISTS does; "–" for candidates without a prefetch), and build ns per member.
//!
//! `cargo bench --bench filter -- 100000000 --only=standard,libmember` runs the named
//! candidates only (substrings of the row names) at the given sizes.

use std::hint::black_box;
use std::time::Instant;

use xorf::{BinaryFuse16, BinaryFuse8, Filter};

/// The module's own filter, as it ships (`Bloom::build` then adds), and its parts.
#[allow(dead_code)]
#[path = "../src/filter/bloom/mod.rs"]
mod filter;

use filter::large_array::{LargeArray, HUGE_PAGES};
use std::sync::atomic::Ordering;

/// Builds with large arrays advised for huge pages (`huge`) or left on 4 KiB pages.
fn pages<T>(huge: bool, f: impl FnOnce() -> T) -> T {
    HUGE_PAGES.store(huge, Ordering::Relaxed);
    let v = f();
    HUGE_PAGES.store(true, Ordering::Relaxed);
    v
}

const PROBES: usize = 1 << 22;

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` uniform 128-bit hashes from `seed`.
fn hashes(seed: u64, n: usize) -> Vec<u128> {
    let mut s = seed;
    (0..n)
        .map(|_| (splitmix(&mut s) as u128) << 64 | splitmix(&mut s) as u128)
        .collect()
}

#[inline]
fn reduce(x: u64, m: u64) -> u64 {
    ((x as u128 * m as u128) >> 64) as u64
}

#[inline(always)]
fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (p as *const T).cast::<i8>(),
        )
    };
}

trait Candidate {
    fn bits(&self) -> u64;
    fn contains(&self, h: u128) -> bool;
    /// Brings in what `contains(h)` will read; false when the candidate cannot.
    fn prefetch(&self, _h: u128) -> bool {
        false
    }
}

/// Today's filter (src/filter/bloom/mod.rs at the time of issue 11), probe for probe.
struct Standard {
    bits: LargeArray<u64>,
    k: u32,
}

impl Standard {
    fn new(n: u64, fpr: f64) -> Self {
        let ln2 = std::f64::consts::LN_2;
        let m = (-(n as f64 * fpr.ln()) / (ln2 * ln2)).ceil() as u64;
        let m = m.div_ceil(64) * 64;
        let k = ((m as f64 / n as f64) * ln2).round() as u32;
        Standard {
            bits: LargeArray::zeroed((m / 64) as usize),
            k,
        }
    }
    #[inline]
    fn positions(&self, hash: u128) -> impl Iterator<Item = u64> {
        let m = self.bits.len() as u64 * 64;
        let mut h1 = hash as u64;
        let mut h2 = (hash >> 64) as u64 | 1;
        (0..self.k).map(move |i| {
            let p = reduce(h1, m);
            h1 = h1.wrapping_add(h2);
            h2 = h2.wrapping_add(i as u64);
            p
        })
    }
    fn add_many(&mut self, hs: &[u128]) {
        for i in 0..hs.len() {
            if let Some(&next) = hs.get(i + 8) {
                for p in self.positions(next) {
                    prefetch(&self.bits[(p / 64) as usize]);
                }
            }
            for p in self.positions(hs[i]) {
                self.bits[(p / 64) as usize] |= 1 << (p % 64);
            }
        }
    }
}

impl Candidate for Standard {
    fn bits(&self) -> u64 {
        self.bits.len() as u64 * 64
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        self.positions(h)
            .all(|p| self.bits[(p / 64) as usize] & (1u64 << (p % 64)) != 0)
    }
    #[inline]
    fn prefetch(&self, h: u128) -> bool {
        for p in self.positions(h) {
            prefetch(&self.bits[(p / 64) as usize]);
        }
        true
    }
}

/// One 64-byte line.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// A filter whose probe reads one line: `mask` names the line and the bits in it.
trait OneLine {
    fn lines(&self) -> &[Line];
    fn lines_mut(&mut self) -> &mut [Line];
    fn mask(&self, h: u128) -> (usize, [u64; 8]);

    fn add_many(&mut self, hs: &[u128]) {
        let n = self.lines().len() as u64;
        for i in 0..hs.len() {
            if let Some(&next) = hs.get(i + 8) {
                prefetch(&self.lines()[reduce(next as u64, n) as usize]);
            }
            let (b, m) = self.mask(hs[i]);
            for (w, mw) in self.lines_mut()[b].0.iter_mut().zip(m) {
                *w |= mw;
            }
        }
    }

    #[inline]
    fn line_contains(&self, h: u128) -> bool {
        let (b, m) = self.mask(h);
        let l = &self.lines()[b].0;
        let mut miss = 0;
        for i in 0..8 {
            miss |= m[i] & !l[i];
        }
        miss == 0
    }
}

/// k bits anywhere in one 512-bit block: the block from the low half of the hash, each bit
/// from 9 bits of the high half (k ≤ 7).
struct Blocked {
    lines: Vec<Line>,
    k: u32,
}

impl Blocked {
    fn with_bits(m: u64, k: u32) -> Self {
        Blocked {
            lines: vec![Line::default(); m.div_ceil(512) as usize],
            k,
        }
    }
}

impl OneLine for Blocked {
    fn lines(&self) -> &[Line] {
        &self.lines
    }
    fn lines_mut(&mut self) -> &mut [Line] {
        &mut self.lines
    }
    #[inline]
    fn mask(&self, h: u128) -> (usize, [u64; 8]) {
        let b = reduce(h as u64, self.lines.len() as u64) as usize;
        let mut x = (h >> 64) as u64;
        let mut m = [0u64; 8];
        for _ in 0..self.k {
            let bit = x & 511;
            m[(bit >> 6) as usize] |= 1 << (bit & 63);
            x >>= 9;
        }
        (b, m)
    }
}

impl Candidate for Blocked {
    fn bits(&self) -> u64 {
        self.lines.len() as u64 * 512
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        self.line_contains(h)
    }
}

/// Split block: 8 words of one line, one bit in each, 6 bits of the high half per word.
struct SplitBlock {
    lines: Vec<Line>,
}

impl SplitBlock {
    fn with_bits(m: u64) -> Self {
        SplitBlock {
            lines: vec![Line::default(); m.div_ceil(512) as usize],
        }
    }
}

impl OneLine for SplitBlock {
    fn lines(&self) -> &[Line] {
        &self.lines
    }
    fn lines_mut(&mut self) -> &mut [Line] {
        &mut self.lines
    }
    #[inline]
    fn mask(&self, h: u128) -> (usize, [u64; 8]) {
        let b = reduce(h as u64, self.lines.len() as u64) as usize;
        let x = (h >> 64) as u64;
        let mut m = [0u64; 8];
        for (i, w) in m.iter_mut().enumerate() {
            *w = 1 << ((x >> (6 * i)) & 63);
        }
        (b, m)
    }
}

impl Candidate for SplitBlock {
    fn bits(&self) -> u64 {
        self.lines.len() as u64 * 512
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        self.line_contains(h)
    }
}

struct Fuse8(BinaryFuse8);
struct Fuse16(BinaryFuse16);

impl Candidate for Fuse8 {
    fn bits(&self) -> u64 {
        self.0.fingerprints.len() as u64 * 8
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        self.0.contains(&(h as u64))
    }
}

impl Candidate for Fuse16 {
    fn bits(&self) -> u64 {
        self.0.fingerprints.len() as u64 * 16
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        self.0.contains(&(h as u64))
    }
}

/// A static fuse8 and a blocked Bloom for what was added since it was built.
struct FuseDelta {
    fuse: Fuse8,
    delta: Blocked,
}

impl Candidate for FuseDelta {
    fn bits(&self) -> u64 {
        self.fuse.bits() + self.delta.bits()
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        self.fuse.contains(h) || self.delta.contains(h)
    }
}

impl Candidate for filter::Bloom {
    fn bits(&self) -> u64 {
        filter::Bloom::bits(self)
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        filter::Bloom::contains(self, h)
    }
    #[inline]
    fn prefetch(&self, h: u128) -> bool {
        filter::Bloom::prefetch(self, h);
        true
    }
}

/// The module's filter probed the other way (`Bloom::contains_branch_free`): the delta first,
/// its k bits without branches, then the static part.
struct BranchFree(filter::Bloom);

impl Candidate for BranchFree {
    fn bits(&self) -> u64 {
        self.0.bits()
    }
    #[inline]
    fn contains(&self, h: u128) -> bool {
        self.0.contains_branch_free(h)
    }
}

/// ns per probe, one at a time: a fence after each probe lets the next start only when it has
/// finished, as one command after another on a server thread (a data dependency on the
/// answer is not enough: the CPU predicts a branchy probe's answer and runs ahead).
fn chain(f: &dyn Candidate, keys: &[u128]) -> f64 {
    let mut hits = 0usize;
    let t = Instant::now();
    for &k in keys {
        hits += f.contains(k) as usize;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a fence only orders instructions.
        unsafe {
            std::arch::x86_64::_mm_lfence()
        };
    }
    black_box(hits);
    t.elapsed().as_nanos() as f64 / keys.len() as f64
}

/// ns per probe, independent probes; also the number of positives.
fn independent(f: &dyn Candidate, keys: &[u128]) -> (f64, usize) {
    let t = Instant::now();
    let hits = keys.iter().filter(|&&k| f.contains(k)).count();
    (
        t.elapsed().as_nanos() as f64 / keys.len() as f64,
        black_box(hits),
    )
}

/// How many probes ahead `batched` prefetches.
const AHEAD: usize = 8;

/// ns per probe when the caller holds many items (MEMBER.MEXISTS): each probe prefetches the
/// lines of the probe `AHEAD` items later first, so up to that many misses are in flight.
/// None for a candidate that cannot prefetch.
fn batched(f: &dyn Candidate, keys: &[u128]) -> Option<f64> {
    if !f.prefetch(keys[0]) {
        return None;
    }
    let t = Instant::now();
    let mut hits = 0usize;
    for i in 0..keys.len() {
        if let Some(&next) = keys.get(i + AHEAD) {
            f.prefetch(next);
        }
        hits += f.contains(keys[i]) as usize;
    }
    black_box(hits);
    Some(t.elapsed().as_nanos() as f64 / keys.len() as f64)
}

/// Timing rounds: every candidate is measured once per round, in turn, so a burst of load from
/// other processes hits all of them alike; the table gives the best round and the median.
const ROUNDS: usize = 5;

struct Row {
    name: String,
    bits_per_member: f64,
    fpr: f64,
    absent_chain: Vec<f64>,
    absent_indep: Vec<f64>,
    absent_batched: Vec<f64>,
    present_chain: Vec<f64>,
    build: f64,
}

fn timed<T>(n: usize, f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed().as_nanos() as f64 / n as f64)
}

fn run(n: usize, only: &[String]) -> Vec<Row> {
    let want = |name: &str| only.is_empty() || only.iter().any(|o| name.contains(o.as_str()));
    let members = hashes(1, n);
    let absent = hashes(2, PROBES);
    let mut s = 3u64;
    let present: Vec<u128> = (0..PROBES)
        .map(|_| members[reduce(splitmix(&mut s), n as u64) as usize])
        .collect();
    let today_bits = Standard::new(n as u64, 0.01).bits();
    let mut built: Vec<(String, Box<dyn Candidate>, f64)> = Vec::new();

    for (huge, label) in [(false, "4 KiB pages"), (true, "huge pages")] {
        let name = format!("standard Bloom, 1 % (before), {label}");
        if want(&name) {
            let (f, build) = pages(huge, || {
                timed(n, || {
                    let mut f = Standard::new(n as u64, 0.01);
                    f.add_many(&members);
                    f
                })
            });
            built.push((name, Box::new(f), build));
        }
    }
    for (k, bits, label) in [
        (6, today_bits, "today's bits"),
        (7, today_bits, "today's bits"),
        (7, n as u64 * 108 / 10, "10.8 bits"),
    ] {
        let name = format!("blocked 512, k={k}, {label}");
        if want(&name) {
            let (f, build) = timed(n, || {
                let mut f = Blocked::with_bits(bits, k);
                f.add_many(&members);
                f
            });
            built.push((name, Box::new(f), build));
        }
    }
    let name = "split block 8×64, today's bits";
    if want(name) {
        let (f, build) = timed(n, || {
            let mut f = SplitBlock::with_bits(today_bits);
            f.add_many(&members);
            f
        });
        built.push((name.into(), Box::new(f), build));
    }

    let keys: Vec<u64> = members.iter().map(|&h| h as u64).collect();
    let name = "binary fuse8 (xorf, static, 4 KiB pages)";
    if want(name) {
        let (f, build) = timed(n, || Fuse8(BinaryFuse8::try_from(&keys).unwrap()));
        built.push((name.into(), Box::new(f), build));
    }
    let name = "binary fuse16 (xorf, static, 4 KiB pages)";
    if want(name) {
        let (f, build) = timed(n, || Fuse16(BinaryFuse16::try_from(&keys).unwrap()));
        built.push((name.into(), Box::new(f), build));
    }
    // 98 % built into the fuse, 2 % added since into a blocked delta of 16 bits each.
    let cut = n * 98 / 100;
    let name = "fuse8 + blocked delta (2 % of members, 16 bits each)";
    if want(name) {
        let (f, build) = timed(n, || {
            let fuse = Fuse8(BinaryFuse8::try_from(&keys[..cut]).unwrap());
            let mut delta = Blocked::with_bits((n - cut) as u64 * 16, 7);
            delta.add_many(&members[cut..]);
            FuseDelta { fuse, delta }
        });
        built.push((name.into(), Box::new(f), build));
    }
    for (huge, label) in [(false, "4 KiB pages"), (true, "huge pages")] {
        let name = format!("libmember, just built, {label}");
        if want(&name) {
            let (f, build) = pages(huge, || {
                timed(n, || {
                    filter::Bloom::build(n as u64, 0.01, u64::MAX, &members).unwrap()
                })
            });
            built.push((name, Box::new(f), build));
        }
        // 98 % of the members built into the static part, the last 2 % added to the delta.
        let grown = || {
            let mut f = filter::Bloom::build(n as u64, 0.01, u64::MAX, &members[..cut]).unwrap();
            f.add_many(&members[cut..]);
            f
        };
        let name = format!("libmember, 98 % built + 2 % added, {label}");
        if want(&name) {
            let (f, build) = pages(huge, || timed(n, grown));
            built.push((name, Box::new(f), build));
        }
        let name = format!("libmember, 98 % built + 2 % added, {label}, delta first, branch-free");
        if want(&name) {
            let (f, build) = pages(huge, || timed(n, || BranchFree(grown())));
            built.push((name, Box::new(f), build));
        }
        let name = format!("libmember, Bloom alone, 1 %, {label}");
        if want(&name) {
            let (f, build) = pages(huge, || {
                timed(n, || {
                    let mut f = filter::Bloom::new(n as u64, 0.01);
                    f.add_many(&members);
                    f
                })
            });
            built.push((name, Box::new(f), build));
        }
    }
    drop(keys);
    drop(members);

    let mut rows: Vec<Row> = built
        .iter()
        .map(|(name, f, build)| {
            let (_, fp) = independent(f.as_ref(), &absent);
            let (_, tp) = independent(f.as_ref(), &present);
            assert_eq!(tp, present.len(), "{name}: a false negative");
            Row {
                name: name.clone(),
                bits_per_member: f.bits() as f64 / n as f64,
                fpr: fp as f64 / absent.len() as f64,
                absent_chain: Vec::new(),
                absent_indep: Vec::new(),
                absent_batched: Vec::new(),
                present_chain: Vec::new(),
                build: *build,
            }
        })
        .collect();
    for _ in 0..ROUNDS {
        for ((_, f, _), row) in built.iter().zip(rows.iter_mut()) {
            row.absent_indep.push(independent(f.as_ref(), &absent).0);
            row.absent_batched.extend(batched(f.as_ref(), &absent));
            row.absent_chain.push(chain(f.as_ref(), &absent));
            row.present_chain.push(chain(f.as_ref(), &present));
        }
    }
    rows
}

/// "best (median)" of a round's timings.
fn best_median(v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    format!("{:.1} ({:.1})", v[0], v[v.len() / 2])
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` (make test) runs this binary
    // too, without it: do nothing there (the 100 M-member run takes minutes).
    if !std::env::args().any(|a| a == "--bench") {
        println!("bench filter: not run under `cargo test`; use `cargo bench --bench filter`");
        return;
    }
    // `--only standard,libmember`: the candidates whose name contains one of these.
    let only: Vec<String> = std::env::args()
        .find_map(|a| a.strip_prefix("--only=").map(str::to_owned))
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let ns: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.replace('_', "").parse().ok())
        .collect();
    let ns = if ns.is_empty() {
        vec![1_000_000, 100_000_000]
    } else {
        ns
    };
    for n in ns {
        println!("\n{n} members, {PROBES} absent and {PROBES} present probes\n");
        println!(
            "| design | bits/member | measured FPR | absent ns, one at a time | absent ns, independent | absent ns, batched (prefetch 8 ahead) | present ns, one at a time | build ns/member |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in run(n, &only) {
            println!(
                "| {} | {:.2} | {:.3} % | {} | {} | {} | {} | {:.1} |",
                r.name,
                r.bits_per_member,
                r.fpr * 100.0,
                best_median(&r.absent_chain),
                best_median(&r.absent_indep),
                if r.absent_batched.is_empty() {
                    "–".into()
                } else {
                    best_median(&r.absent_batched)
                },
                best_median(&r.present_chain),
                r.build
            );
        }
    }
}
