//! Where a filter value was made: the identity of the database and of the set's catalog row
//! its payload carries (the versioned envelope in front of every persisted filter), and the
//! one rule that says whether a value found at a set's key may be trusted on this node.

/// What a filter value says about where it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The identity of the database its rows were read from (`db::identity`): the cluster's
    /// system identifier and the database's oid, hashed.
    pub db: u128,
    /// The identity of the set's catalog row it was built for (`sql::CatalogRow::id`), when
    /// the building node knew it: a set dropped and created again has another.
    pub set_id: Option<i64>,
}

/// What this node knows of the database it serves, learned by its workers when they connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeDb {
    /// No worker has connected yet.
    NotYet,
    /// A worker connected but may not read the identity (a role refused
    /// `pg_control_system()`): no loaded filter can be shown to be this database's, so the
    /// node stands in a random identity of this process's own (`db::identity::local`), which
    /// the filters it builds carry. They are trusted here, and nowhere else, nor after a
    /// restart (which rebuilds every set once).
    Unreadable(u128),
    Known(u128),
}

/// Whether a filter value may be caught up and trusted for a set on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Made from this database, for this set's catalog row.
    Here,
    /// Made elsewhere (another database, another set or another incarnation of it), or of
    /// unknown origin (an older payload): never trusted, rebuilt from the database.
    Foreign,
    /// This node does not know its database yet: held back (never serves "absent") until it
    /// does.
    Unverified,
}

impl Verdict {
    /// The name MEMBER.INFO shows (`filter_origin`).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Here => "here",
            Verdict::Foreign => "foreign",
            Verdict::Unverified => "unverified",
        }
    }
}

/// The trust rule. `origin`: what the value carries (`None`: a payload older than the
/// envelope, or made by a node that could not read its database's identity); `node`: this
/// node's database; `set_id`: the catalog row of the set whose key holds the value, when
/// known. A value whose set id is unknown (either side) is judged by its database alone.
pub fn judge(origin: Option<&Origin>, node: NodeDb, set_id: Option<i64>) -> Verdict {
    let Some(o) = origin else {
        return Verdict::Foreign;
    };
    match node {
        NodeDb::NotYet => Verdict::Unverified,
        NodeDb::Known(db) | NodeDb::Unreadable(db) if db != o.db => Verdict::Foreign,
        NodeDb::Known(_) | NodeDb::Unreadable(_) => match (o.set_id, set_id) {
            (Some(a), Some(b)) if a != b => Verdict::Foreign,
            _ => Verdict::Here,
        },
    }
}

/// The envelope in front of every filter payload this version writes: tag, version (u16 LE),
/// flags (bit 0: an origin follows, bit 1: it names the set's catalog row), then the
/// database identity (16 bytes LE) and the catalog row id (8 bytes LE) when flagged. What
/// follows is the payload older versions wrote whole (set name, slots, Bloom filter).
pub const TAG: &[u8; 4] = b"LMFV";
/// The envelope version this build writes, and the newest it reads.
pub const VERSION: u16 = 1;
const HAS_ORIGIN: u8 = 1;
const HAS_SET_ID: u8 = 2;

