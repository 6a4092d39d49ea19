//! The funnel's decision logic, free of server calls: Bloom gate → recent-writes → exact-match
//! cache → database. The command layer asks `gate`, then (maybe) the cache, then (maybe) the DB.

/// What the filter tier knows about one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterView {
    /// The filter was built from the whole table: a negative is definitive.
    Complete { contains: bool },
    /// No filter, or one not (yet) built from the whole table: it cannot say "absent".
    Incomplete,
    /// The (complete) filter lets the item through, but the database recently confirmed it
    /// absent and nothing has added it since: a known false positive.
    KnownAbsent,
}

impl FilterView {
    /// The filter would answer "absent" (a negative, or a known false positive).
    #[inline]
    pub fn is_negative(self) -> bool {
        matches!(
            self,
            FilterView::Complete { contains: false } | FilterView::KnownAbsent
        )
    }
}

/// The tier that decided an answer, as MEMBER.EXPLAIN names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    BloomNegative,
    Recent,
    CacheHit,
    /// A known false positive: the database said absent moments ago (see `known_absent`).
    FpCache,
    DbHit,
    DbMiss,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::BloomNegative => "bloom-negative",
            Path::Recent => "recent",
            Path::CacheHit => "cache-hit",
            Path::FpCache => "fp-cache",
            Path::DbHit => "db-hit",
            Path::DbMiss => "db-miss",
        }
    }
}

/// The first decision, taken without any I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Definitely absent: answer 0 now.
    Absent,
    /// A write of this item is in flight or just landed that memory may not know the outcome
    /// of: only the database may answer (the cache cannot hold anything newer than the write).
    /// An ADD's mark overrides a filter negative; a DEL's (a rotating set's twin in a cluster,
    /// docs/security.md) overrides the exact-match key.
    Recent,
    /// Possibly present (filter hit, or filter incomplete): try the cache, then the database.
    Possible,
    /// A filter hit the database recently confirmed absent, with no write of it in flight:
    /// answer 0 now.
    KnownAbsent,
}

/// Gate decision from the filter and the marks of writes in flight. `recent` (an ADD's mark)
/// is only consulted on a filter negative or a known false positive, and `deleting` (a DEL's)
/// only where the exact-match key would be tried next, which keeps the common path to one
/// probe.
pub fn gate(
    filter: FilterView,
    recent: impl FnOnce() -> bool,
    deleting: impl FnOnce() -> bool,
) -> Gate {
    let possible = |deleting: bool| {
        if deleting {
            Gate::Recent
        } else {
            Gate::Possible
        }
    };
    match filter {
        FilterView::Complete { contains: false } => {
            if recent() {
                Gate::Recent
            } else {
                Gate::Absent
            }
        }
        // A write in flight or just landed is never answered from memory.
        FilterView::KnownAbsent => {
            if recent() {
                possible(deleting())
            } else {
                Gate::KnownAbsent
            }
        }
        FilterView::Complete { contains: true } | FilterView::Incomplete => possible(deleting()),
    }
}

/// The path to report once the database has answered a lookup that passed `gate`.
pub fn db_path(gate: Gate, present: bool) -> Path {
    match (gate, present) {
        (Gate::Recent, _) => Path::Recent,
        (_, true) => Path::DbHit,
        (_, false) => Path::DbMiss,
    }
}

/// Wall-clock unix time in seconds, the scale of `expires_at` in the database.
pub fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Seconds an exact-match entry may live: the set's cache TTL, never past the membership's
/// expiry. `None` means "do not cache" (already expired or about to).
pub fn cache_ttl_ms(cache_ttl_s: u64, expires_at_s: Option<f64>, now_s: f64) -> Option<u64> {
    let cap = cache_ttl_s.saturating_mul(1000);
    let ttl = match expires_at_s {
        None => cap,
        Some(exp) => {
            let left = ((exp - now_s) * 1000.0).floor();
            if left < 1.0 {
                return None;
            }
            cap.min(left as u64)
        }
    };
    (ttl > 0).then_some(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_negative_without_recent_is_absent() {
        assert_eq!(
            gate(FilterView::Complete { contains: false }, || false, || false),
            Gate::Absent
        );
    }

    #[test]
    fn recent_write_overrides_a_filter_negative() {
        assert_eq!(
            gate(FilterView::Complete { contains: false }, || true, || false),
            Gate::Recent
        );
        assert_eq!(db_path(Gate::Recent, true), Path::Recent);
        assert_eq!(db_path(Gate::Recent, false), Path::Recent);
    }

    #[test]
    fn incomplete_filter_never_answers_absent() {
        assert_eq!(
            gate(FilterView::Incomplete, || false, || false),
            Gate::Possible
        );
        assert_eq!(
            gate(FilterView::Incomplete, || true, || false),
            Gate::Possible
        );
    }

    #[test]
    fn known_false_positive_answers_absent_unless_a_write_is_recent() {
        assert_eq!(
            gate(FilterView::KnownAbsent, || false, || false),
            Gate::KnownAbsent
        );
        assert_eq!(
            gate(FilterView::KnownAbsent, || true, || false),
            Gate::Possible
        );
    }

    #[test]
    fn recent_is_not_consulted_on_a_hit() {
        let g = gate(
            FilterView::Complete { contains: true },
            || panic!("consulted"),
            || false,
        );
        assert_eq!(g, Gate::Possible);
        assert_eq!(db_path(g, true), Path::DbHit);
        assert_eq!(db_path(g, false), Path::DbMiss);
    }

    #[test]
    fn a_delete_in_flight_sends_a_hit_past_the_cache_to_the_database() {
        for view in [
            FilterView::Complete { contains: true },
            FilterView::Incomplete,
        ] {
            assert_eq!(gate(view, || false, || true), Gate::Recent, "{view:?}");
        }
        // A known false positive with an ADD in flight, and a DEL too.
        assert_eq!(
            gate(FilterView::KnownAbsent, || true, || true),
            Gate::Recent
        );
        // A negative is the filter's alone: a DEL does not make it a member.
        let negative = gate(
            FilterView::Complete { contains: false },
            || false,
            || panic!("consulted"),
        );
        assert_eq!(negative, Gate::Absent);
        assert_eq!(
            gate(FilterView::KnownAbsent, || false, || panic!("consulted")),
            Gate::KnownAbsent
        );
    }

    #[test]
    fn cache_ttl_never_outlives_expiry() {
        assert_eq!(cache_ttl_ms(300, None, 1000.0), Some(300_000));
        assert_eq!(cache_ttl_ms(300, Some(1010.0), 1000.0), Some(10_000));
        assert_eq!(cache_ttl_ms(300, Some(5000.0), 1000.0), Some(300_000));
        assert_eq!(cache_ttl_ms(300, Some(1000.0005), 1000.0), None);
        assert_eq!(cache_ttl_ms(300, Some(900.0), 1000.0), None);
    }
}
