//! When this node's filters may answer "absent", by its role and its replication link
//! (docs/replicas.md). A primary may once a promotion's grace has passed and its filters have
//! caught up since. A replica may only while its link to the primary is online and its filters
//! have caught up by work started after the link came up (after a change of primary, a grace
//! later): while the link is down the primary's ADDs stop arriving, and a filter caught up
//! before the link came up may miss those its primary took before its stream reached here.
//! Pure: the registry holds one (`sets/state.rs`) and moves its promotion epoch when a change
//! here says so, which the lookup path already compares (no extra load per call).

use std::time::{Duration, Instant};

/// Why a node's filters may not answer "absent" right now (`None` from [`Standing::withheld`]:
/// they may, once each set has caught up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Withheld {
    /// A replica whose link to its primary is not online (handshake, full sync, dropped).
    LinkDown,
    /// Promoted, or a replica's link up with a new primary: work counts from the end of the
    /// handover grace.
    Grace,
}

impl Withheld {
    pub fn name(self) -> &'static str {
        match self {
            Withheld::LinkDown => "link-down",
            Withheld::Grace => "grace",
        }
    }
}

/// The node's role and link, and from when work counts towards trusting its filters again.
#[derive(Clone, Debug, Default)]
pub struct Standing {
    replica: bool,
    link_up: bool,
    /// Work (a sync pass, a rebuild) brings a filter current only if it started at or after
    /// this (a promotion's or a new primary's grace, a link's coming up).
    counts_from: Option<Instant>,
    /// When the role or the link last changed.
    since: Option<Instant>,
    /// The replication id shared with the primary when the link was last up: the same one at
    /// the next link-up means the same primary (a partial resync), which needs no grace.
    replid: Option<String>,
    /// Times the link went down or the node became a replica (INFO).
    pub link_losses: u64,
}

impl Standing {
    /// A node that starts as a replica (`replicaof` in its configuration): no link yet.
    pub fn starting_as_replica(now: Instant) -> Self {
        Standing {
            replica: true,
            since: Some(now),
            ..Default::default()
        }
    }

    pub fn is_replica(&self) -> bool {
        self.replica
    }

    pub fn link_up(&self) -> bool {
        self.replica && self.link_up
    }

    /// When the role or the link last changed.
    pub fn since(&self) -> Option<Instant> {
        self.since
    }

    /// Became a primary: work counts once `grace` has passed. The caller moves the epoch.
    pub fn promoted(&mut self, now: Instant, grace: Duration) {
        self.replica = false;
        self.link_up = false;
        self.counts_from = Some(now + grace);
        self.since = Some(now);
        self.replid = None;
    }

    /// Became a replica (`REPLICAOF host port` on a primary): the link is not up yet. The
    /// caller moves the epoch.
    pub fn demoted(&mut self, now: Instant) {
        self.replica = true;
        self.link_up = false;
        self.since = Some(now);
        self.replid = None;
        self.link_losses += 1;
    }

    /// The replica's link went down: true when the caller must move the epoch (it was up, so
    /// filters may have caught up in the period that ended).
    pub fn link_lost(&mut self, now: Instant) -> bool {
        if !self.replica {
            return false;
        }
        let was = std::mem::replace(&mut self.link_up, false);
        if was {
            self.since = Some(now);
            self.link_losses += 1;
        }
        was
    }

    /// The replica's link came up, sharing `replid` with its primary. Work counts from now,
    /// or from a grace later when the primary is not the one of the last link (the old one
    /// may still acknowledge an ADD it took before, which only work started after the grace
    /// reads). Returns when work counts from, `None` on a primary (no such event).
    pub fn link_came_up(
        &mut self,
        now: Instant,
        grace: Duration,
        replid: Option<String>,
    ) -> Option<Instant> {
        if !self.replica {
            return None;
        }
        // Told again without a loss in between (a dual-channel sync says so once per
        // channel): the period that began first goes on, its grace included.
        if self.link_up {
            return self.counts_from;
        }
        let same = replid.is_some() && replid == self.replid;
        self.link_up = true;
        self.since = Some(now);
        self.replid = replid;
        // Never before a grace still running: a dual-channel sync says the link is up when
        // the primary accepts it, down while the snapshot loads, and up again.
        let from = if same { now } else { now + grace };
        let from = self.counts_from.map_or(from, |t| t.max(from));
        self.counts_from = Some(from);
        Some(from)
    }

    /// Whether work that started at `started` may bring a filter current now.
    pub fn counts(&self, started: Instant) -> bool {
        (!self.replica || self.link_up) && self.counts_from.is_none_or(|t| started >= t)
    }