/// Appends the envelope for `origin` to `out`.
pub fn write(origin: Option<&Origin>, out: &mut crate::filter::Out) {
    out.extend_from_slice(TAG);
    out.extend_from_slice(&VERSION.to_le_bytes());
    let mut flags = 0;
    if let Some(o) = origin {
        flags |= HAS_ORIGIN;
        if o.set_id.is_some() {
            flags |= HAS_SET_ID;
        }
    }
    out.push(flags);
    if let Some(o) = origin {
        out.extend_from_slice(&o.db.to_le_bytes());
        if let Some(id) = o.set_id {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
}

/// Bytes `write` appends for `origin`.
pub fn len(origin: Option<&Origin>) -> usize {
    TAG.len() + 3 + origin.map_or(0, |o| 16 + o.set_id.map_or(0, |_| 8))
}

/// Reads the envelope in front of `b`: the origin it names and the rest of the payload. A
/// payload without one (written before it existed) is accepted, of unknown origin: the
/// caller treats it as made elsewhere (rebuilt, never trusted). A version newer than this
/// build reads, unknown flags or a cut envelope are refused.
pub fn read(b: &[u8]) -> Result<(Option<Origin>, &[u8]), String> {
    let Some(rest) = b.strip_prefix(TAG.as_slice()) else {
        return Ok((None, b));
    };
    let cut = || "filter payload truncated in its envelope".to_string();
    let (head, rest) = rest.split_at_checked(3).ok_or_else(cut)?;
    let version = u16::from_le_bytes([head[0], head[1]]);
    if version == 0 || version > VERSION {
        return Err(format!(
            "filter payload envelope version {version} is not supported (this build reads up \
             to {VERSION})"
        ));
    }
    let flags = head[2];
    if flags & !(HAS_ORIGIN | HAS_SET_ID) != 0 || flags == HAS_SET_ID {
        return Err("filter payload envelope has unknown flags".into());
    }
    if flags & HAS_ORIGIN == 0 {
        return Ok((None, rest));
    }
    let (db, rest) = rest.split_at_checked(16).ok_or_else(cut)?;
    let db = u128::from_le_bytes(db.try_into().expect("16 bytes"));
    let (set_id, rest) = if flags & HAS_SET_ID != 0 {
        let (id, rest) = rest.split_at_checked(8).ok_or_else(cut)?;
        (
            Some(i64::from_le_bytes(id.try_into().expect("8 bytes"))),
            rest,
        )
    } else {
        (None, rest)
    };
    Ok((Some(Origin { db, set_id }), rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::value::FilterValue;
    use crate::filter::Bloom;

    const HERE: Origin = Origin {
        db: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
        set_id: Some(1_700_000_000_000_000),
    };

    #[test]
    fn the_envelope_round_trips() {
        for o in [
            None,
            Some(HERE),
            Some(Origin {
                set_id: None,
                ..HERE
            }),
        ] {
            let mut b = vec![0; len(o.as_ref())];
            let mut out = crate::filter::Out::new(&mut b);
            write(o.as_ref(), &mut out);
            assert_eq!(out.len(), len(o.as_ref()));
            b.extend_from_slice(b"rest");
            assert_eq!(read(&b).unwrap(), (o, b"rest".as_slice()));
        }
    }

    #[test]
    fn a_payload_without_envelope_is_of_unknown_origin() {
        assert_eq!(read(b"LMSN\x01s").unwrap(), (None, b"LMSN\x01s".as_slice()));
        assert_eq!(
            judge(None, NodeDb::Known(HERE.db), HERE.set_id),
            Verdict::Foreign
        );
    }

    #[test]
    fn what_cannot_be_read_is_refused() {
        let mut b = vec![0; len(Some(&HERE))];
        write(Some(&HERE), &mut crate::filter::Out::new(&mut b));
        for cut in 4..b.len() {
            assert!(read(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut newer = b.clone();
        newer[4] = 2;
        assert!(read(&newer).unwrap_err().contains("version 2"));
        let mut zero = b.clone();
        zero[4] = 0;
        assert!(read(&zero).is_err());
        let mut flags = b.clone();
        flags[6] |= 4;
        assert!(read(&flags).is_err());
        flags[6] = HAS_SET_ID;
        assert!(read(&flags).is_err(), "a set id without an origin");
    }

    #[test]
    fn only_this_databases_values_for_this_set_are_trusted() {
        let node = NodeDb::Known(HERE.db);
        assert_eq!(judge(Some(&HERE), node, HERE.set_id), Verdict::Here);
        assert_eq!(judge(Some(&HERE), node, None), Verdict::Here);
        let other_db = Origin {
            db: HERE.db ^ 1,
            ..HERE
        };
        assert_eq!(judge(Some(&other_db), node, HERE.set_id), Verdict::Foreign);
        let other_row = Origin {
            set_id: Some(7),
            ..HERE
        };
        assert_eq!(judge(Some(&other_row), node, HERE.set_id), Verdict::Foreign);
        assert_eq!(
            judge(Some(&HERE), NodeDb::NotYet, HERE.set_id),
            Verdict::Unverified
        );
        // A node that may not read its database's identity trusts what this process built
        // (stamped with its own stand-in), nothing else.
        assert_eq!(
            judge(Some(&HERE), NodeDb::Unreadable(HERE.db ^ 1), HERE.set_id),
            Verdict::Foreign
        );
        let local = Origin {
            db: HERE.db ^ 1,
            ..HERE
        };
        assert_eq!(
            judge(Some(&local), NodeDb::Unreadable(HERE.db ^ 1), HERE.set_id),
            Verdict::Here
        );
        assert_eq!(judge(Some(&local), node, HERE.set_id), Verdict::Foreign);
    }

    fn value(origin: Option<Origin>) -> FilterValue {
        let mut b = Bloom::new(1000, 0.01);
        b.add(1);
        let mut v = FilterValue::built(b, 100, "s");
        v.origin = origin;
        v
    }

    #[test]
    fn a_filter_payload_carries_its_origin() {
        let v = value(Some(HERE));
        let bytes = v.to_bytes();
        assert!(bytes.starts_with(TAG), "the version comes first");
        let loaded = FilterValue::from_bytes(&bytes).unwrap();
        assert_eq!(loaded.origin, Some(HERE));
        assert_eq!(
            (loaded.set.as_deref(), loaded.bloom.clone()),
            (Some("s"), v.bloom.clone())
        );
        assert_eq!(loaded.to_bytes(), bytes, "re-encodes to its own bytes");
        assert_eq!(v.clone().origin, Some(HERE), "a COPY keeps its origin");
        let node = NodeDb::Known(HERE.db);
        assert_eq!(loaded.verdict("s", node, HERE.set_id), Verdict::Here);
        // The DUMP of another database's filter of the same set, RESTOREd here.
        let elsewhere = NodeDb::Known(HERE.db + 1);
        assert_eq!(
            loaded.verdict("s", elsewhere, HERE.set_id),
            Verdict::Foreign
        );
        // Another set's filter, from this database.
        assert_eq!(loaded.verdict("t", node, HERE.set_id), Verdict::Foreign);
        // A payload of a newer envelope is refused, not guessed at.
        let mut newer = bytes.clone();
        newer[4] = (VERSION + 1) as u8;
        assert!(FilterValue::from_bytes(&newer).is_err());
    }

    #[test]
    fn a_payload_of_the_previous_version_loads_untrusted() {
        let v = value(Some(HERE));
        // The previous version wrote the set name, then the Bloom payload, no envelope.
        let mut old = b"LMSN\x01s".to_vec();
        old.extend_from_slice(&v.bloom.to_bytes(v.cov));
        let loaded = FilterValue::from_bytes(&old).unwrap();
        assert_eq!((loaded.origin, loaded.set.as_deref()), (None, Some("s")));
        assert_eq!((loaded.bloom.clone(), loaded.cov), (v.bloom, v.cov));
        let node = NodeDb::Known(HERE.db);
        assert_eq!(loaded.verdict("s", node, HERE.set_id), Verdict::Foreign);
        // Saved again, it says it has no origin, and stays untrusted.
        let again = FilterValue::from_bytes(&loaded.to_bytes()).unwrap();
        assert_eq!(again.origin, None);
    }
}
