//! The rows a build read, as item hashes, held in bounded memory: sorted into `BUCKETS`
//! buckets by the top bits of each hash, kept in memory up to a limit, and past it written
//! to an unnamed spill file in chunks, so that a build of any size holds a fixed number of
//! bytes of rows (docs/sync.md, "Rebuilding in bounded memory").
//!
//! The buckets follow the static part's partition: a static part of `2^b` parts (`b ≤ 7`)
//! puts a hash in part `high >> (64 - b)`, so each part is a run of whole buckets and is
//! built from them alone.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::fuse::{bucket_of, Buckets, BUCKETS};
/// Most hashes a bucket collects before it writes them out as one chunk, once spilling
/// (fewer under a small limit: all buckets' open chunks together stay within the limit).
const CHUNK: usize = 1024;
/// Fewest hashes a chunk holds.
const MIN_CHUNK: usize = 64;
/// Bytes one hash takes, in memory and in the spill file.
pub const HASH_BYTES: usize = 16;

/// Item hashes of a build, in buckets, in memory up to `limit` hashes and in a spill file
/// beyond.
pub struct Rows {
    /// Per bucket, the hashes not (yet) in the spill file.
    open: Vec<Vec<u128>>,
    /// Per bucket, how many hashes it holds in all.
    counts: [u64; BUCKETS],
    /// Hashes held in memory.
    held: usize,
    /// Most hashes held in memory before the rows spill.
    limit: usize,
    /// Hashes a bucket writes out at a time once spilling.
    chunk: usize,
    spill: Option<Spill>,
}

/// The spill file (already unlinked: it goes when the build ends, however it ends) and the
/// chunks each bucket wrote to it.
struct Spill {
    file: File,
    end: u64,
    chunks: Vec<Vec<(u64, u32)>>,
    scratch: Vec<u8>,
}

impl Rows {
    /// Rows kept in memory up to `limit_bytes` of hashes, then spilled to a file created in
    /// the directory `push` names (on the first row past the limit). `u64::MAX` never spills.
    pub fn new(limit_bytes: u64) -> Rows {
        let limit = (limit_bytes / HASH_BYTES as u64).min(usize::MAX as u64) as usize;
        Rows {
            chunk: (limit / BUCKETS).clamp(MIN_CHUNK, CHUNK),
            open: (0..BUCKETS).map(|_| Vec::new()).collect(),
            counts: [0; BUCKETS],
            held: 0,
            limit,
            spill: None,
        }
    }

    /// Rows held in memory only, whatever their number (tests, small callers).
    pub fn in_memory(hashes: &[u128]) -> Rows {
        let mut rows = Rows::new(u64::MAX);
        for &h in hashes {
            // In memory only: no file is ever written.
            let _ = rows.push(h, Path::new("."));
        }
        rows
    }

    /// Adds one hash; past the limit, spills to a file created in `dir`.
    pub fn push(&mut self, hash: u128, dir: &Path) -> io::Result<()> {
        let b = bucket_of(hash);
        self.open[b].push(hash);
        self.counts[b] += 1;
        self.held += 1;
        match &mut self.spill {
            Some(s) if self.open[b].len() >= self.chunk => {
                self.held -= self.open[b].len();
                s.write(b, &mut self.open[b])
            }
            Some(_) => Ok(()),
            None if self.held > self.limit => self.start_spill(dir),
            None => Ok(()),
        }
    }

    /// Opens the spill file and writes every bucket's hashes to it.
    fn start_spill(&mut self, dir: &Path) -> io::Result<()> {
        let mut s = Spill::create(dir, self.chunk)?;
        for (b, open) in self.open.iter_mut().enumerate() {
            for chunk in open.chunks(self.chunk) {
                s.write_chunk(b, chunk)?;
            }
            // Exactly one chunk's room from now on: a flush empties it before it would grow.
            *open = Vec::with_capacity(self.chunk);
        }
        self.held = 0;
        self.spill = Some(s);
        Ok(())
    }

