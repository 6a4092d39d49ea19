//! The sets this node knows: the main-thread registry (`state`), the catalog it is read from,
//! the keys the module owns and who else wrote them, and who may touch which set (`acl`).

pub mod acl;
pub mod cache_epoch;
pub mod catalog;
pub mod catalog_ask;
pub mod catalog_copy;
pub mod effects;
pub mod foreign_writes;
pub mod keys;
pub mod lapsed;
pub mod learn;
pub mod limits;
pub mod marks;
pub mod rotating;
pub mod rotation;
pub mod standing;
pub mod state;
