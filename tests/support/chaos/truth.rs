//! What the database says a set holds, for the final check of a cluster load: the set's own
//! table (the active rows of unscoped items), the application's table it is attached to, or a
//! tokenized set's table, whose rows are its items' tokens.

use std::collections::BTreeSet;

use super::attached::Source;
use super::cluster_load::LoadConfig;

/// Where the database keeps what the set holds.
pub(super) enum Truth<'a> {
    Own(&'a str),
    Attached(&'a Source),
    /// The set's own table, holding each item's token under these keys (hex).
    Tokenized(&'a str, &'a [String]),
}

impl<'a> Truth<'a> {
    pub(super) fn of(set: &'a str, cfg: &'a LoadConfig) -> Truth<'a> {
        match &cfg.source {
            Some(src) => Truth::Attached(src),
            None if !cfg.chain_keys.is_empty() => Truth::Tokenized(set, &cfg.chain_keys),
            None => Truth::Own(set),
        }
    }

    /// The condition on a set table's rows that makes them members.
    const ACTIVE: &'static str =
        "scope = '' AND status = 1 AND (expires_at IS NULL OR expires_at > now())";

    /// The members, in the database now: every one, or of a tokenized set those of `items`
    /// (a token does not give its item back).
    pub(super) fn members(&self, pg: &mut postgres::Client, items: &[&str]) -> BTreeSet<String> {
        let rows = match self {
            Truth::Attached(src) => return src.members(pg).into_iter().collect(),
            Truth::Own(set) => pg.query(
                &format!("SELECT entity_id FROM member_{set} WHERE {}", Self::ACTIVE),
                &[],
            ),
            Truth::Tokenized(set, keys) => pg.query(
                &format!(
                    "SELECT i FROM unnest($1::text[]) i
                      WHERE EXISTS (SELECT FROM member_{set}
                                     WHERE entity_id = member_catalog_token($2, i, '',
                                                                            VARIADIC $3::text[])
                                       AND {})",
                    Self::ACTIVE
                ),
                &[&items, set, keys],
            ),
        };
        rows.expect("read the truth")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Whether `item` is a member, in the database now.
    pub(super) fn has(&self, pg: &mut postgres::Client, item: &str) -> bool {
        match self {
            Truth::Attached(src) => src.has(pg, item),
            Truth::Own(set) => pg
                .query_one(
                    &format!(
                        "SELECT EXISTS (SELECT FROM member_{set} WHERE entity_id = $1 AND {})",
                        Self::ACTIVE
                    ),
                    &[&item],
                )
                .expect("read the truth")
                .get(0),
            Truth::Tokenized(..) => self.members(pg, &[item]).contains(item),
        }
    }
}
