//! A set's definition as the catalog stores it (`SetDef`), the part of it MEMBER.ALTER may
//! change (`SetChange`), the rule for set names and the name ACL rules see for a set. Plain
//! data, no server calls.

use crate::model::canon::Normalize;

/// True for a valid set name: `[a-z0-9_]{1,40}`.
pub fn valid_set_name(b: &[u8]) -> bool {
    (1..=40).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// The name a user's ACL key patterns are matched against for `set` (see `acl`).
pub fn acl_key(set: &str) -> String {
    format!("member:{set}")
}

/// A set's settings, as stored in the `member_catalog` table.
#[derive(Clone, Debug, PartialEq)]
pub struct SetDef {
    pub name: String,
    pub error_rate: f64,
    pub capacity: u64,
    pub cache_ttl: u64,
    pub recent_ttl: u64,
    pub normalize: Normalize,
    /// Tokenization and the fingerprint of the key the set's tokens are made under.
    pub tokenize: crate::model::token::Tokenize,
    /// An attached set (docs/attach.md): the table it serves membership from. `None` for a
    /// set the module owns (`member_<name>`).
    pub source: Option<Source>,
}

/// A table the module does not own that an attached set answers from. Names are exact
/// (case-sensitive) PostgreSQL identifiers, checked against the catalog at CREATE and quoted
/// wherever they appear in SQL (`db::source`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub schema: String,
    pub table: String,
    /// The text-like column holding the items.
    pub column: String,
    /// The text-like column holding the scope, if the set is scoped.
    pub scope_column: Option<String>,
    pub sync: SourceSync,
}

/// How writes made outside the module reach an attached set's filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceSync {
    /// The module's change-log triggers on the source table (`SYNC log`): the full guarantee.
    Log,
    /// Polling a timestamp column (`UPDATED-COLUMN <col>`) with a lookback: weaker.
    Updated(String),
}

impl SourceSync {
    /// The name MEMBER.INFO shows.
    pub fn name(&self) -> &'static str {
        match self {
            SourceSync::Log => "log",
            SourceSync::Updated(_) => "updated-column",
        }
    }
}

impl Source {
    /// `schema.table`, as given (not quoted: for messages and INFO).
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }
}

impl SetDef {
    /// True when a setting the caller gave explicitly (`explicit`, in the order error rate,
    /// capacity, cache TTL, recent TTL, normalize, tokenize) differs from the stored one. A
    /// TOKENIZE mode is compared by name: a different key is `token_key::check`'s to report.
    /// A SOURCE given must be the stored one: an own set never becomes attached, nor the
    /// other way round.
    pub fn conflicts_with(&self, have: &SetDef, explicit: &[bool; 6]) -> bool {
        (explicit[0] && self.error_rate != have.error_rate)
            || (explicit[1] && self.capacity != have.capacity)
            || (explicit[2] && self.cache_ttl != have.cache_ttl)
            || (explicit[3] && self.recent_ttl != have.recent_ttl)
            || (explicit[4] && self.normalize != have.normalize)
            || (explicit[5] && self.tokenize.name() != have.tokenize.name())
            || (self.source.is_some() && self.source != have.source)
    }
}

impl SetDef {
    /// True when `other` needs a filter of other parameters (ERROR or CAPACITY differ): a
    /// node holding a filter built for `self` rebuilds it.
    pub fn filter_differs(&self, other: &SetDef) -> bool {
        self.error_rate != other.error_rate || self.capacity != other.capacity
    }
}

/// The settings MEMBER.ALTER may change; `None` keeps the stored one. NORMALIZE and TOKENIZE
/// are not here: every stored row, cached key and filter bit was made under them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetChange {
    pub error_rate: Option<f64>,
    pub capacity: Option<u64>,
    pub cache_ttl: Option<u64>,
    pub recent_ttl: Option<u64>,
}

impl SetChange {
    /// True when no setting is given.
    pub fn is_empty(&self) -> bool {
        *self == SetChange::default()
    }

    /// `def` with the given settings replaced.
    pub fn applied_to(&self, def: &SetDef) -> SetDef {
        SetDef {
            error_rate: self.error_rate.unwrap_or(def.error_rate),
            capacity: self.capacity.unwrap_or(def.capacity),
            cache_ttl: self.cache_ttl.unwrap_or(def.cache_ttl),
            recent_ttl: self.recent_ttl.unwrap_or(def.recent_ttl),
            ..def.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> SetDef {
        SetDef {
            name: "s".into(),
            error_rate: 0.01,
            capacity: 1000,
            cache_ttl: 300,
            recent_ttl: 10,
            normalize: Normalize::Lower,
            tokenize: crate::model::token::Tokenize::None,
            source: None,
        }
    }

    #[test]
    fn a_change_replaces_only_what_it_gives() {
        let d = def();
        assert!(SetChange::default().is_empty());
        assert_eq!(SetChange::default().applied_to(&d), d);
        let ttl = SetChange {
            cache_ttl: Some(60),
            ..Default::default()
        };
        let t = ttl.applied_to(&d);
        assert_eq!((t.cache_ttl, t.recent_ttl, t.capacity), (60, 10, 1000));
        assert!(!d.filter_differs(&t), "a TTL needs no new filter");
        let cap = SetChange {
            capacity: Some(5000),
            ..Default::default()
        };
        let c = cap.applied_to(&d);
        assert_eq!(c.normalize, Normalize::Lower);
        assert!(d.filter_differs(&c));
        let rate = SetChange {
            error_rate: Some(0.001),
            ..Default::default()
        };
        assert!(d.filter_differs(&rate.applied_to(&d)));
    }
}