    /// How many hashes there are.
    pub fn len(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many hashes buckets `range` hold.
    pub fn count(&self, range: std::ops::Range<usize>) -> u64 {
        self.counts[range].iter().sum()
    }

    /// Whether the rows went to a spill file.
    pub fn spilled(&self) -> bool {
        self.spill.is_some()
    }

    /// Bytes written to the spill file (0 when the rows stayed in memory).
    pub fn spilled_bytes(&self) -> u64 {
        self.spill.as_ref().map_or(0, |s| s.end)
    }

    /// Bytes of hashes held in memory now (the spill file's page cache is not the server's).
    pub fn held_bytes(&self) -> u64 {
        self.open
            .iter()
            .map(|o| o.capacity() * HASH_BYTES)
            .sum::<usize>() as u64
    }

    /// Calls `f` with every hash of buckets `range` (file chunks first, then those in memory).
    pub fn each(&self, range: std::ops::Range<usize>, mut f: impl FnMut(u128)) -> io::Result<()> {
        let mut buf = Vec::new();
        for b in range {
            if let Some(s) = &self.spill {
                for &(at, n) in &s.chunks[b] {
                    buf.resize(n as usize * HASH_BYTES, 0);
                    s.file.read_exact_at(&mut buf, at)?;
                    for h in buf.chunks_exact(HASH_BYTES) {
                        f(u128::from_le_bytes(h.try_into().unwrap()));
                    }
                }
            }
            self.open[b].iter().copied().for_each(&mut f);
        }
        Ok(())
    }

    /// Calls `f` with every hash.
    pub fn each_all(&self, f: impl FnMut(u128)) -> io::Result<()> {
        self.each(0..BUCKETS, f)
    }

    /// Every hash, in one vector (for callers whose rows are few: a slot fill).
    pub fn to_vec(&self) -> io::Result<Vec<u128>> {
        let mut v = Vec::with_capacity(self.len() as usize);
        self.each_all(|h| v.push(h))?;
        Ok(v)
    }
}

impl Buckets for Rows {
    fn len(&self) -> u64 {
        Rows::len(self)
    }

    fn count(&self, range: std::ops::Range<usize>) -> u64 {
        Rows::count(self, range)
    }

    fn each(&self, range: std::ops::Range<usize>, f: impl FnMut(u128)) -> io::Result<()> {
        Rows::each(self, range, f)
    }
}

impl Spill {
    /// An unnamed file in `dir`: created with a name no other build uses, then unlinked at
    /// once, so nothing is left behind if the server stops mid-build.
    fn create(dir: &Path, chunk: usize) -> io::Result<Spill> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("libmember-build-{}-{n}.spill", std::process::id()));
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?
        };
        std::fs::remove_file(&path)?;
        Ok(Spill {
            file,
            end: 0,
            chunks: (0..BUCKETS).map(|_| Vec::new()).collect(),
            scratch: Vec::with_capacity(chunk * HASH_BYTES),
        })
    }

    /// Writes bucket `b`'s open hashes as one chunk and empties them.
    fn write(&mut self, b: usize, open: &mut Vec<u128>) -> io::Result<()> {
        self.write_chunk(b, open)?;
        open.clear();
        Ok(())
    }

    fn write_chunk(&mut self, b: usize, chunk: &[u128]) -> io::Result<()> {
        self.scratch.clear();
        for h in chunk {
            self.scratch.extend_from_slice(&h.to_le_bytes());
        }
        self.file.write_all_at(&self.scratch, self.end)?;
        self.chunks[b].push((self.end, chunk.len() as u32));
        self.end += self.scratch.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    // Used by the tests only: benches/filter.rs compiles this file without them.
    #[allow(unused_imports)]
    use super::*;

    fn hashes(n: u64) -> Vec<u128> {
        (0..n)
            .map(|i| xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes()))
            .collect()
    }

    #[test]
    fn spilled_rows_read_back_as_written() {
        let dir = std::env::temp_dir();
        let hs = hashes(50_000);
        // 10 000 hashes in memory at most: the rest spill.
        let mut rows = Rows::new(10_000 * HASH_BYTES as u64);
        for &h in &hs {
            rows.push(h, &dir).unwrap();
        }
        assert!(rows.spilled());
        assert_eq!(rows.len(), hs.len() as u64);
        // Once spilled, the open chunks of all buckets stay within the limit.
        let held = rows.held_bytes();
        assert!(held <= 10_000 * HASH_BYTES as u64, "{held}");
        let mut back = rows.to_vec().unwrap();
        let mut want = hs.clone();
        back.sort_unstable();
        want.sort_unstable();
        assert_eq!(back, want);
        // Each bucket holds its own hashes only.
        for b in [0, 5, BUCKETS - 1] {
            let mut n = 0;
            rows.each(b..b + 1, |h| {
                assert_eq!(bucket_of(h), b);
                n += 1;
            })
            .unwrap();
            assert_eq!(n, rows.count(b..b + 1));
        }
        // Nothing is left in the directory.
        let left = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("libmember-build-{}-", std::process::id()))
            })
            .count();
        assert_eq!(left, 0);
    }

    #[test]
    fn rows_under_the_limit_stay_in_memory() {
        let hs = hashes(1000);
        let rows = Rows::in_memory(&hs);
        assert!(!rows.spilled());
        assert_eq!(rows.len(), 1000);
        assert_eq!(rows.count(0..BUCKETS), 1000);
    }

    #[test]
    fn a_directory_that_cannot_hold_the_spill_is_an_error() {
        let mut rows = Rows::new(HASH_BYTES as u64);
        let missing = Path::new("/nonexistent/libmember");
        rows.push(1, missing).unwrap();
        assert!(rows.push(2, missing).is_err());
    }
}
