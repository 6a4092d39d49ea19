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
}

impl Rotating {
    /// The chain this node computes now.
    pub fn served(&self) -> Tokenize {
        if self.row.phase == Phase::Switching && !self.switched {
            return shorter(&self.chain);
        }
        self.chain.clone()
    }

    /// The chain of the old form (`n` keys) and the fingerprint of the key the new form adds:
    /// what a write needs to store both forms while the rotation copies or switches. `None`
    /// during the drain (writes store the new form alone).
    pub fn forms(&self) -> Option<(Tokenize, &str)> {
        match self.row.phase {
            Phase::Copying => Some((self.chain.clone(), &self.row.to)),
            Phase::Switching => Some((shorter(&self.chain), &self.row.to)),
            Phase::Draining => None,
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
