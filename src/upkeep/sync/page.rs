//! A sync pass in bounded steps (docs/sync.md, "Paging"): the worker hands each page of rows
//! to the main thread as soon as it is read, and never runs more than [`PAGES_IN_FLIGHT`]
//! pages ahead; the main thread adds each page's rows to its sets' filters, and remembers which
//! filter value received them, so that the pass's end advances only a value that got them all.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use redis_module::Context;

use super::Member;
use crate::db::sql::Page;
use crate::db::DbErr;
use crate::{filter::store, sets::state};

/// Pages a pass may have handed to the main thread and not yet had applied: with the one
/// being read, what a pass holds is three pages, whatever the number of rows that changed.
pub const PAGES_IN_FLIGHT: usize = 2;

/// How long the worker waits for the main thread to apply a page before giving the pass up
/// (its transaction is rolled back; the next pass reads the same rows again).
const PAGE_WAIT: Duration = Duration::from_secs(60);

/// What the pages of the pass in flight did to one set (main thread).
#[derive(Debug, Default)]
pub(super) struct Paged {
    /// The set's incarnation when the pass started: pages for another one are dropped.
    incarnation: u64,
    /// The filter value the pages found at the set's key (the first one's).
    value: Option<u64>,
    seen: bool,
    /// A page found no value, or another value than the first page did.
    broken: bool,
    /// Rows added.
    pub rows: u64,
}

impl Paged {
    /// A page of this set found the value `id` (`None`: no filter at the key) and added `rows`.
    fn saw(&mut self, id: Option<u64>, rows: usize) {
        if !self.seen {
            self.seen = true;
            self.value = id;
        }
        if id.is_none() || id != self.value {
            self.broken = true;
        }
        self.rows += rows as u64;
    }

    /// Whether the value `id`, at the set's key when the pass ends, received every page of
    /// the set: only then may the pass advance its watermark.
    pub fn received_all(&self, id: u64) -> bool {
        !self.broken && (!self.seen || self.value == Some(id))
    }
}

thread_local! {
    /// The pass in flight's sets (there is at most one pass in flight).
    static PAGED: RefCell<HashMap<String, Paged>> = RefCell::new(HashMap::new());
}

/// A pass over `members` starts: its pages go to these sets only.
pub(super) fn begin(members: &[Member]) {
    PAGED.with(|p| {
        *p.borrow_mut() = members
            .iter()
            .map(|m| {
                let paged = Paged {
                    incarnation: m.incarnation,
                    ..Paged::default()
                };
                (m.name.clone(), paged)
            })
            .collect()
    });
}

/// What the pages did to `set` (the pass is ending).
pub(super) fn take(set: &str) -> Paged {
    PAGED.with(|p| p.borrow_mut().remove(set).unwrap_or_default())
}

/// Applies one page on the main thread: each set's rows (those of the slots its filter covers,
/// in cluster mode) go into the filter at its key and into the journal of a rebuild in flight.
/// Adding bits is always safe; the watermark moves only at the pass's end. A set dropped or
/// created again since the pass started gets nothing.
pub(super) fn apply(ctx: &Context, page: Page) {
    let Page {
        rows,
        mut slots,
        held: _held,
    } = page;
    for (set, hashes) in rows {
        let slots = slots.remove(&set);
        let Some(incarnation) = PAGED.with(|p| p.borrow().get(&set).map(|p| p.incarnation)) else {
            continue;
        };
        let key = state::with(|r| {
            r.sets
                .get(&set)
                .filter(|s| s.incarnation == incarnation)
                .map(|s| s.filter_key.clone())
        });
        let Some(key) = key else {
            continue;
        };
        let hashes = match slots {
            Some(slots) => covered_rows(ctx, &set, hashes, &slots),
            None => hashes,
        };
        let id = store::with_mut(ctx, &key, |f| {
            for h in &hashes {
                f.add(*h);
            }
            f.id
        });
        state::with(|r| {
            if let Some(s) = r.sets.get_mut(&set) {
                for h in &hashes {
                    s.journal(*h);
                }
                s.sync.rows_applied += hashes.len() as u64;
                // Rows added to a value other than the trusted one: the trusted value
                // (moved away meanwhile, if anywhere) missed them.
                if !hashes.is_empty() {
                    s.filter_added(id);
                }
            }
        });
        PAGED.with(|p| {
            if let Some(p) = p.borrow_mut().get_mut(&set) {
                p.saw(id, hashes.len());
            }
        });
    }
}

