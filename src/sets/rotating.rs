//! A set's online key rotation as this node follows it (the state `rotation.rs` keeps up to
//! date from the catalog): which chain its lookups and its writes compute.

use crate::db::sql::rotation::{Phase, RotationRow};
use crate::model::token::{Tokenize, CHAIN_SEPARATOR};

/// A set's rotation as this node holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rotating {
    pub row: RotationRow,
    /// The chain the catalog gives (with the new key from the end on).
    pub chain: Tokenize,
    /// This node computes the new form.
    pub switched: bool,
    /// The epoch of database work (`db::in_flight`) that began as this node learned the
    /// rotation: once every job of the epochs before has ended, no command planned without
    /// it can reach the database, and the node's report says it follows the rotation.
    pub since: u64,
}

impl Rotating {
    /// The chain this node computes now.
    pub fn served(&self) -> Tokenize {
        if self.row.phase == Phase::Switching && !self.switched {
            return shorter(&self.chain);
        }
        self.chain.clone()
    }

    /// Whether a node that has not switched yet switches now. In the drain, always (the old
    /// forms are being deleted). In the switching phase: standalone, once its own filter covers
    /// the end (`own_covers`), since it answers from that filter alone; in a cluster, once the
    /// catalog says every node's does, since it asks the owner of the new form's slot, whose
    /// filter may be another node's (docs/security.md, "In a cluster").
    pub fn switches_now(&self, cluster: bool, own_covers: bool) -> bool {
        match self.row.phase {
            Phase::Rewriting | Phase::Copying => false,
            Phase::Switching if cluster => self.row.covered,
            Phase::Switching => own_covers,
            Phase::Draining => true,
        }
    }

    /// The chain of the old form (`n` keys) and the fingerprint of the key the new form adds:
    /// what a write needs to store both forms while the rotation copies or switches. `None`
    /// during the drain (writes store the new form alone).
    pub fn forms(&self) -> Option<(Tokenize, &str)> {
        match self.row.phase {
            Phase::Rewriting | Phase::Copying => Some((self.chain.clone(), &self.row.to)),
            Phase::Switching => Some((shorter(&self.chain), &self.row.to)),
            Phase::Draining => None,
        }
    }

    /// The chain of a row's old form and the key its twin adds, whenever a row of the old
    /// form may still be written: as [`Rotating::forms`], and in the drain too. A write this
    /// node plans in the drain is of the new form (no twin), but one another node planned in
    /// the old form before it learned the drain, and forwarded here (a cluster), must still
    /// store (or delete) both forms, or the drain deletes it (or leaves its twin).
    pub fn twin_forms(&self) -> Option<(Tokenize, &str)> {
        match self.row.phase {
            Phase::Draining => Some((shorter(&self.chain), &self.row.to)),
            _ => self.forms(),
        }
    }
}

/// `t` without its last key.
fn shorter(t: &Tokenize) -> Tokenize {
    let chain = t.fingerprint().unwrap_or_default();
    match chain.rsplit_once(CHAIN_SEPARATOR) {
        Some((before, _)) => Tokenize::from_stored(t.name(), Some(before)).unwrap_or(t.clone()),
        None => t.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "65f7a7b40fd60798";
    const NEW: &str = "0123456789abcdef";

    fn chain(fps: &str) -> Tokenize {
        Tokenize::from_stored("hmac-sha256", Some(fps)).unwrap()
    }

    /// A rotation from `OLD` to `NEW` in `phase`, the catalog's chain as that phase has it.
    fn rotating(phase: Phase, switched: bool) -> Rotating {
        let catalog = match phase {
            Phase::Rewriting | Phase::Copying => chain(OLD),
            _ => chain(&format!("{OLD}{CHAIN_SEPARATOR}{NEW}")),
        };
        Rotating {
            row: RotationRow {
                to: NEW.to_string(),
                phase,
                end_xid: (!phase.before_end()).then_some(42),
                copied: 0,
                left: None,
                covered: false,
                in_place: true,
            },
            chain: catalog,
            switched,
            since: 0,
        }
    }

    #[test]
    fn a_node_computes_the_old_form_until_it_switches_and_the_new_one_after() {
        assert_eq!(rotating(Phase::Rewriting, false).served(), chain(OLD));
        assert_eq!(rotating(Phase::Copying, false).served(), chain(OLD));
        assert_eq!(rotating(Phase::Switching, false).served(), chain(OLD));
        let both = chain(&format!("{OLD}{CHAIN_SEPARATOR}{NEW}"));
        assert_eq!(rotating(Phase::Switching, true).served(), both);
        assert_eq!(rotating(Phase::Draining, true).served(), both);
    }

    #[test]
    fn in_a_cluster_a_node_switches_on_every_nodes_cover_not_its_own() {
        let mut r = rotating(Phase::Switching, false);
        assert!(!r.switches_now(false, false));
        assert!(r.switches_now(false, true), "standalone: its own filter");
        assert!(
            !r.switches_now(true, true),
            "cluster: its own filter is not enough"
        );
        r.row.covered = true;
        assert!(
            r.switches_now(true, false),
            "cluster: every node's filter covers the end"
        );
        assert!(!rotating(Phase::Rewriting, false).switches_now(true, true));
        assert!(!rotating(Phase::Copying, false).switches_now(true, true));
        assert!(rotating(Phase::Draining, false).switches_now(true, false));
        assert!(rotating(Phase::Draining, false).switches_now(false, false));
    }

    #[test]
    fn writes_store_the_old_form_and_its_twin_until_the_drain() {
        // Whichever form a node computes, its writes are of the old form, whose twin any node
        // can make: so a row is there under both forms until the drain.
        for (phase, switched) in [
            (Phase::Rewriting, false),
            (Phase::Copying, false),
            (Phase::Switching, false),
            (Phase::Switching, true),
        ] {
            let r = rotating(phase, switched);
            assert_eq!(r.forms(), Some((chain(OLD), NEW)), "{phase:?} {switched}");
        }
        // In the drain the old forms are being deleted: the new form alone.
        assert_eq!(rotating(Phase::Draining, true).forms(), None);
        // But a row of the old form planned elsewhere before the drain still gets its twin.
        assert_eq!(
            rotating(Phase::Draining, true).twin_forms(),
            Some((chain(OLD), NEW))
        );
    }
}
