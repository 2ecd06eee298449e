//! Content fingerprints. The first 128 bits of a grain's BLAKE3 hash are its key in the
//! index: they find candidates (a collision among 2^40 unique grains has odds of about
//! 2^-48). Data is shared when the whole 256-bit hash of both grains is equal and the
//! candidate's slot provably still holds what was hashed, or else after a byte compare of
//! the two grains. A test fingerprinter that forces collisions has no second half, so every
//! candidate it finds is compared byte for byte.

/// The first 128 bits of the BLAKE3 hash of a grain's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 16]);

/// The other 128 bits of the BLAKE3 hash: with the fingerprint, the whole 256-bit hash.
pub type HashTail = [u8; 16];

/// How fingerprints are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fingerprinter {
    #[default]
    Blake3,
    /// Keeps `bits` bits of the hash (at most 64), so that different contents share a
    /// fingerprint on purpose: for tests that prove a collision never merges data.
    Weak { bits: u8 },
}

impl Fingerprinter {
    pub fn of(&self, data: &[u8]) -> Fingerprint {
        self.hash(data).0
    }

    /// The fingerprint, and the rest of the 256-bit hash when this fingerprinter keeps it
    /// (a weak one does not: what it finds is always compared byte for byte).
    pub fn hash(&self, data: &[u8]) -> (Fingerprint, Option<HashTail>) {
        let h = blake3::hash(data);
        let mut f = [0u8; 16];
        f.copy_from_slice(&h.as_bytes()[..16]);
        match *self {
            Fingerprinter::Blake3 => {
                let mut tail = [0u8; 16];
                tail.copy_from_slice(&h.as_bytes()[16..]);
                (Fingerprint(f), Some(tail))
            }
            Fingerprinter::Weak { bits } => {
                let v = u64::from_le_bytes(f[..8].try_into().expect("8 bytes"));
                let kept = if bits >= 64 { v } else { v & ((1u64 << bits) - 1) };
                f = [0u8; 16];
                f[..8].copy_from_slice(&kept.to_le_bytes());
                (Fingerprint(f), None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn different_contents_have_different_strong_fingerprints() {
        let f = Fingerprinter::Blake3;
        assert_ne!(f.of(&[1u8; 4096]), f.of(&[2u8; 4096]));
        assert_eq!(f.of(&[7u8; 4096]), f.of(&[7u8; 4096]));
    }

    #[test]
    fn the_strong_hash_is_blake3_whole_and_a_weak_one_keeps_no_tail() {
        let data = [9u8; 4096];
        let (f, tail) = Fingerprinter::Blake3.hash(&data);
        let whole = blake3::hash(&data);
        assert_eq!(&whole.as_bytes()[..16], &f.0);
        assert_eq!(&whole.as_bytes()[16..], &tail.unwrap());
        assert_eq!(Fingerprinter::Weak { bits: 8 }.hash(&data).1, None);
    }

    #[test]
    fn a_weak_fingerprinter_makes_collisions() {
        let f = Fingerprinter::Weak { bits: 1 };
        let prints: std::collections::HashSet<_> = (0..16u8).map(|i| f.of(&[i; 4096])).collect();
        assert!(prints.len() <= 2);
    }
}
