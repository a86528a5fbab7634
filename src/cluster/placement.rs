//! Where a journal's voters go: a pure choice over the cluster's members, the same on every
//! node, so that the directory's creation of a journal names its group without a word more.
//!
//! Rendezvous hashing: each member scores `hash(journal, node)`; the highest scores win, one
//! member per zone first (so a group survives the loss of a zone when zones are set), then the
//! best of the rest. A journal's voters move only when its own members change. Source:
//! docs/journals.md §9.5.

use super::replica::Member;
use crate::journal::JournalId;

/// Voters of a journal group when nothing else is asked: 2F+1 with F = 1.
pub const DEFAULT_VOTERS: usize = 3;

/// The voters of `journal`: `count` members (all of them when there are fewer), sorted by
/// node id.
pub fn place(journal: JournalId, members: &[Member], count: usize) -> Vec<u64> {
    let mut ranked: Vec<(u64, &Member)> = members.iter().map(|m| (score(journal, m.node), m)).collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.node.cmp(&b.1.node)));
    let mut chosen: Vec<u64> = Vec::with_capacity(count);
    let mut zones: Vec<&str> = Vec::new();
    for (_, m) in &ranked {
        if chosen.len() == count {
            break;
        }
        if let Some(z) = m.zone.as_deref() {
            if zones.contains(&z) {
                continue;
            }
            zones.push(z);
        }
        chosen.push(m.node);
    }
    for (_, m) in &ranked {
        if chosen.len() == count {
            break;
        }
        if !chosen.contains(&m.node) {
            chosen.push(m.node);
        }
    }
    chosen.sort_unstable();
    chosen
}

/// A member's score for a journal: FNV-1a over the three ids, then a 64-bit finaliser so
/// that nearby ids spread.
fn score(journal: JournalId, node: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [journal.tenant, journal.journal, node] {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(zones: &[Option<&str>]) -> Vec<Member> {
        zones.iter().enumerate().map(|(i, z)| Member { node: i as u64 + 1, zone: z.map(str::to_owned) }).collect()
    }

    #[test]
    fn three_members_all_vote_and_fewer_than_asked_give_all() {
        let m = members(&[None, None, None]);
        assert_eq!(place(JournalId { tenant: 1, journal: 2 }, &m, 3), vec![1, 2, 3]);
        assert_eq!(place(JournalId { tenant: 1, journal: 2 }, &m[..2], 3), vec![1, 2]);
    }

    #[test]
    fn five_members_spread_journals_and_the_choice_is_stable() {
        let m = members(&[None; 5]);
        let mut load = [0usize; 5];
        for j in 1..=500u64 {
            let id = JournalId { tenant: 7, journal: j };
            let v = place(id, &m, 3);
            assert_eq!(v.len(), 3);
            assert_eq!(v, place(id, &m, 3));
            for n in v {
                load[n as usize - 1] += 1;
            }
        }
        // 1,500 seats over 5 members: each within 20% of its fair 300.
        assert!(load.iter().all(|&l| (240..=360).contains(&l)), "{load:?}");
    }

    #[test]
    fn zones_are_spread_before_a_zone_gets_a_second_voter() {
        let m = members(&[Some("a"), Some("a"), Some("a"), Some("b"), Some("c")]);
        for j in 1..=200u64 {
            let v = place(JournalId { tenant: 1, journal: j }, &m, 3);
            assert!(v.contains(&4) && v.contains(&5), "{v:?}");
        }
    }
}
