//! Who may log in to a target: an ACL of initiator names, and CHAP (RFC 7143 12.1.3, RFC 1994)
//! one-way or mutual. The login phase drives the exchange; this module holds the rules and the
//! arithmetic.

use base64::Engine as _;
use md5::{Digest, Md5};
use rand::RngCore;

/// CHAP credentials of a target. `mutual` is what the target answers with when the initiator
/// asks it to authenticate itself: (target user name, target secret).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chap {
    pub user: String,
    pub secret: String,
    pub mutual: Option<(String, String)>,
}

/// The access rules of a target. The default admits nobody: as LIO and SCST do, a target
/// lets in only the initiators of its ACL, unless its administrator chose to admit any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Initiator names allowed in.
    pub acl: Vec<String>,
    /// Any initiator may log in (LIO's demo mode), the ACL notwithstanding.
    pub allow_any: bool,
    /// When set, logins must authenticate with CHAP.
    pub chap: Option<Chap>,
    /// CHAP credentials of one initiator (its name in lower case), which it alone may log in
    /// with, in place of `chap`: with one secret per target, every host that knows it can
    /// log in under the name of any other the ACL admits, reinstate that host's sessions and
    /// take over its persistent reservations.
    pub initiator_chap: Vec<(String, Chap)>,
}

impl Access {
    /// Every initiator admitted, without CHAP: for a demo on loopback, and tests.
    pub fn open() -> Access {
        Access {
            allow_any: true,
            ..Access::default()
        }
    }

    /// Whether the ACL lets `initiator` in. iSCSI names compare case-insensitively (RFC 3722).
    pub fn admits(&self, initiator: &str) -> bool {
        self.allow_any || self.acl.iter().any(|a| a.eq_ignore_ascii_case(initiator))
    }

    /// The CHAP credentials `initiator` must log in with: its own, else the target's; None
    /// when it needs none.
    pub fn chap_for(&self, initiator: &str) -> Option<&Chap> {
        self.initiator_chap
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(initiator))
            .map(|(_, c)| c)
            .or(self.chap.as_ref())
    }

    /// Whether a session that authenticated as `who` (None: no CHAP) may see this target.
    pub fn visible_to(&self, initiator: &str, who: Option<&Chap>) -> bool {
        self.admits(initiator)
            && match (self.chap_for(initiator), who) {
                (None, _) => true,
                (Some(c), Some(w)) => c.user == w.user && c.secret == w.secret,
                (Some(_), None) => false,
            }
    }
}

/// CHAP with MD5, the one algorithm iSCSI requires.
pub const CHAP_MD5: &str = "5";

/// Length of the challenges we send. RFC 7143 asks for at least as long as the secret's
/// entropy; 16 random bytes is what Windows and Linux initiators send too.
pub const CHALLENGE_LEN: usize = 16;

/// A fresh identifier and challenge.
pub fn new_challenge() -> (u8, Vec<u8>) {
    let mut rng = rand::rng();
    let mut c = vec![0u8; CHALLENGE_LEN];
    rng.fill_bytes(&mut c);
    ((rng.next_u32() & 0xFF) as u8, c)
}

/// RFC 1994: MD5 over the identifier, the secret and the challenge.
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// Compares without an early exit, so that the time taken says nothing about the value.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Decodes an iSCSI binary value: `0x` hex or `0b` base64 (RFC 7143 6.1).
pub fn decode_binary(s: &str) -> Result<Vec<u8>, String> {
    let bad = || format!("'{s}' is not a binary value (0x… hex or 0b… base64)");
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        let hex = if hex.len() % 2 == 1 {
            format!("0{hex}")
        } else {
            hex.to_string()
        };
        // Checked before slicing: a multi-byte character must not split a byte pair.
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| bad()))
            .collect()
    } else if let Some(b64) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| bad())
    } else {
        Err(bad())
    }
}

