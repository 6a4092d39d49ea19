//! Every name the module derives from a set name, tried against every other: no
//! set name CREATE accepts may produce a relation, trigger or key that is another set's or
//! the module's own. Per namespace: relations of the module's schema (tables, indexes and
//! sequences share one), triggers of one table (a set table's, or a source table several
//! attached sets share), functions, and Valkey keys.

use std::collections::HashMap;

use super::source_triggers::trigger_names;
use super::sql::{reserved_set_name, table, LOG_TRIGGERS};
use crate::model::canon::{canonicalize, Normalize};
use crate::sets::keys::{cache_key_bytes, cache_prefix, filter_key_name, is_cache_key};

/// PostgreSQL truncates longer names (NAMEDATALEN - 1), which could make two names one.
const MAX_NAME: usize = 63;

/// The module's own relations in its schema (sql/catalog.rs, sql/change_log.rs).
const MODULE_RELATIONS: &[&str] = &[
    "member_catalog",
    "member_catalog_pkey",
    "member_catalog_version",
    "member_catalog_version_pkey",
    "member_changes",
    "member_changes_seq_seq",
    "member_changes_xid",
    "member_changes_floor",
    "member_changes_floor_pkey",
];

/// The triggers the module puts on a set's own table (sql/change_log.rs, token_form.rs).
fn set_table_triggers() -> Vec<String> {
    let mut t: Vec<String> = LOG_TRIGGERS.iter().map(|s| s.to_string()).collect();
    t.push("member_notify".into());
    t.extend(crate::db::token_form::FORM_TRIGGERS.map(String::from));
    t
}

/// The relations an own set makes: its table and the indexes on it (sql/catalog.rs,
/// keyslot.rs).
fn set_relations(set: &str) -> Vec<String> {
    let t = table(set);
    vec![
        t.clone(),
        format!("{t}_pkey"),
        format!("{t}_updated_at"),
        format!("{t}_slot"),
    ]
}

/// Names a set must not take, and names made to collide if the rules were weaker.
fn adversarial() -> Vec<String> {
    let mut v: Vec<String> = [
        "log",
        "catalog",
        "changes",
        "notify",
        "b",
        "b_ins",
        "b_upd",
        "b_del",
        "log_ins",
        "log_del",
        "x_ins_ins",
        "ins",
        "catalog_version",
        "changes_floor",
        "changes_seq_seq",
        "changes_xid",
        "b_pkey",
        "b_slot",
        "b_updated_at",
        "updated_at",
        "slot",
        "pkey",
        "log_change",
        "log_source",
        "notify_change",
        "keyslot",
        "_",
        "__",
        "0",
    ]
    .map(String::from)
    .to_vec();
    v.push("a".repeat(40));
    v.push(format!("{}_ins", "a".repeat(36)));
    v.push(format!("{}_del", "z".repeat(36)));
    v.push("9".repeat(40));
    v
}

/// The sets CREATE accepts among `adversarial()`.
fn accepted() -> Vec<String> {
    let all = adversarial();
    for n in &all {
        assert!(crate::model::set_def::valid_set_name(n.as_bytes()), "{n}");
    }
    let ok: Vec<String> = all.into_iter().filter(|n| !reserved_set_name(n)).collect();
    assert!(ok.contains(&"log".to_string()) && ok.contains(&"b".to_string()));
    ok
}

/// Asserts that no name of `named` (owner, name) is given twice.
fn all_distinct(space: &str, named: impl IntoIterator<Item = (String, String)>) {
    let mut seen: HashMap<String, String> = HashMap::new();
    for (owner, name) in named {
        assert!(name.len() <= MAX_NAME, "{space}: {name} is too long");
        if let Some(other) = seen.insert(name.clone(), owner.clone()) {
            panic!("{space}: {name} is both {other}'s and {owner}'s");
        }
    }
}

#[test]
fn relations_of_the_modules_schema_never_collide() {
    let mut named: Vec<(String, String)> = MODULE_RELATIONS
        .iter()
        .map(|r| ("the module".to_string(), r.to_string()))
        .collect();
    for s in accepted() {
        named.extend(set_relations(&s).into_iter().map(|r| (s.clone(), r)));
    }
    all_distinct("relations", named);
    for s in ["catalog", "changes", "changes_floor", "b_pkey", "b_slot"] {
        assert!(reserved_set_name(s), "{s}");
    }
}

#[test]
fn triggers_on_one_table_never_collide() {
    // A source table several attached sets share; the module's own trigger names too, in
    // case one of its tables were ever a source (it is refused: source_triggers).
    let mut named: Vec<(String, String)> = set_table_triggers()
        .into_iter()
        .map(|t| ("the module".to_string(), t))
        .collect();
    for s in accepted() {
        named.extend(trigger_names(&s).into_iter().map(|t| (s.clone(), t)));
    }
    all_distinct("triggers", named);
    // Set `log` once took every set table's triggers' names.
    assert!(!trigger_names("log")
        .iter()
        .any(|t| LOG_TRIGGERS.contains(&t.as_str())));
}

#[test]
fn valkey_keys_never_collide() {
    let sets = accepted();
    let canon = canonicalize(Normalize::None, b"x:hit:y", b"s").unwrap();
    for s in &sets {
        let bloom = filter_key_name(s);
        assert!(!is_cache_key(bloom.as_bytes()), "{bloom}");
        for cluster in [false, true] {
            let hit = cache_key_bytes(&cache_prefix(s), &canon, cluster);
            assert!(is_cache_key(&hit));
            for t in sets.iter().filter(|t| *t != s) {
                // Another set's keys are never under this one's names.
                let other_hit = cache_key_bytes(&cache_prefix(t), &canon, cluster);
                assert_ne!(hit, other_hit, "{s} {t}");
                assert!(!bloom.as_bytes().starts_with(&cache_prefix(t)), "{s} {t}");
                assert_ne!(bloom, filter_key_name(t));
            }
            for slot in [0, 1, 16383] {
                // The name of an earlier version's slot sentinel, still deleted where found.
                let owner = crate::cluster::owner::sentinel_name(slot);
                assert_ne!(owner.as_bytes(), hit.as_slice());
                assert_ne!(owner, bloom);
                assert!(!is_cache_key(owner.as_bytes()));
            }
        }
    }
}
