//! Portals: the TCP addresses the target listens on, how their sockets are set up, and how
//! SendTargets names them to an initiator.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpListener, TcpSocket};

/// Socket buffer sizes for a portal's connections, in bytes. None leaves the kernel's
/// autotuning alone, which is what most networks want; a fixed size helps on links whose
/// bandwidth-delay product is above what autotuning reaches (net.ipv4.tcp_rmem's maximum).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketBuffers {
    pub send: Option<u32>,
    pub recv: Option<u32>,
}

/// A bound, listening portal and the buffer sizes the kernel granted (Linux reports twice the
/// size asked for, to cover its bookkeeping, and caps the request at net.core.[rw]mem_max).
pub struct Bound {
    pub listener: TcpListener,
    pub local: SocketAddr,
    pub send_buffer: u32,
    pub recv_buffer: u32,
    /// Set when the kernel granted less than was asked for.
    pub capped: Option<String>,
}

/// Binds `addr` with the given buffers. They are set on the listening socket, before listen(),
/// because the receive buffer decides the TCP window scale negotiated in the handshake, and
/// accepted connections inherit both sizes. Needs to run inside a tokio runtime.
pub fn bind(addr: SocketAddr, buffers: SocketBuffers) -> std::io::Result<Bound> {
    let s = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    s.set_reuseaddr(true)?;
    if let Some(n) = buffers.send {
        s.set_send_buffer_size(n)?;
    }
    if let Some(n) = buffers.recv {
        s.set_recv_buffer_size(n)?;
    }
    s.bind(addr)?;
    let send_buffer = s.send_buffer_size()?;
    let recv_buffer = s.recv_buffer_size()?;
    let mut short = Vec::new();
    if let Some(n) = buffers.send.filter(|&n| send_buffer / 2 < n) {
        short.push(format!(
            "send buffer {} of {n} bytes (net.core.wmem_max)",
            send_buffer / 2
        ));
    }
    if let Some(n) = buffers.recv.filter(|&n| recv_buffer / 2 < n) {
        short.push(format!(
            "receive buffer {} of {n} bytes (net.core.rmem_max)",
            recv_buffer / 2
        ));
    }
    let capped = (!short.is_empty()).then(|| {
        format!(
            "the kernel granted only a {}; raise the sysctl to get more",
            short.join(" and a ")
        )
    });
    let listener = s.listen(1024)?;
    let local = listener.local_addr()?;
    Ok(Bound {
        listener,
        local,
        send_buffer,
        recv_buffer,
        capped,
    })
}

/// The TargetAddress values for a SendTargets answer on a connection that arrived at `local`:
/// that address first (the initiator knows it works), then every other portal. A wildcard
/// portal is reachable at the address the initiator already used, with the portal's port.
/// All portals are in portal group 1.
pub fn target_addresses(portals: &[SocketAddr], local: SocketAddr) -> Vec<String> {
    let mut out = vec![local];
    for &p in portals {
        let a = if p.ip().is_unspecified() {
            if is_v4(p.ip()) != is_v4(local.ip()) {
                continue;
            }
            SocketAddr::new(local.ip(), p.port())
        } else {
            p
        };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out.into_iter().map(|a| format!("{},1", addr_text(a))).collect()
}

fn is_v4(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v) => v.to_ipv4_mapped().is_some(),
    }
}

/// An address as RFC 7143 writes it in TargetAddress: IPv6 in brackets.
pub fn addr_text(a: SocketAddr) -> String {
    match a {
        SocketAddr::V4(v) => format!("{}:{}", v.ip(), v.port()),
        SocketAddr::V6(v) => format!("[{}]:{}", v.ip(), v.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn send_targets_lists_the_connection_first_then_other_portals() {
        let portals = [
            a("0.0.0.0:3260"),
            a("10.0.0.5:3261"),
            a("[::]:3262"),
            a("[fe80::1]:3263"),
        ];
        assert_eq!(
            target_addresses(&portals, a("192.168.1.2:3260")),
            ["192.168.1.2:3260,1", "10.0.0.5:3261,1", "[fe80::1]:3263,1"]
        );
        assert_eq!(
            target_addresses(&portals, a("[::1]:3262")),
            ["[::1]:3262,1", "10.0.0.5:3261,1", "[fe80::1]:3263,1"]
        );
        // No portals registered (a bare listener): the connection's own address.
        assert_eq!(target_addresses(&[], a("127.0.0.1:1")), ["127.0.0.1:1,1"]);
    }

    #[tokio::test]
    async fn bind_reports_granted_buffers_and_caps() {
        let b = bind(
            a("127.0.0.1:0"),
            SocketBuffers {
                send: Some(256 << 10),
                recv: Some(256 << 10),
            },
        )
        .unwrap();
        assert_ne!(b.local.port(), 0);
        // Linux doubles what it grants; below the default rmem_max/wmem_max caps nothing.
        if b.capped.is_none() {
            assert!(b.send_buffer >= 256 << 10 && b.recv_buffer >= 256 << 10);
        }
        let huge = bind(
            a("127.0.0.1:0"),
            SocketBuffers {
                send: None,
                recv: Some(1 << 30),
            },
        )
        .unwrap();
        let why = huge
            .capped
            .expect("a 1 GiB receive buffer is above any default rmem_max");
        assert!(why.contains("net.core.rmem_max"), "{why}");
        // Taken: a clear error, not a panic.
        assert!(bind(b.local, SocketBuffers::default()).is_err());
    }
}
