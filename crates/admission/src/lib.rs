//! What a listener admits, shared by the iSCSI portals and the NBD listeners: a bound on the
//! connections open at once, and a bound per source (an IPv4 address, an IPv6 /64) on the
//! connections still being let in (an iSCSI login, an NBD negotiation), so that one host
//! cannot hold every place with connections that never get past their greeting. Each place is given back when the value
//! that holds it is dropped, however the connection ends.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One connection counted against its listener's limit while it lives.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<AtomicUsize>);

impl ConnectionSlot {
    /// A slot of `open`, if fewer than `limit` are taken.
    pub fn take(open: &Arc<AtomicUsize>, limit: usize) -> Option<ConnectionSlot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| ConnectionSlot(open.clone()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whom a connection from `ip` (and a refusal of it) is counted against: an IPv4 address is
/// one source, but an IPv6 host is usually given a whole /64 (SLAAC, privacy addresses) and
/// could take a new address per connection, so an IPv6 address counts as its /64. An IPv4
/// address written as IPv6 (`::ffff:a.b.c.d`, from a dual-stack socket) is the IPv4 address.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// Connections of a listener still being let in, by the source they come from
/// ([`source_of`]).
#[derive(Debug, Default)]
pub struct BeingLetIn(Mutex<HashMap<IpAddr, usize>>);

/// One connection counted as being let in from its address until dropped.
#[derive(Debug)]
pub struct AddressPlace {
    table: Arc<BeingLetIn>,
    ip: IpAddr,
}

impl BeingLetIn {
    /// A place for a connection from `ip`, if fewer than `limit` from its source hold one.
    pub fn take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<AddressPlace> {
        let ip = source_of(ip);
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = t.entry(ip).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(AddressPlace {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut t = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_slots_stay_within_the_limit_and_come_back() {
        let open = Arc::new(AtomicUsize::new(0));
        let s: Vec<_> = (0..3).map(|_| ConnectionSlot::take(&open, 3).unwrap()).collect();
        assert!(ConnectionSlot::take(&open, 3).is_none());
        drop(s);
        assert_eq!(open.load(Ordering::Acquire), 0);
        assert!(ConnectionSlot::take(&open, 3).is_some());
    }

    /// Places held from `ip`, and the addresses the table keeps.
    fn held(table: &BeingLetIn, ip: IpAddr) -> (usize, usize) {
        let t = table.0.lock().unwrap();
        (t.get(&ip).copied().unwrap_or(0), t.len())
    }

    #[test]
    fn places_are_bounded_per_address_and_forgotten_when_all_come_back() {
        let table = Arc::new(BeingLetIn::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let from_a: Vec<_> = (0..2).map(|_| table.take(a, 2).unwrap()).collect();
        assert!(table.take(a, 2).is_none(), "a third from the same address");
        let one_b = table.take(b, 2).expect("another address is not held back");
        assert_eq!((held(&table, a), held(&table, b)), ((2, 2), (1, 2)));
        drop(from_a);
        assert_eq!(held(&table, a), (0, 1), "an address holding nothing is not kept");
        assert!(table.take(a, 2).is_some());
        drop(one_b);
        assert_eq!(held(&table, b), (0, 0));
    }

    /// An IPv6 host may take a new address of its /64 for each connection: the /64 is one
    /// source. An IPv4 address written as IPv6 is the IPv4 address.
    #[test]
    fn an_ipv6_prefix_is_one_source() {
        let table = Arc::new(BeingLetIn::default());
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let _a = table.take(ip("2001:db8:1:2::1"), 2).unwrap();
        let _b = table.take(ip("2001:db8:1:2:abcd::7"), 2).unwrap();
        assert!(
            table.take(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), 2).is_none(),
            "a third from the /64"
        );
        let _c = table
            .take(ip("2001:db8:1:3::1"), 2)
            .expect("another /64 is another source");
        let _d = table.take(ip("10.0.0.9"), 1).unwrap();
        assert!(table.take(ip("::ffff:10.0.0.9"), 1).is_none(), "the same IPv4 address");
    }
}
