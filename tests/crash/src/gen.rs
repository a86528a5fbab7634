//! Seeded event generation: every event is a pure function of `(seed, seq, claim)`, so the
//! checker can regenerate what a writer sent and compare it byte for byte with what the server
//! recovered.

use tephra::{Event, EventType, Query, QueryItem, Tags};

/// SplitMix64: small, fast, good enough to spread seeds.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// A derived generator for a sub-stream (`salt` distinguishes streams).
    pub fn fork(&mut self, salt: u64) -> Rng {
        Rng::new(self.next_u64() ^ salt.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }
}

/// The five event types.
pub const TYPES: [&str; 5] = ["Opened", "Deposited", "Withdrawn", "Closed", "Noted"];
/// Number of `entity:` tags.
pub const ENTITIES: u64 = 64;
/// Number of `shard:` tags.
pub const SHARDS: u64 = 8;
/// Bytes of the payload prefix: `seq` then `seed`, both u64 LE.
pub const PAYLOAD_HEAD: usize = 16;

fn rng_for(seed: u64, seq: u64) -> Rng {
    Rng::new(seed ^ seq.wrapping_mul(0xA24B_AED4_963E_E407))
}

/// The event with sequence number `seq` (a `claim:{k}` tag added when `claim` is set):
/// one of [`TYPES`], tags `entity:{seq % 64}`, `shard:{0..8}`, `uniq:{seq}`, a payload starting
/// with `seq` and `seed` and 0..=200 further bytes (1 in 40 events carries 1..8 KiB).
pub fn event(seed: u64, seq: u64, claim: Option<u64>) -> Event {
    let mut r = rng_for(seed, seq);
    let ty = TYPES[r.below(TYPES.len() as u64) as usize];
    let mut tags = vec![format!("entity:{}", seq % ENTITIES), format!("shard:{}", r.below(SHARDS)), format!("uniq:{seq}")];
    if let Some(k) = claim {
        tags.push(format!("claim:{k}"));
    }
    let extra = if r.chance(1, 40) { r.range(1024, 8192) } else { r.below(201) } as usize;
    let mut payload = Vec::with_capacity(PAYLOAD_HEAD + extra);
    payload.extend_from_slice(&seq.to_le_bytes());
    payload.extend_from_slice(&seed.to_le_bytes());
    while payload.len() < PAYLOAD_HEAD + extra {
        payload.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    payload.truncate(PAYLOAD_HEAD + extra);
    Event::new(&EventType::new(ty).unwrap(), &Tags::new(tags).unwrap(), &payload).unwrap()
}

/// The `(seq, seed)` a payload claims to carry, if it is long enough.
pub fn payload_id(data: &[u8]) -> Option<(u64, u64)> {
    if data.len() < PAYLOAD_HEAD {
        return None;
    }
    Some((u64::from_le_bytes(data[0..8].try_into().unwrap()), u64::from_le_bytes(data[8..16].try_into().unwrap())))
}

/// A query for one tag.
pub fn tag_query(tag: &str) -> Query {
    Query::item(QueryItem::with_tags(Tags::new([tag.to_string()]).unwrap()))
}

/// A query for one type.
pub fn type_query(ty: &str) -> Query {
    Query::item(QueryItem::of_types(vec![EventType::new(ty).unwrap()]))
}

/// The query battery compared between the server's (index-backed) reads and a filter of the
/// whole log: types, tags, type+tag items, unions, absent names.
pub fn battery(rng: &mut Rng, present_uniq: Option<u64>, claims: &[u64]) -> Vec<(String, Query)> {
    let mut v: Vec<(String, Query)> = Vec::new();
    for t in TYPES {
        v.push((format!("type {t}"), type_query(t)));
    }
    for _ in 0..3 {
        let e = rng.below(ENTITIES);
        v.push((format!("tag entity:{e}"), tag_query(&format!("entity:{e}"))));
    }
    for s in 0..SHARDS {
        v.push((format!("tag shard:{s}"), tag_query(&format!("shard:{s}"))));
    }
    let (t, e, s) = (TYPES[rng.below(5) as usize], rng.below(ENTITIES), rng.below(SHARDS));
    let both = QueryItem::new(vec![EventType::new(t).unwrap()], Tags::new([format!("entity:{e}"), format!("shard:{s}")]).unwrap());
    v.push((format!("type {t} + entity:{e} + shard:{s}"), Query::item(both)));
    let (t2, e2) = (TYPES[rng.below(5) as usize], rng.below(ENTITIES));
    let union = Query::items(vec![
        QueryItem::new(vec![EventType::new(t2).unwrap(), EventType::new("Closed").unwrap()], Tags::new([format!("shard:{s}")]).unwrap()),
        QueryItem::with_tags(Tags::new([format!("entity:{e2}")]).unwrap()),
    ]);
    v.push((format!("union ({t2}|Closed)+shard:{s} or entity:{e2}"), union));
    if let Some(u) = present_uniq {
        v.push((format!("tag uniq:{u}"), tag_query(&format!("uniq:{u}"))));
    }
    for k in claims.iter().take(2) {
        v.push((format!("tag claim:{k}"), tag_query(&format!("claim:{k}"))));
    }
    v.push(("absent tag".into(), tag_query("absent:never-written")));
    v.push(("absent type".into(), type_query("NeverWritten")));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_regenerate_identically_and_carry_their_seq() {
        for seq in 0..500 {
            let a = event(7, seq, None);
            assert_eq!(a, event(7, seq, None));
            assert_eq!(payload_id(a.data()), Some((seq, 7)));
            assert_ne!(a, event(8, seq, None));
        }
        assert!(event(7, 3, Some(9)).tags().any(|t| t == "claim:9"));
    }
}