pub fn encode_hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Checks a secret as the configuration accepts it. RFC 7143 12.1.3 asks for at least 96 bits
/// of secret; Windows initiators take 12 to 16 characters.
pub fn validate_secret(what: &str, s: &str) -> Result<(), String> {
    if s.len() < 12 || s.len() > 255 {
        return Err(format!("the {what} must be 12 to 255 characters (it has {})", s.len()));
    }
    if !s.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!("the {what} may only hold printable ASCII without spaces"));
    }
    Ok(())
}

/// Checks a CHAP user name.
pub fn validate_user(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 255 || !s.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "the {what} must be 1 to 255 printable ASCII characters without spaces"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1994_response_matches_a_known_value() {
        // id 1, secret "secretsecret", challenge 00..0f, computed with `openssl md5`.
        let c: Vec<u8> = (0..16).collect();
        let r = response(1, b"secretsecret", &c);
        let mut input = vec![1u8];
        input.extend_from_slice(b"secretsecret");
        input.extend_from_slice(&c);
        assert_eq!(r, <[u8; 16]>::from(Md5::digest(&input)));
        assert_ne!(r, response(2, b"secretsecret", &c));
    }

    #[test]
    fn binary_values() {
        assert_eq!(decode_binary("0x0a0B").unwrap(), vec![10, 11]);
        assert_eq!(decode_binary("0xabc").unwrap(), vec![0x0a, 0xbc]);
        assert_eq!(decode_binary("0bAQI=").unwrap(), vec![1, 2]);
        // "0x1ʚ0": a character of two bytes where a hex pair would be split (found by fuzzing).
        for bad in ["", "0x", "0xzz", "1234", "0b!!", "0x1ʚ0", "0xʚ0"] {
            assert!(decode_binary(bad).is_err(), "{bad}");
        }
        assert_eq!(decode_binary(&encode_hex(&[0, 255, 16])).unwrap(), vec![0, 255, 16]);
    }

    #[test]
    fn acl_and_visibility() {
        let mut a = Access::default();
        assert!(!a.admits("iqn.2026-11.x:a"), "no ACL admits nobody");
        assert!(Access::open().admits("iqn.2026-11.x:a"));
        a.acl = vec!["iqn.2026-11.x:a".into()];
        assert!(a.admits("IQN.2026-11.X:A"));
        assert!(!a.admits("iqn.2026-11.x:b"));
        let chap = Chap {
            user: "u".into(),
            secret: "s".repeat(12),
            mutual: None,
        };
        a.chap = Some(chap.clone());
        assert!(!a.visible_to("iqn.2026-11.x:a", None));
        assert!(a.visible_to("iqn.2026-11.x:a", Some(&chap)));
        assert!(!a.visible_to("iqn.2026-11.x:b", Some(&chap)));
        let other = Chap {
            secret: "t".repeat(12),
            ..chap.clone()
        };
        assert!(!a.visible_to("iqn.2026-11.x:a", Some(&other)));
        // An initiator of its own secret logs in with it alone; the others with the target's.
        a.acl.push("iqn.2026-11.x:b".into());
        a.initiator_chap = vec![("iqn.2026-11.x:a".into(), other.clone())];
        assert_eq!(a.chap_for("IQN.2026-11.X:A"), Some(&other));
        assert_eq!(a.chap_for("iqn.2026-11.x:b"), Some(&chap));
        assert!(a.visible_to("iqn.2026-11.x:a", Some(&other)));
        assert!(!a.visible_to("iqn.2026-11.x:a", Some(&chap)), "the target's secret");
        assert!(a.visible_to("iqn.2026-11.x:b", Some(&chap)));
        a.chap = None;
        assert_eq!(a.chap_for("iqn.2026-11.x:b"), None);
        assert!(a.visible_to("iqn.2026-11.x:b", None));
        assert!(!a.visible_to("iqn.2026-11.x:a", None));
    }

    #[test]
    fn secrets_and_challenges() {
        assert!(validate_secret("secret", "short").is_err());
        assert!(validate_secret("secret", "has a space 123").is_err());
        validate_secret("secret", "0123456789ab").unwrap();
        let (_, a) = new_challenge();
        let (_, b) = new_challenge();
        assert_eq!(a.len(), CHALLENGE_LEN);
        assert_ne!(a, b);
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
    }
}
