//! A set's memberships wherever they live: the module's own table (`sql`), or the source table
//! of an attached set (`source`, docs/attach.md), chosen for each call by the set's name. The
//! workers' point reads and writes all come through here.

use super::sql::{self, Found};
use super::{source, Db, DbErr};

/// Debug builds only: an ADD of this item panics on its worker, so that the tests can show a
/// panicking job still answers its client once and the worker goes on (README "The
/// correctness contract"). Release builds have no such item.
#[cfg(debug_assertions)]
pub const PANIC_ITEM: &str = "libmember-test-failpoint-panic-in-worker";

/// Debug builds only: a write (ADD, MADD, DEL) of a set whose name starts with this waits on
/// its worker, before anything else, while a session holds the advisory lock
/// `hashtextextended('libmember failpoint ' || set, 0)`: so that a test can hold a write
/// between the command that planned it and the statement that makes it, whatever the
/// machine's speed. Release builds have no such wait.
#[cfg(debug_assertions)]
pub const HELD_PREFIX: &str = "failpoint_held_";

/// The wait of [`HELD_PREFIX`] (debug builds only).
#[cfg(debug_assertions)]
fn held(db: &mut Db, set: &str) -> Result<(), DbErr> {
    if !set.starts_with(HELD_PREFIX) {
        return Ok(());
    }
    let key = format!("libmember failpoint {set}");
    db.run(|c, _| {
        c.execute(
            "SELECT pg_advisory_lock_shared(hashtextextended($1, 0))",
            &[&key],
        )?;
        c.execute(
            "SELECT pg_advisory_unlock_shared(hashtextextended($1, 0))",
            &[&key],
        )?;
        Ok(())
    })
}

/// MEMBER.ADD's rows: for each item, true when the call made it a member (`sql::add_many`);
/// for an attached set, which never writes, true when its source holds the row. `twins` (one
/// per item, or none): while a set's key rotates, an item's new form, decided when the write
/// was planned; the item is then stored as one row of that form that names its old form
/// (docs/rotation-in-place.md).
pub fn add_many(
    db: &mut Db,
    set: &str,
    items: &[(&str, &str, Option<f64>)],
    twins: &[Option<&str>],
) -> Result<Vec<bool>, DbErr> {
    // Debug builds only (the integration tests'): a failpoint that panics the worker.
    #[cfg(debug_assertions)]
    if items.iter().any(|(e, _, _)| *e == PANIC_ITEM) {
        panic!("libmember test failpoint: an ADD of {PANIC_ITEM}");
    }
    #[cfg(debug_assertions)]
    held(db, set)?;
    if let Some(src) = source::of(set) {
        return source::confirm_many(db, &src, items);
    }
    if twins.iter().all(Option::is_none) {
        return sql::add_many(db, set, items, &[]);
    }
    // Each item with a twin as a row of its new form, which names its old form.
    let mut rows: Vec<(&str, &str, Option<f64>)> = Vec::with_capacity(items.len());
    let mut of: Vec<&str> = Vec::with_capacity(items.len());
    for (&(e, s, x), w) in items.iter().zip(twins) {
        match w {
            Some(w) => {
                rows.push((w, s, x));
                of.push(e);
            }
            None => {
                rows.push((e, s, x));
                of.push("");
            }
        }
    }
    sql::add_many(db, set, &rows, &of)
}

/// What the database holds of each item (`Found`); repeated items are asked once. `twins`:
/// while the set's key rotates, each item's new form (`""` for none), asked beside it
/// (`sql::lookup_many`); an attached set never rotates.
pub fn lookup_many(
    db: &mut Db,
    set: &str,
    items: &[(&str, &str)],
    twins: &[&str],
) -> Result<Vec<Found>, DbErr> {
    match source::of(set) {
        Some(src) => source::lookup_many(db, &src, items),
        None => sql::lookup_many(db, set, items, twins),
    }
}

/// Deletes a membership, and its `twin` while the set's key rotates (decided when the write
/// was planned). True when an active member was removed. An attached set never deletes from
/// its source (docs/attach.md): the call only drops the cached answer, on the main thread,
/// and removed nothing.
pub fn del(
    db: &mut Db,
    set: &str,
    entity: &str,
    scope: &str,
    twin: Option<&str>,
) -> Result<bool, DbErr> {
    if source::of(set).is_some() {
        return Ok(false);
    }
    #[cfg(debug_assertions)]
    held(db, set)?;
    sql::del(db, set, entity, scope, twin)
}
