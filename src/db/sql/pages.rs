//! A sync pass's rows, a page at a time (docs/sync.md, "Paging"): the page, its size, the
//! room it needs under `maxmemory`, and the loop that reads a portal page by page into a sink.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::db::DbErr;
use crate::model::canon::{self, Normalize};
use crate::server::transient::{self, Held};

/// Rows a sync pass reads from PostgreSQL at a time (one `Execute` of its portal) when the
/// headroom under `maxmemory` allows: what the pass holds in the worker is one page of rows,
/// whatever the number of rows that changed.
pub const PAGE_ROWS: usize = 32768;

/// The smallest page: a pass's first page, and what a page shrinks to when the headroom
/// under `maxmemory` has no room for a larger one.
pub const MIN_PAGE_ROWS: usize = 512;

/// What one row is counted for while its page is read (the driver's row, its column ranges,
/// the canonical form being made): a page of [`PAGE_ROWS`] is admitted for 8 MB.
pub const ROW_BYTES: u64 = 256;

/// What one row is counted for once its page is read: its hash and, in cluster mode, its slot.
const HASHED_ROW_BYTES: u64 = 18;

/// How long a pass waits for room for its smallest page before it gives up (rolled back; the
/// next pass reads the same rows again). The headroom is measured about once a second.
const MEMORY_WAIT: Duration = Duration::from_secs(2);
const MEMORY_WAIT_STEP: Duration = Duration::from_millis(50);

/// One page of a sync pass: the canonical hashes of at most [`PAGE_ROWS`] rows, per set.
#[derive(Debug, Default)]
pub struct Page {
    pub rows: HashMap<String, Vec<u128>>,
    /// Cluster mode: the hash slot of each of those rows, in the same order.
    pub slots: HashMap<String, Vec<u16>>,
    /// The page's bytes, counted for its sets (`transient`) until the page is dropped.
    pub held: Vec<Held>,
}

impl Page {
    /// Adds the canonical form of `(entity, scope)` to `set`'s rows (and its slot, in cluster
    /// mode); an item that does not canonicalize is skipped, as a rebuild skips it.
    pub fn push(&mut self, set: &str, norm: Normalize, entity: &str, scope: &str, cluster: bool) {
        let Ok(k) = canon::canonicalize(norm, entity.as_bytes(), scope.as_bytes()) else {
            return;
        };
        match self.rows.get_mut(set) {
            Some(v) => v.push(k.hash),
            None => {
                self.rows.insert(set.to_string(), vec![k.hash]);
            }
        }
        if cluster {
            let slot = crate::model::slot::keyslot(k.entity.as_bytes());
            self.slots.entry(set.to_string()).or_default().push(slot);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Where a pass hands its pages (the sync loop's pager, which waits while the main thread is
/// behind). An error ends the pass: its transaction is rolled back, nothing is advanced.
pub type Sink<'a> = dyn FnMut(Page) -> Result<(), DbErr> + 'a;

/// Room under `maxmemory` for a page of at most `want` rows: the largest of `want`, halved
/// down to [`MIN_PAGE_ROWS`], that fits in the headroom, held. When not even the smallest
/// fits, waits (counted once in `memory_waits`) up to [`MEMORY_WAIT`] for the headroom to
/// grow, then refuses with `transient`'s fixed text: the module never pushes the server into
/// evicting keys to read a page.
fn admit_page(want: usize) -> Result<(usize, Held), DbErr> {
    let deadline = Instant::now() + MEMORY_WAIT;
    let mut waited = false;
    loop {
        let mut n = want.max(MIN_PAGE_ROWS);
        let room = transient::headroom();
        let refused = loop {
            match transient::fits(n as u64 * ROW_BYTES, room) {
                Ok(()) => return Ok((n, transient::hold(n as u64 * ROW_BYTES))),
                Err(_) if n > MIN_PAGE_ROWS => n = (n / 2).max(MIN_PAGE_ROWS),
                Err(e) => break e,
            }
        };
        if !waited {
            waited = true;
            transient::count_wait();
        }
        if Instant::now() >= deadline {
            return Err(DbErr::Invalid(refused));
        }
        std::thread::sleep(MEMORY_WAIT_STEP);
    }
}

/// Reads `portal` page by page, handing each page's rows to `each` (which turns them into a
/// [`Page`], dropping the rows) and the page to `sink`, until the portal is exhausted. The
/// rows of one page are all the memory this holds, and each page is admitted under
/// `maxmemory` first (`admit_page`): the first page is the smallest, each next one twice the
/// last up to [`PAGE_ROWS`] while the headroom allows. `Ok(Err(_))`: the sink gave up, or
/// there was no room for a page.
pub(crate) fn read_pages(
    tx: &mut postgres::Transaction,
    portal: &postgres::Portal,
    sink: &mut Sink,
    mut each: impl FnMut(usize, &postgres::Row, &mut Page),
) -> Result<Result<(), DbErr>, postgres::Error> {
    let mut seen = 0;
    let mut want = MIN_PAGE_ROWS;
    loop {
        let (n, reading) = match admit_page(want) {
            Ok(admitted) => admitted,
            Err(e) => return Ok(Err(e)),
        };
        want = (n * 2).min(PAGE_ROWS);
        let rows = tx.query_portal(portal, n as i32)?;
        let last = rows.len() < n;
        let mut page = Page::default();
        for r in &rows {
            each(seen, r, &mut page);
            seen += 1;
        }
        drop(rows);
        page.held = page
            .rows
            .iter()
            .map(|(set, v)| transient::hold_for(set, v.len() as u64 * HASHED_ROW_BYTES))
            .collect();
        drop(reading);
        if !page.is_empty() {
            if let Err(e) = sink(page) {
                return Ok(Err(e));
            }
        }
        if last {
            return Ok(Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_holds_each_sets_canonical_hashes_in_order() {
        let mut p = Page::default();
        assert!(p.is_empty());
        p.push("a", Normalize::Lower, "Alice", "", false);
        p.push("b", Normalize::None, "bob", "org", false);
        // An item the module would refuse (empty) is skipped, as a rebuild skips it.
        p.push("a", Normalize::None, "", "", false);
        p.push("a", Normalize::None, "carol", "", false);
        let hash = |n, e: &str, s: &str| {
            canon::canonicalize(n, e.as_bytes(), s.as_bytes())
                .unwrap()
                .hash
        };
        assert_eq!(
            p.rows["a"],
            vec![
                hash(Normalize::None, "alice", ""),
                hash(Normalize::None, "carol", "")
            ]
        );
        assert_eq!(p.rows["b"], vec![hash(Normalize::None, "bob", "org")]);
        assert!(p.slots.is_empty(), "slots only in cluster mode");
    }
}
