//! A sync pass's rows, a page at a time (docs/sync.md, "Paging"): the page, its size, and
//! the loop that reads a portal page by page into a sink.

use std::collections::HashMap;

use crate::canon::{self, Normalize};
use crate::db::DbErr;

/// Rows a sync pass reads from PostgreSQL at a time (one `Execute` of its portal): what the
/// pass holds in the worker is one page of rows, whatever the number of rows that changed.
pub const PAGE_ROWS: usize = 8192;

/// One page of a sync pass: the canonical hashes of at most [`PAGE_ROWS`] rows, per set.
#[derive(Debug, Default, PartialEq)]
pub struct Page {
    pub rows: HashMap<String, Vec<u128>>,
    /// Cluster mode: the hash slot of each of those rows, in the same order.
    pub slots: HashMap<String, Vec<u16>>,
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
            let slot = crate::cluster::slot::keyslot(k.entity.as_bytes());
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

/// Reads `portal` page by page, handing each page's rows to `each` (which turns them into a
/// [`Page`], dropping the rows) and the page to `sink`, until the portal is exhausted. The
/// rows of one page are all the memory this holds. `Ok(Err(_))`: the sink gave up.
pub(crate) fn read_pages(
    tx: &mut postgres::Transaction,
    portal: &postgres::Portal,
    sink: &mut Sink,
    mut each: impl FnMut(usize, &postgres::Row, &mut Page),
) -> Result<Result<(), DbErr>, postgres::Error> {
    let mut seen = 0;
    loop {
        let rows = tx.query_portal(portal, PAGE_ROWS as i32)?;
        let last = rows.len() < PAGE_ROWS;
        let mut page = Page::default();
        for r in &rows {
            each(seen, r, &mut page);
            seen += 1;
        }
        drop(rows);
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
