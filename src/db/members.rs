//! A set's memberships wherever they live: the module's own table (`sql`), or the source table
//! of an attached set (`source`, docs/attach.md), chosen for each call by the set's name. The
//! workers' point reads and writes all come through here.

use super::sql::{self, Found};
use super::{source, twins, Db, DbErr};

/// Debug builds only: an ADD of this item panics on its worker, so that the tests can show a
/// panicking job still answers its client once and the worker goes on (README "The
/// correctness contract"). Release builds have no such item.
#[cfg(debug_assertions)]
pub const PANIC_ITEM: &str = "libmember-test-failpoint-panic-in-worker";

/// MEMBER.ADD's rows: for each item, true when the call made it a member (`sql::add_many`);
/// for an attached set, which never writes, true when its source holds the row.
pub fn add_many(
    db: &mut Db,
    set: &str,
    items: &[(&str, &str, Option<f64>)],
) -> Result<Vec<bool>, DbErr> {
    // Debug builds only (the integration tests'): a failpoint that panics the worker.
    #[cfg(debug_assertions)]
    if items.iter().any(|(e, _, _)| *e == PANIC_ITEM) {
        panic!("libmember test failpoint: an ADD of {PANIC_ITEM}");
    }
    if let Some(src) = source::of(set) {
        return source::confirm_many(db, &src, items);
    }
    let Some(t) = twins::of(set) else {
        return sql::add_many(db, set, items, &[]);
    };
    // The set's key rotates: each old-form row with its twin in the same statement.
    let mut made: Vec<(String, &str, &str, Option<f64>)> = Vec::new();
    for (e, s, x) in items {
        if let Some(w) = twins::twin_of(&t, e).map_err(DbErr::Failed)? {
            made.push((w, e, s, *x));
        }
    }
    let mut rows: Vec<(&str, &str, Option<f64>)> = items.to_vec();
    let mut of: Vec<&str> = vec![""; items.len()];
    for (w, e, s, x) in &made {
        rows.push((w, s, *x));
        of.push(e);
    }
    let mut out = sql::add_many(db, set, &rows, &of)?;
    out.truncate(items.len());
    Ok(out)
}

/// What the database holds of each item (`Found`); repeated items are asked once.
pub fn lookup_many(db: &mut Db, set: &str, items: &[(&str, &str)]) -> Result<Vec<Found>, DbErr> {
    match source::of(set) {
        Some(src) => source::lookup_many(db, &src, items),
        None => sql::lookup_many(db, set, items),
    }
}

/// Deletes a membership. True when an active member was removed. An attached set never deletes
/// from its source (docs/attach.md): the call only drops the cached answer, on the main
/// thread, and removed nothing.
pub fn del(db: &mut Db, set: &str, entity: &str, scope: &str) -> Result<bool, DbErr> {
    if source::of(set).is_some() {
        return Ok(false);
    }
    let twin = match twins::of(set) {
        Some(t) => twins::twin_of(&t, entity).map_err(DbErr::Failed)?,
        None => None,
    };
    sql::del(db, set, entity, scope, twin.as_deref())
}
