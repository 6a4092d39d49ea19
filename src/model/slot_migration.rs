//! Atomic slot migration (Valkey 9, `CLUSTER MIGRATESLOTS`) as the module sees it: which
//! servers can run it, and what each of the server's events for it means for the slots it
//! names (docs/cluster.md, "Slot moves: classic and atomic"). Pure: the event's raw form is
//! read in `hooks/slot_migration.rs`.

/// `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION`: a module declaring it lets the server
/// run `CLUSTER MIGRATESLOTS` (without it every node refuses: "The module member does not
/// support atomic slot migrations"). Valkey ≥ 9.0 only: the bit means nothing, or something
/// else, elsewhere.
pub const OPTION_HANDLE_ATOMIC_SLOT_MIGRATION: i32 = 1 << 5;

/// `ValkeyModuleEvent_AtomicSlotMigration`'s id (Valkey ≥ 9.0).
pub const EVENT_ID: u64 = 19;

/// One event of a migration job, on the node it fires on. The source primary sees the
/// export events, the target primary and its replicas the import ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The target accepted the job: the slots' keys start arriving, hidden until the end.
    ImportStarted,
    /// `CLUSTER MIGRATESLOTS` ran here: this node still owns the slots, and serves them,
    /// until the target takes them over.
    ExportStarted,
    /// The job failed or was cancelled on the target: the keys it received are deleted.
    ImportAborted,
    /// The job failed or was cancelled on the source: the slots stay here (unless the target
    /// took them over in a step the source never heard of, which gossip will show).
    ExportAborted,
    /// The target took the slots over, in the same step (a replica: when its primary says so).
    ImportCompleted,
    /// The source learned (by gossip) that the target owns the slots; the server deletes
    /// their keys here.
    ExportCompleted,
}

impl Step {
    /// The subevent number the server passes (`VALKEYMODULE_SUBEVENT_ATOMIC_SLOT_MIGRATION_*`),
    /// `None` for one this build does not know (ignored).
    pub fn from_subevent(n: u64) -> Option<Step> {
        Some(match n {
            0 => Step::ImportStarted,
            1 => Step::ExportStarted,
            2 => Step::ImportAborted,
            3 => Step::ExportAborted,
            4 => Step::ImportCompleted,
            5 => Step::ExportCompleted,
            _ => return None,
        })
    }
}

/// What a step does to this node's view of the slots it names (`cluster/owner.rs` applies it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effect {
    /// The slots are being exported from here from now on (`Some(true)`), or no longer
    /// (`Some(false)`). While exported, a filter "absent" for them is not believed and no
    /// cache entry is read or written: items the target takes after the flip never reach this
    /// node, and the flip reaches it only by gossip.
    pub exporting: Option<bool>,
    /// The slots left this node, now: it stops owning them before its next poll of the slot
    /// map, so nothing of the module is written into a slot the server no longer owns.
    pub gone: bool,
    /// The slots are accepted afresh at the next poll that shows them owned, with a new
    /// handover grace, and a fill, before their negatives count.
    pub unaccept: bool,
}

/// What `step` means for the slots it names.
pub fn effect(step: Step) -> Effect {
    let none = Effect {
        exporting: None,
        gone: false,
        unaccept: false,
    };
    match step {
        Step::ExportStarted => Effect {
            exporting: Some(true),
            ..none
        },
        // Called off: the slots are ours again, but the target may have taken ADDs after a
        // takeover this node never heard of ("unpaused before migration completed"): a new
        // grace, as after `SETSLOT STABLE`.
        Step::ExportAborted => Effect {
            exporting: Some(false),
            unaccept: true,
            ..none
        },
        Step::ExportCompleted => Effect {
            exporting: Some(false),
            gone: true,
            unaccept: true,
        },
        // Gained here (or about to be): never on an acceptance from before, however briefly
        // the slots were away.
        Step::ImportStarted | Step::ImportAborted | Step::ImportCompleted => Effect {
            unaccept: true,
            ..none
        },
    }
}

/// True when the server that answered `INFO server` with `info` is Valkey 9.0 or later, the
/// line that has atomic slot migration (Redis, and Valkey before 9, never are).
pub fn server_has_asm(info: &str) -> bool {
    let Some(v) = info.lines().find_map(|l| l.strip_prefix("valkey_version:")) else {
        return false;
    };
    v.trim()
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
        .is_some_and(|major| major >= 9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subevents_map_one_to_one_and_unknown_ones_are_ignored() {
        let all: Vec<Step> = (0..6).filter_map(Step::from_subevent).collect();
        assert_eq!(all.len(), 6);
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(Step::from_subevent(6), None);
        assert_eq!(Step::from_subevent(u64::MAX), None);
    }

    #[test]
    fn an_export_is_never_trusted_until_it_ends_and_every_end_waits_a_new_grace() {
        assert_eq!(effect(Step::ExportStarted).exporting, Some(true));
        assert!(!effect(Step::ExportStarted).gone);
        for end in [Step::ExportAborted, Step::ExportCompleted] {
            assert_eq!(effect(end).exporting, Some(false), "{end:?}");
            assert!(effect(end).unaccept, "{end:?}");
        }
        assert!(effect(Step::ExportCompleted).gone);
        assert!(!effect(Step::ExportAborted).gone);
        for imp in [
            Step::ImportStarted,
            Step::ImportAborted,
            Step::ImportCompleted,
        ] {
            assert!(effect(imp).unaccept, "{imp:?}");
            assert_eq!(effect(imp).exporting, None, "{imp:?}");
            assert!(!effect(imp).gone, "{imp:?}");
        }
    }

    #[test]
    fn only_valkey_nine_and_later_has_atomic_slot_migration() {
        let valkey = |v: &str| format!("# Server\r\nredis_version:7.2.4\r\nvalkey_version:{v}\r\n");
        assert!(server_has_asm(&valkey("9.1.2")));
        assert!(server_has_asm(&valkey("9.0.0")));
        assert!(server_has_asm(&valkey("10.0.0")));
        assert!(!server_has_asm(&valkey("8.0.1")));
        assert!(!server_has_asm(&valkey("8.1.4")));
        assert!(!server_has_asm("# Server\r\nredis_version:7.0.15\r\n"));
        assert!(
            !server_has_asm("# Server\r\nredis_version:9.0.0\r\n"),
            "Redis 9 is not Valkey"
        );
        assert!(!server_has_asm(&valkey("garbage")));
        assert!(!server_has_asm(""));
    }
}