/// Cluster mode: the rows of a pass that belong to slots the set's filter covers, or will
/// (a slot fill or a rebuild in flight). Rows of other slots are another node's to apply:
/// leaving them out is what keeps each node's filter the size of its own slots.
fn covered_rows(ctx: &Context, set: &str, hashes: Vec<u128>, slots: &[u16]) -> Vec<u128> {
    let Some((key, extra)) = state::with(|r| {
        r.sets
            .get(set)
            .map(|s| (s.filter_key.clone(), s.cover_extra.clone()))
    }) else {
        return hashes;
    };
    store::with(ctx, &key, |f| {
        hashes
            .iter()
            .zip(slots)
            .filter(|(_, s)| f.covers(**s) || extra.as_ref().is_some_and(|e| e.contains(**s)))
            .map(|(h, _)| *h)
            .collect()
    })
    .unwrap_or(hashes)
}

/// Sent when a page has been applied on the main thread, or dropped unapplied.
pub(super) struct Ack(Sender<()>);

impl Drop for Ack {
    fn drop(&mut self) {
        let _ = self.0.try_send(());
    }
}

/// The worker's side: hands pages over through `post`, waiting while [`PAGES_IN_FLIGHT`] of
/// them are not applied yet.
pub(super) struct Pager<P: FnMut(Page, Ack)> {
    post: P,
    acks: Receiver<()>,
    ack_tx: Sender<()>,
    in_flight: usize,
    wait: Duration,
}

impl<P: FnMut(Page, Ack)> Pager<P> {
    pub fn new(post: P) -> Self {
        Self::with_wait(post, PAGE_WAIT)
    }

    fn with_wait(post: P, wait: Duration) -> Self {
        let (ack_tx, acks) = bounded(PAGES_IN_FLIGHT);
        Pager {
            post,
            acks,
            ack_tx,
            in_flight: 0,
            wait,
        }
    }

    /// Hands `page` over, once fewer than [`PAGES_IN_FLIGHT`] pages are waiting.
    pub fn send(&mut self, page: Page) -> Result<(), DbErr> {
        while self.acks.try_recv().is_ok() {
            self.in_flight -= 1;
        }
        if self.in_flight >= PAGES_IN_FLIGHT {
            match self.acks.recv_timeout(self.wait) {
                Ok(()) => self.in_flight -= 1,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    return Err(DbErr::Unavailable(
                        "sync pass: the main thread applied no page in time".into(),
                    ))
                }
            }
        }
        self.in_flight += 1;
        (self.post)(page, Ack(self.ack_tx.clone()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(n: u128) -> Page {
        let mut p = Page::default();
        p.rows.insert("s".into(), vec![n]);
        p
    }

    #[test]
    fn the_worker_waits_for_the_main_thread_after_two_pages() {
        let mut held = Vec::new();
        let mut pager = Pager::with_wait(|p, ack| held.push((p, ack)), Duration::from_millis(50));
        assert!(pager.send(page(1)).is_ok());
        assert!(pager.send(page(2)).is_ok());
        // Nothing applied: the third page is not read ahead, the pass gives up.
        assert!(pager.send(page(3)).is_err());
        drop(pager);
        assert_eq!(held.len(), 2);
    }

    #[test]
    fn an_applied_or_dropped_page_makes_room() {
        let mut held: Vec<(Page, Ack)> = Vec::new();
        let mut pager = Pager::with_wait(
            |p, ack| {
                // The main thread applies every other page at once, drops the rest later.
                held.push((p, ack));
                if held.len() == 2 {
                    held.clear();
                }
            },
            Duration::from_millis(50),
        );
        for i in 0..10 {
            assert!(pager.send(page(i)).is_ok(), "page {i}");
        }
    }

    #[test]
    fn a_watermark_advances_only_on_the_value_that_got_every_page() {
        let mut p = Paged::default();
        assert!(p.received_all(7), "no page: nothing to miss");
        p.saw(Some(7), 3);
        p.saw(Some(7), 0);
        assert!(p.received_all(7) && !p.received_all(8));
        assert_eq!(p.rows, 3);
        // A value swapped in between two pages missed the first one; so did the first value
        // the second page.
        p.saw(Some(8), 1);
        assert!(!p.received_all(8) && !p.received_all(7));
        let mut p = Paged::default();
        p.saw(None, 2);
        assert!(
            !p.received_all(5),
            "a page found no value: the one there now missed it"
        );
    }
}
