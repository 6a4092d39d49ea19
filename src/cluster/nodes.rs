//! Which hash slots this node answers for, and which primary serves each slot, read from
//! `CLUSTER NODES` text. Pure.

use crate::model::slot::SLOTS;

/// What one `CLUSTER NODES` reply says about this node.
#[derive(Debug, PartialEq, Eq)]
pub struct Mine {
    /// This node is a primary (else a replica, answering for its primary's slots).
    pub primary: bool,
    /// Slot ranges this node answers for (inclusive): a primary's own, a replica's primary's.
    /// Slots being migrated away still count (the node owns them until the handover); slots
    /// being imported do not.
    pub ranges: Vec<(u16, u16)>,
    /// Slots this node (a primary) is migrating away: it must not write keys there any more
    /// (a key written after the migration's last MIGRATE makes the handover fail).
    pub migrating: Vec<u16>,
    /// Every primary's slot ranges (inclusive) with its node id: where a request about an
    /// item of another node's slot is forwarded. Migration markers are not ranges here either.
    pub owners: Vec<(u16, u16, String)>,
}

/// Parses `CLUSTER NODES` output. `None` when the text names no node as `myself`.
pub fn parse(text: &str) -> Option<Mine> {
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 8)
        .collect();
    let me = lines.iter().find(|f| flags(f).any(|x| x == "myself"))?;
    let owners = lines
        .iter()
        .filter(|f| flags(f).any(|x| x == "master"))
        .flat_map(|f| {
            f[8..]
                .iter()
                .filter_map(|s| range(s))
                .map(|(a, b)| (a, b, f[0].to_string()))
        })
        .collect();
    let primary = flags(me).any(|x| x == "master");
    let holder = if primary {
        me
    } else {
        let of = me[3];
        match lines.iter().find(|f| f[0] == of) {
            Some(p) => p,
            None => {
                return Some(Mine {
                    primary,
                    ranges: Vec::new(),
                    migrating: Vec::new(),
                    owners,
                })
            }
        }
    };
    Some(Mine {
        primary,
        ranges: holder[8..].iter().filter_map(|s| range(s)).collect(),
        // Markers are printed on the `myself` line only: a replica's own line shows them when
        // its server tracks its primary's migrations (Valkey 8 replicates SETSLOT), never its
        // primary's line.
        migrating: me[8..].iter().filter_map(|s| migrating(s)).collect(),
        owners,
    })
}

/// Every other node's cluster-bus port (`ip:port@cport`) and whether this node's link to it
/// is up (`connected`), in the order given.
pub fn bus_links(text: &str) -> Vec<(u16, bool)> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 8 && !flags(f).any(|x| x == "myself"))
        .filter_map(|f| {
            let (_, bus) = f[1].split_once('@')?;
            let port = bus.split(',').next()?.parse().ok()?;
            Some((port, f[7] == "connected"))
        })
        .collect()
}

/// `[slot->-node]`: a slot being migrated away.
fn migrating(s: &str) -> Option<u16> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    let (slot, _) = inner.split_once("->-")?;
    slot.parse().ok().filter(|s| (*s as usize) < SLOTS)
}

