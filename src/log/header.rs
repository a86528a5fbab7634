//! The 64-byte segment header (docs/format.md §3), little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `EVTS` |
//! | 4 | 2 | version `u16` (0) |
//! | 6 | 8 | `created_at_nanos` `u64` |
//! | 14 | 8 | `base_position` `u64` (1-based) |
//! | 22 | 38 | zero padding |
//! | 60 | 4 | CRC-32/IEEE over bytes `[0..60)` |

/// Size of the segment header in bytes; records start right after it.
pub const HEADER_LEN: usize = 64;
/// The segment magic, `EVTS`.
pub const MAGIC: [u8; 4] = *b"EVTS";
/// The only format version we write (older-or-equal versions are readable).
pub const VERSION: u16 = 0;

/// A decoded segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Creation time, Unix epoch nanoseconds.
    pub created_at_nanos: u64,
    /// The first position stored in the segment.
    pub base_position: u64,
}

/// Why 64 bytes are not a usable segment header, checked in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// All 64 bytes are zero (or the file is shorter than a header): creation never finished.
    #[error("segment header was never written")]
    Unwritten,
    /// The CRC over bytes 0..60 does not match.
    #[error("segment header checksum mismatch")]
    ChecksumMismatch,
    /// The magic is not `EVTS`.
    #[error("segment header has a bad magic")]
    BadMagic,
    /// A version newer than we understand.
    #[error("segment header version {0} is not supported")]
    UnsupportedVersion(u16),
    /// The reserved padding is not zero.
    #[error("segment header padding is not zero")]
    DirtyPadding,
}

impl SegmentHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..14].copy_from_slice(&self.created_at_nanos.to_le_bytes());
        b[14..22].copy_from_slice(&self.base_position.to_le_bytes());
        let crc = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and validates a header; a slice shorter than 64 bytes is `Unwritten`.
    ///
    /// # Errors
    /// A [`HeaderError`], in the reference's validation order.
    pub fn decode(b: &[u8]) -> Result<SegmentHeader, HeaderError> {
        if b.len() < HEADER_LEN || b[..HEADER_LEN].iter().all(|&x| x == 0) {
            return Err(HeaderError::Unwritten);
        }
        let b = &b[..HEADER_LEN];
        let crc = u32::from_le_bytes(b[60..64].try_into().unwrap());
        if crc32fast::hash(&b[..60]) != crc {
            return Err(HeaderError::ChecksumMismatch);
        }
        if b[0..4] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version > VERSION {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        if b[22..60].iter().any(|&x| x != 0) {
            return Err(HeaderError::DirtyPadding);
        }
        Ok(SegmentHeader {
            created_at_nanos: u64::from_le_bytes(b[6..14].try_into().unwrap()),
            base_position: u64::from_le_bytes(b[14..22].try_into().unwrap()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_header_bytes() {
        // docs/format.md §3: created_at = 15695 days in ns, base 123456789 -> CRC A5 D5 41 79.
        let h = SegmentHeader { created_at_nanos: 15695 * 86_400 * 1_000_000_000, base_position: 123_456_789 };
        let b = h.encode();
        assert_eq!(&b[0..6], &[0x45, 0x56, 0x54, 0x53, 0, 0]);
        assert_eq!(&b[14..22], &123_456_789u64.to_le_bytes());
        assert_eq!(&b[60..64], &[0xA5, 0xD5, 0x41, 0x79]);
        assert_eq!(SegmentHeader::decode(&b), Ok(h));
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let b = SegmentHeader { created_at_nanos: 42, base_position: 1 }.encode();
        for byte in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut c = b;
                c[byte] ^= 1 << bit;
                assert!(SegmentHeader::decode(&c).is_err(), "flip of byte {byte} bit {bit} went unnoticed");
            }
        }
    }

    #[test]
    fn validation_order() {
        assert_eq!(SegmentHeader::decode(&[0u8; 64]), Err(HeaderError::Unwritten));
        assert_eq!(SegmentHeader::decode(&[0u8; 10]), Err(HeaderError::Unwritten));
        assert_eq!(SegmentHeader::decode(&[0xffu8; 64]), Err(HeaderError::ChecksumMismatch));
        let reseal = |mut b: [u8; 64]| {
            let crc = crc32fast::hash(&b[..60]);
            b[60..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let good = SegmentHeader { created_at_nanos: 1, base_position: 1 }.encode();
        let mut m = good;
        m[0] = b'X';
        assert_eq!(SegmentHeader::decode(&reseal(m)), Err(HeaderError::BadMagic));
        let mut v = good;
        v[4] = 1;
        assert_eq!(SegmentHeader::decode(&reseal(v)), Err(HeaderError::UnsupportedVersion(1)));
        let mut p = good;
        p[30] = 1;
        assert_eq!(SegmentHeader::decode(&reseal(p)), Err(HeaderError::DirtyPadding));
    }
}
