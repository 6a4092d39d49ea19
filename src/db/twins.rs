//! The sets whose writes store two forms of each item while their key rotates
//! (docs/security.md, "Rotating a tokenized set's key online"): the old form a write is
//! canonicalized to, and its twin under the key the set moves to, in the same statement. Told
//! by the layer that follows the catalog (`sets/rotation.rs`); read by the workers' writes.

use std::collections::BTreeMap;
use std::sync::RwLock;

use crate::model::token_chain::chain_length;

/// A rotating set's old chain length and the fingerprint of the key its twins are made under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Twin {
    pub n: usize,
    pub to: String,
}

static TWINS: RwLock<BTreeMap<String, Twin>> = RwLock::new(BTreeMap::new());

/// Writes of `set` store twins under `twin` from now on (`None`: one form, as always).
pub fn set(set: &str, twin: Option<Twin>) {
    let mut t = TWINS.write().unwrap_or_else(|e| e.into_inner());
    match twin {
        Some(tw) => t.insert(set.to_string(), tw),
        None => t.remove(set),
    };
}

/// Whether writes of `set` store twins, and under what.
pub fn of(set: &str) -> Option<Twin> {
    let t = TWINS.read().unwrap_or_else(|e| e.into_inner());
    if t.is_empty() {
        return None;
    }
    t.get(set).cloned()
}

/// The twin of `old` (a token of the old chain), or `None` for a row of another form (one a
/// node that has switched wrote, say: it stores that form only).
pub fn twin_of(t: &Twin, old: &str) -> Result<Option<String>, String> {
    if chain_length(old) != Some(t.n as u32) {
        return Ok(None);
    }
    crate::config::token_key::wrap(&t.to, old).map(Some)
}