    /// Why filters may not answer "absent" at `now`, whatever their own state.
    pub fn withheld(&self, now: Instant) -> Option<Withheld> {
        if self.replica && !self.link_up {
            return Some(Withheld::LinkDown);
        }
        match self.counts_from {
            Some(t) if now < t => Some(Withheld::Grace),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(3);

    #[test]
    fn a_primary_counts_everything_until_promoted_then_only_after_the_grace() {
        let t0 = Instant::now();
        let mut s = Standing::default();
        assert!(s.counts(t0));
        assert_eq!(s.withheld(t0), None);
        s.promoted(t0, GRACE);
        assert!(!s.counts(t0 + Duration::from_secs(1)));
        assert_eq!(s.withheld(t0), Some(Withheld::Grace));
        assert!(s.counts(t0 + GRACE));
        assert_eq!(s.withheld(t0 + GRACE), None);
    }

    #[test]
    fn a_replica_counts_nothing_while_its_link_is_down() {
        let t0 = Instant::now();
        let mut s = Standing::default();
        s.demoted(t0);
        assert!(s.is_replica());
        let later = t0 + Duration::from_secs(100);
        assert!(!s.counts(later), "no work counts without a link");
        assert_eq!(s.withheld(later), Some(Withheld::LinkDown));
        let s = Standing::starting_as_replica(t0);
        assert!(!s.counts(later));
        assert_eq!(s.withheld(later), Some(Withheld::LinkDown));
    }

    #[test]
    fn a_new_primary_counts_work_from_a_grace_after_the_link_came_up() {
        let t0 = Instant::now();
        let mut s = Standing::starting_as_replica(t0);
        let up = t0 + Duration::from_secs(5);
        assert_eq!(
            s.link_came_up(up, GRACE, Some("a".into())),
            Some(up + GRACE)
        );
        assert!(!s.counts(up), "work before the grace's end");
        assert!(!s.counts(t0), "work before the link came up");
        assert_eq!(s.withheld(up), Some(Withheld::Grace));
        assert!(s.counts(up + GRACE));
        assert_eq!(s.withheld(up + GRACE), None);
    }

    #[test]
    fn the_same_primary_again_needs_no_grace_another_does() {
        let t0 = Instant::now();
        let mut s = Standing::starting_as_replica(t0);
        s.link_came_up(t0, GRACE, Some("a".into()));
        let down = t0 + Duration::from_secs(10);
        assert!(s.link_lost(down), "a link that was up: the epoch moves");
        assert!(!s.link_lost(down), "already down: nothing more");
        assert!(!s.counts(down + GRACE));
        let up = down + Duration::from_secs(1);
        assert_eq!(s.link_came_up(up, GRACE, Some("a".into())), Some(up));
        assert!(s.counts(up));
        assert!(!s.counts(up - Duration::from_millis(1)));
        s.link_lost(up + GRACE);
        let up2 = up + GRACE * 2;
        assert_eq!(
            s.link_came_up(up2, GRACE, Some("b".into())),
            Some(up2 + GRACE)
        );
        assert_eq!(s.link_losses, 2);
    }

    #[test]
    fn a_link_said_up_twice_keeps_its_first_grace() {
        let t0 = Instant::now();
        let mut s = Standing::starting_as_replica(t0);
        assert_eq!(
            s.link_came_up(t0, GRACE, Some("a".into())),
            Some(t0 + GRACE)
        );
        let again = t0 + Duration::from_secs(1);
        assert_eq!(
            s.link_came_up(again, GRACE, Some("a".into())),
            Some(t0 + GRACE)
        );
        assert!(!s.counts(again));
    }

    #[test]
    fn a_link_back_from_the_same_primary_within_its_grace_waits_the_grace_out() {
        let t0 = Instant::now();
        let mut s = Standing::starting_as_replica(t0);
        s.link_came_up(t0, GRACE, Some("a".into()));
        let down = t0 + Duration::from_millis(200);
        assert!(s.link_lost(down));
        let up = down + Duration::from_millis(200);
        assert_eq!(
            s.link_came_up(up, GRACE, Some("a".into())),
            Some(t0 + GRACE)
        );
        assert!(!s.counts(up));
        assert_eq!(s.withheld(up), Some(Withheld::Grace));
    }

    #[test]
    fn an_unknown_replication_id_is_never_the_same_primary() {
        let t0 = Instant::now();
        let mut s = Standing::starting_as_replica(t0);
        s.link_came_up(t0, GRACE, None);
        s.link_lost(t0);
        assert_eq!(s.link_came_up(t0, GRACE, None), Some(t0 + GRACE));
    }

    #[test]
    fn a_demoted_primary_forgets_its_last_primary() {
        let t0 = Instant::now();
        let mut s = Standing::starting_as_replica(t0);
        s.link_came_up(t0, GRACE, Some("a".into()));
        s.promoted(t0, GRACE);
        assert!(!s.link_lost(t0), "a primary has no link to lose");
        assert_eq!(s.link_came_up(t0, GRACE, Some("a".into())), None);
        s.demoted(t0);
        assert_eq!(
            s.link_came_up(t0, GRACE, Some("a".into())),
            Some(t0 + GRACE)
        );
    }
}
