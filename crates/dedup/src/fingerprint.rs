//! Content fingerprints. A fingerprint only finds candidates: data is shared after a byte
//! compare of the two grains, so fingerprints that collide cost a missed dedup, never data.
//! That is why 128 bits of BLAKE3 are enough as the index key (a collision among 2^40
//! unique grains has odds of about 2^-48), and why a test can force collisions.

/// The first 128 bits of the BLAKE3 hash of a grain's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 16]);

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
        let h = blake3::hash(data);
        let mut f = [0u8; 16];
        f.copy_from_slice(&h.as_bytes()[..16]);
        if let Fingerprinter::Weak { bits } = *self {
            let v = u64::from_le_bytes(f[..8].try_into().expect("8 bytes"));
            let kept = if bits >= 64 { v } else { v & ((1u64 << bits) - 1) };
            f = [0u8; 16];
            f[..8].copy_from_slice(&kept.to_le_bytes());
        }
        Fingerprint(f)
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
    fn a_weak_fingerprinter_makes_collisions() {
        let f = Fingerprinter::Weak { bits: 1 };
        let prints: std::collections::HashSet<_> = (0..16u8).map(|i| f.of(&[i; 4096])).collect();
        assert!(prints.len() <= 2);
    }
}
