//! How current this node's copy of the set catalog is: what `catalog.rs` has read and
//! applied, what it is reading, and which sets changed here meanwhile (a read is not applied
//! over them). Pure bookkeeping on the main thread's registry (`state::Registry::catalog`).

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

/// How many changed names the catalog state remembers (`Catalog::touched`).
const TOUCHED_KEPT: usize = 4096;

/// What a query about one name remembers of the catalog copy when it is sent
/// ([`Catalog::asked_at`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AskedAt {
    /// `Catalog::changes` then.
    pub changes: u64,
    /// `Catalog::removals` then.
    pub removals: u64,
    /// The version applied then.
    pub version: Option<i64>,
}

/// How current this node's copy of the set catalog is (see `catalog.rs`).
#[derive(Debug, Default)]
pub struct Catalog {
    /// The catalog has been read since start-up.
    pub loaded: bool,
    /// A read (full or periodic check) is in flight.
    pub loading: bool,
    pub last_error: Option<String>,
    /// No read before this (after a failure).
    pub next_try: Option<Instant>,
    /// The catalog version the registry reflects (of the last read applied).
    pub version: Option<i64>,
    /// A full re-read is due: a dataset was loaded or this node was promoted.
    pub reread: bool,
    /// When the next periodic version check is due.
    pub next_check: Option<Instant>,
    /// Bumped whenever a set is added to or removed from the registry: a catalog read sent
    /// before such a change is not applied over it.
    pub changes: u64,
    /// Bumped whenever a set is removed from the registry.
    pub removals: u64,
    /// The names of the latest `changes`, each with the count it brought `changes` to (at
    /// most `TOUCHED_KEPT`): a read that raced with them is still applied to every other name.
    pub touched: VecDeque<(u64, String)>,
    /// Promoted and not re-read since: no set serves before the catalog has confirmed it (a
    /// command naming one asks the catalog, as for an unknown name).
    pub hold: bool,
}

impl Catalog {
    /// A read of catalog `version` (`full`: every definition, else a periodic check that found
    /// the version changed) was applied to every name not changed here while it ran; `raced`
    /// when some were. Those are read again at once, so the version applied does not move on
    /// then: a check against the new one would find nothing changed, and a set dropped
    /// elsewhere but touched here during the read would be held until the catalog next
    /// changed.
    pub fn read_applied(&mut self, version: i64, full: bool, raced: bool) {
        self.loaded = true;
        self.last_error = None;
        if raced && full {
            self.reread = true;
        } else if raced {
            self.next_check = None;
        } else {
            self.version = Some(version);
            self.hold &= !full;
        }
    }

    /// Whether set `name` has not changed here since `changes` counted (false when more
    /// changed than is remembered: it may have).
    pub fn untouched_since(&self, name: &str, changes: u64) -> bool {
        self.touched_since(changes)
            .is_some_and(|t| !t.contains(name))
    }

    /// What a query about one name remembers of this copy when it is sent.
    pub fn asked_at(&self) -> AskedAt {
        AskedAt {
            changes: self.changes,
            removals: self.removals,
            version: self.version,
        }
    }

    /// Whether one set's definition, read from the catalog at version `read_at` by a query
    /// sent at `sent`, may be learned: a set removed here since, or a catalog read applied
    /// since that is newer than the answer (it may have found nothing of a set dropped
    /// meanwhile to forget, this node not holding it yet), makes the answer possibly older
    /// than a DROP. A version that only looks newer because it came from another database
    /// (`member.pg-url` changed) was there when the query was sent, and does not count.
    pub fn answer_is_current(&self, read_at: i64, sent: AskedAt) -> bool {
        self.removals == sent.removals
            && (self.version == sent.version || self.version.is_none_or(|v| v <= read_at))
    }

    /// Counts a change of set `name` on this node.
    pub fn touch(&mut self, name: &str) {
        self.changes += 1;
        self.touched.push_back((self.changes, name.to_string()));
        if self.touched.len() > TOUCHED_KEPT {
            self.touched.pop_front();
        }
    }

    /// The names changed on this node since `changes` counted them, or `None` when more changed
    /// than are remembered.
    pub fn touched_since(&self, changes: u64) -> Option<HashSet<String>> {
        if self.changes == changes {
            return Some(Default::default());
        }
        let covered = self.touched.front().is_some_and(|(n, _)| *n <= changes + 1);
        covered.then(|| {
            self.touched
                .iter()
                .filter(|(n, _)| *n > changes)
                .map(|(_, name)| name.clone())
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_raced_knows_which_names_changed_since_it_was_sent() {
        let mut c = Catalog::default();
        c.touch("a");
        let sent = c.changes;
        assert_eq!(c.touched_since(sent), Some(Default::default()));
        c.touch("b");
        c.touch("c");
        let got = c.touched_since(sent).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.contains("b") && got.contains("c") && !got.contains("a"));
        // More changes than remembered: the read cannot tell, and is not applied.
        for i in 0..TOUCHED_KEPT {
            c.touch(&format!("n{i}"));
        }
        assert_eq!(c.touched_since(sent), None);
        assert_eq!(c.touched_since(c.changes - 1).unwrap().len(), 1);
    }

    #[test]
    fn a_name_is_untouched_when_only_other_names_changed() {
        let mut c = Catalog::default();
        let sent = c.changes;
        assert!(c.untouched_since("a", sent));
        c.touch("b");
        assert!(
            c.untouched_since("a", sent),
            "another set's change does not count"
        );
        c.touch("a");
        assert!(!c.untouched_since("a", sent));
        for i in 0..TOUCHED_KEPT {
            c.touch(&format!("n{i}"));
        }
        assert!(
            !c.untouched_since("z", sent),
            "past what is remembered: it may have"
        );
    }

    #[test]
    fn a_read_that_raced_is_read_again_against_the_version_before_it() {
        let mut c = Catalog::default();
        c.read_applied(5, true, false);
        assert_eq!((c.loaded, c.version, c.reread), (true, Some(5), false));
        c.next_check = Some(Instant::now());
        // A periodic check found version 7, but a name changed here meanwhile: the check
        // that follows at once must still see 7 as new, or that name is never read again.
        c.read_applied(7, false, true);
        assert_eq!((c.version, c.next_check, c.reread), (Some(5), None, false));
        c.read_applied(7, false, false);
        assert_eq!(c.version, Some(7));
        // A full read that raced is made again in full; one that did not lifts the hold.
        c.hold = true;
        c.read_applied(9, true, true);
        assert_eq!((c.version, c.reread, c.hold), (Some(7), true, true));
        c.reread = false;
        c.read_applied(9, true, false);
        assert_eq!((c.version, c.hold), (Some(9), false));
    }

    #[test]
    fn a_set_answer_older_than_what_this_node_has_applied_is_not_learned() {
        let mut c = Catalog::default();
        let first = c.asked_at();
        assert!(c.answer_is_current(3, first), "nothing applied yet");
        c.version = Some(4);
        // Read at version 3, before a DROP that the version 4 applied since may hold.
        assert!(!c.answer_is_current(3, first));
        assert!(c.answer_is_current(4, first));
        let sent = c.asked_at();
        assert!(c.answer_is_current(6, sent));
        // Applied before the query was sent (another database after a pg-url change): the
        // answer is the newest there is.
        assert!(c.answer_is_current(1, sent));
        c.version = Some(7);
        assert!(!c.answer_is_current(6, sent));
        // A set was removed here since the query was sent.
        let sent = c.asked_at();
        c.removals += 1;
        assert!(!c.answer_is_current(9, sent));
        assert!(c.answer_is_current(9, c.asked_at()));
    }
}