fn flags<'a>(fields: &'a [&'a str]) -> impl Iterator<Item = &'a str> {
    fields[2].split(',')
}

/// `a-b` or `a`, within the slot space; migration markers (`[…]`) are not ranges.
fn range(s: &str) -> Option<(u16, u16)> {
    if s.starts_with('[') {
        return None;
    }
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (a.parse::<u16>().ok()?, b.parse::<u16>().ok()?),
        None => {
            let a = s.parse::<u16>().ok()?;
            (a, a)
        }
    };
    (a <= b && (b as usize) < SLOTS).then_some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922 [5460-<-e7d1]
292f 127.0.0.1:30003@40003 master - 0 1426238318243 3 connected 10923-16383
6ec2 127.0.0.1:30005@40005 slave 67ed 0 1426238316232 5 connected
824f 127.0.0.1:30006@40006 slave 292f 0 1426238317741 6 connected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5459 5460 [5460->-67ed]
";

    #[test]
    fn bus_links_are_the_other_nodes_bus_ports_and_link_states() {
        let mut text = NODES.replace(
            "292f 127.0.0.1:30003@40003 master - 0 1426238318243 3 connected",
            "292f 127.0.0.1:30003@40003,host-c master - 0 1426238318243 3 disconnected",
        );
        text.push_str("garbage line\n");
        assert_eq!(
            bus_links(&text),
            [
                (40004, true),
                (40002, true),
                (40003, false),
                (40005, true),
                (40006, true)
            ]
        );
    }

    #[test]
    fn a_primary_owns_its_ranges_including_one_it_is_migrating_away() {
        let m = parse(NODES).unwrap();
        assert!(m.primary);
        assert_eq!(m.ranges, vec![(0, 5459), (5460, 5460)]);
        assert_eq!(m.migrating, vec![5460]);
    }

    #[test]
    fn a_replica_answers_for_its_primarys_slots_not_imports() {
        let text = NODES.replace("myself,master", "master").replace(
            "6ec2 127.0.0.1:30005@40005 slave",
            "6ec2 127.0.0.1:30005@40005 myself,slave",
        );
        let m = parse(&text).unwrap();
        assert!(!m.primary);
        assert_eq!(m.ranges, vec![(5461, 10922)]);
        assert!(m.migrating.is_empty(), "importing is not migrating");
    }

    /// Valkey 8 replicates SETSLOT: a replica of the migrating primary shows the marker on its
    /// own `myself` line (the primary's line, as any other node's, never carries it).
    #[test]
    fn a_replica_sees_its_primarys_migration_on_its_own_line() {
        // As the replica prints it: the marker on its own line, none on its primary's.
        let text = NODES
            .replace("myself,master", "master")
            .replace(" 5460 [5460->-67ed]", " 5460")
            .replace(
                "07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected",
                "07c3 127.0.0.1:30004@40004 myself,slave e7d1 0 1426238317239 4 connected [5460->-67ed]",
            );
        let m = parse(&text).unwrap();
        assert!(!m.primary);
        assert_eq!(m.ranges, vec![(0, 5459), (5460, 5460)]);
        assert_eq!(m.migrating, vec![5460]);
    }

    #[test]
    fn every_primarys_ranges_are_named_by_its_id() {
        let m = parse(NODES).unwrap();
        let mut owners = m.owners.clone();
        owners.sort();
        assert_eq!(
            owners,
            vec![
                (0, 5459, "e7d1".to_string()),
                (5460, 5460, "e7d1".to_string()),
                (5461, 10922, "67ed".to_string()),
                (10923, 16383, "292f".to_string()),
            ]
        );
        // A replica sees the same owners.
        let text = NODES.replace("myself,master", "master").replace(
            "6ec2 127.0.0.1:30005@40005 slave",
            "6ec2 127.0.0.1:30005@40005 myself,slave",
        );
        let mut seen = parse(&text).unwrap().owners;
        seen.sort();
        assert_eq!(seen, owners);
    }

    #[test]
    fn odd_input_owns_nothing() {
        assert_eq!(parse(""), None);
        let orphan = "aaaa 127.0.0.1:1@2 myself,slave zzzz 0 0 1 connected\n";
        assert_eq!(parse(orphan).unwrap().ranges, vec![]);
        let bad = "aaaa 127.0.0.1:1@2 myself,master - 0 0 1 connected 9-3 16384 x 7\n";
        assert_eq!(parse(bad).unwrap().ranges, vec![(7, 7)]);
        assert_eq!(parse(bad).unwrap().owners, vec![(7, 7, "aaaa".to_string())]);
        // A failed primary ("master,fail") still names its slots until a failover moves them.
        let failed = "bbbb 127.0.0.1:2@3 master,fail - 0 0 1 connected 0-9\n";
        let text = format!("{bad}{failed}");
        assert!(parse(&text)
            .unwrap()
            .owners
            .contains(&(0, 9, "bbbb".to_string())));
    }
}
