//! The pure core: code that makes no server or database call, so unit tests cover it whole.
//! Canonicalization, tokenization, set definitions and their name rules, the funnel's
//! decisions, the upkeep records' decisions and every error text.

pub mod canon;
mod canon_ascii;
pub mod canon_chars;
pub mod canon_forms;
mod canon_username;
pub mod error;
pub mod funnel;
pub mod set_def;
pub mod set_upkeep;
pub mod sha256x2;
pub mod slot;
pub mod slot_change;
pub mod slot_migration;
pub mod slotset;
pub mod standing;
pub mod token;
pub mod token_chain;
pub mod token_ring;
