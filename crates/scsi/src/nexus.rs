//! The I_T nexus a command arrives on, and the LUNs it can address through its target.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use crate::lun::Lun;

/// An I_T nexus: one initiator port's session with the target.
#[derive(Debug, Clone)]
pub struct Nexus {
    /// Unique to one session while the daemon runs: keys SPC-2 reservations and copy results,
    /// which end with the session.
    pub id: u64,
    /// The initiator's name ("iqn.…").
    pub initiator: String,
    /// With the name, identifies the initiator port across logins: persistent reservation
    /// registrations and unit attentions are kept by it.
    pub isid: [u8; 6],
    /// The other LUNs this nexus can address: what an EXTENDED COPY it issues may name.
    pub scope: Scope,
    /// Set when the session is ended from outside (its initiator taken out of the ACL, a
    /// reinstatement): a copy operation of it still running then makes nothing that outlives
    /// it, such as a ROD token no session could ask for.
    ended: Arc<AtomicBool>,
    /// The host the session comes from, by its address (an IPv6 one by its /64), when it
    /// comes over a network: an initiator chooses its own name, so what is kept per
    /// initiator against one hogging it (the copy tokens' budget) is kept per host too.
    pub host: Option<std::net::IpAddr>,
}

/// The logical units an I_T nexus can address through its target port, after the target's
/// ACL and CHAP let it in: an iSCSI session's target. Third-party copy resolves the LUNs its
/// descriptors name here and nowhere else, so that a copy can never reach a LUN its initiator
/// could not read or write itself (LIO's fix for CVE-2020-28374).
pub trait LunScope: Send + Sync {
    /// The LUN with this NAA designator (VPD page 0x83), if the nexus can address it.
    fn lun_by_naa(&self, naa: &[u8; 16]) -> Option<Arc<Lun>>;
}

/// A nexus's [`LunScope`], held weakly: a LUN keeps the nexuses that used it, and a target
/// holds its LUNs, so a strong reference would make a cycle.
#[derive(Clone, Default)]
pub struct Scope(Option<Weak<dyn LunScope>>);

impl Scope {
    /// No other LUN: a copy may name only the LUN it was sent to.
    pub fn none() -> Scope {
        Scope(None)
    }

    pub fn of<S: LunScope + 'static>(s: &Arc<S>) -> Scope {
        let s: Arc<dyn LunScope> = s.clone();
        Scope(Some(Arc::downgrade(&s)))
    }

    pub(crate) fn lun_by_naa(&self, naa: &[u8; 16]) -> Option<Arc<Lun>> {
        self.0.as_ref()?.upgrade()?.lun_by_naa(naa)
    }

    /// Whether `lun` is (still) the one this nexus addresses by its designator: always, for
    /// a nexus without a target; no longer, once the LUN was taken out of the target or
    /// replaced there by another with the same designator, or the target is gone.
    pub(crate) fn presents(&self, lun: &Lun) -> bool {
        self.0.is_none() || self.lun_by_naa(lun.naa()).is_some_and(|l| std::ptr::eq(&*l, lun))
    }
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Scope(target)"
        } else {
            "Scope(none)"
        })
    }
}

impl Nexus {
    /// A nexus that can address no other LUN (see [`with_scope`](Self::with_scope)).
    pub fn new(id: u64, initiator: &str, isid: [u8; 6]) -> Nexus {
        Nexus {
            id,
            initiator: initiator.to_string(),
            isid,
            scope: Scope::none(),
            ended: Arc::default(),
            host: None,
        }
    }

    /// The nexus of a session from `addr` (see [`host`](Self::host)).
    pub fn from_host(mut self, addr: std::net::IpAddr) -> Nexus {
        self.host = Some(host_of(addr));
        self
    }

    pub fn with_scope(mut self, scope: Scope) -> Nexus {
        self.scope = scope;
        self
    }

    /// Shares `ended` with whoever ends the session from outside (see [`ended`](Self::ended)).
    pub fn ended_by(mut self, ended: Arc<AtomicBool>) -> Nexus {
        self.ended = ended;
        self
    }

    /// Whether the session was ended from outside.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// The nexus of callers that are not a transport session (tests, tools).
    pub fn local() -> Nexus {
        Nexus::new(0, "local", [0; 6])
    }
}

/// The host an address stands for: an IPv4 address (also written as IPv4-mapped IPv6), or
/// the /64 of an IPv6 one, which a single host may take any address of.
pub fn host_of(addr: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_an_ipv4_address_or_the_64_of_an_ipv6_one() {
        let h = |s: &str| host_of(s.parse().unwrap()).to_string();
        assert_eq!(h("192.0.2.7"), "192.0.2.7");
        assert_eq!(h("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(h("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(h("2001:db8:1:2::ffff"), h("2001:db8:1:2:1:2:3:4"));
        assert_ne!(h("2001:db8:1:2::1"), h("2001:db8:1:3::1"));
    }
}
