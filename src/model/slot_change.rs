//! Which `CLUSTER` commands can give a node (or its primary) a slot, and which slots they name:
//! read by the command filter before such a command runs, so that the node accepts those slots
//! afresh afterwards (docs/cluster-placement.md, "Knowing which slots a node owns"). Commands
//! that only take slots away (`DELSLOTS`, `FLUSHSLOTS`, `RESET`) need nothing here: the slot's
//! return is itself one of these commands, and a role change has its own event.

use super::slot::SLOTS;

/// What a command about to run may do to this node's slots.
#[derive(Debug, PartialEq, Eq)]
pub enum SlotChange {
    /// `CLUSTER SETSLOT <slot> MIGRATING <node id> [TIMEOUT <ms>]`: the slot starts leaving,
    /// and may change hands later. A primary with replicas runs the command only once they
    /// acknowledged it, waiting at most `TIMEOUT` (`Some(0)`: without limit; `None`: the
    /// server's default).
    Migrating { slot: u16, timeout_ms: Option<u64> },
    /// The slots in these inclusive ranges may come to this node (`SETSLOT` of another kind,
    /// `ADDSLOTS`, `ADDSLOTSRANGE`).
    Slots(Vec<(u16, u16)>),
}

/// What `args` (the whole command, its name first) may do to this node's slots; `None` for a
/// command that cannot change them. Arguments the server will refuse count as far as they
/// can be read: an unreadable slot number names no slot (the command fails without effect).
pub fn slot_change(args: &[&[u8]]) -> Option<SlotChange> {
    let is = |i: usize, word: &[u8]| args.get(i).is_some_and(|a| a.eq_ignore_ascii_case(word));
    if !is(0, b"cluster") {
        return None;
    }
    let sub = *args.get(1)?;
    let slots = |from: usize| args.iter().skip(from).filter_map(|a| slot_number(a));
    if sub.eq_ignore_ascii_case(b"setslot") {
        let slot = slot_number(args.get(2)?)?;
        let node = args.get(4).copied().unwrap_or_default();
        if is(3, b"migrating") && node.len() == 40 && node.iter().all(u8::is_ascii_hexdigit) {
            let timeout_ms = (5..args.len())
                .rev()
                .find(|&i| is(i - 1, b"timeout"))
                .and_then(|i| std::str::from_utf8(args[i]).ok()?.parse::<u64>().ok());
            return Some(SlotChange::Migrating { slot, timeout_ms });
        }
        return Some(SlotChange::Slots(vec![(slot, slot)]));
    }
    if sub.eq_ignore_ascii_case(b"addslots") {
        return Some(SlotChange::Slots(slots(2).map(|s| (s, s)).collect()));
    }
    if sub.eq_ignore_ascii_case(b"addslotsrange") {
        let ends: Vec<Option<u16>> = args.iter().skip(2).map(|a| slot_number(a)).collect();
        let ranges = ends
            .chunks_exact(2)
            .filter_map(|p| Some((p[0]?, p[1]?)))
            .filter(|(a, b)| a <= b)
            .collect();
        return Some(SlotChange::Slots(ranges));
    }
    None
}

fn slot_number(a: &[u8]) -> Option<u16> {
    std::str::from_utf8(a)
        .ok()?
        .parse::<u16>()
        .ok()
        .filter(|s| (*s as usize) < SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(words: &str) -> Option<SlotChange> {
        let args: Vec<&[u8]> = words.split(' ').map(str::as_bytes).collect();
        slot_change(&args)
    }

    const ID: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn every_setslot_names_its_slot_and_migrating_is_told_apart() {
        assert_eq!(
            change(&format!("CLUSTER SETSLOT 7 MIGRATING {ID}")),
            Some(SlotChange::Migrating {
                slot: 7,
                timeout_ms: None
            })
        );
        assert_eq!(
            change(&format!("cluster setslot 0 migrating {ID}")),
            Some(SlotChange::Migrating {
                slot: 0,
                timeout_ms: None
            })
        );
        for (t, want) in [
            ("TIMEOUT 30000", Some(30000)),
            ("timeout 0", Some(0)),
            ("TIMEOUT x", None),
        ] {
            assert_eq!(
                change(&format!("CLUSTER SETSLOT 9 MIGRATING {ID} {t}")),
                Some(SlotChange::Migrating {
                    slot: 9,
                    timeout_ms: want
                }),
                "{t}"
            );
        }
        for how in ["IMPORTING", "NODE", "importing"] {
            assert_eq!(
                change(&format!("cluster setslot 16383 {how} {ID}")),
                Some(SlotChange::Slots(vec![(16383, 16383)])),
                "{how}"
            );
        }
        assert_eq!(
            change("CLUSTER SETSLOT 5 STABLE"),
            Some(SlotChange::Slots(vec![(5, 5)]))
        );
        // A MIGRATING with a malformed node id fails in the server; the slot is still named.
        assert_eq!(
            change("CLUSTER SETSLOT 5 MIGRATING abc"),
            Some(SlotChange::Slots(vec![(5, 5)]))
        );
        assert_eq!(change("CLUSTER SETSLOT 16384 STABLE"), None);
        assert_eq!(change("CLUSTER SETSLOT x STABLE"), None);
        assert_eq!(change("CLUSTER SETSLOT"), None);
    }

    #[test]
    fn slot_lists_and_ranges_are_read_and_bad_numbers_skipped() {
        assert_eq!(
            change("CLUSTER ADDSLOTS 1 2 99999 3"),
            Some(SlotChange::Slots(vec![(1, 1), (2, 2), (3, 3)]))
        );
        assert_eq!(
            change("CLUSTER ADDSLOTSRANGE 0 100 200 300 9"),
            Some(SlotChange::Slots(vec![(0, 100), (200, 300)]))
        );
        assert_eq!(
            change("CLUSTER addslotsrange 10 5 20 30"),
            Some(SlotChange::Slots(vec![(20, 30)]))
        );
    }

    #[test]
    fn commands_that_only_take_slots_or_change_roles_name_none() {
        for other in [
            "CLUSTER DELSLOTS 0",
            "CLUSTER DELSLOTSRANGE 0 100",
            "CLUSTER FLUSHSLOTS",
            "CLUSTER RESET",
            "CLUSTER FAILOVER",
            "CLUSTER REPLICATE abc",
            "CLUSTER NODES",
            "CLUSTER",
            "GET k",
            "CLUSTER KEYSLOT a",
            "SETSLOT 1 STABLE",
        ] {
            assert_eq!(change(other), None, "{other}");
        }
    }
}
