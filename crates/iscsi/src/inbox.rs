//! What a connection in the full feature phase has received and not yet handled: bytes taken
//! from the socket without waiting, many PDUs per receive, and the whole PDUs among them. A
//! reader that never blocks on the socket can watch the disk reads it has in flight too.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use crate::pdu::{data_segment_length, wire_len, Pdu, PduError, BHS_LEN};

/// Room for the PDUs queued behind the largest one.
const HEADROOM: usize = 64 << 10;
/// The largest header part of a PDU: the BHS, 255 words of AHS and a header digest.
const MAX_HEADER: usize = BHS_LEN + 255 * 4 + 4;

pub(crate) struct Inbox {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    header_digest: bool,
    data_digest: bool,
    max_data: usize,
}

impl Inbox {
    /// An inbox for PDUs whose data segments are at most `max_data` bytes (our
    /// MaxRecvDataSegmentLength): a whole PDU always fits.
    pub(crate) fn new(header_digest: bool, data_digest: bool, max_data: usize) -> Inbox {
        let largest = MAX_HEADER + max_data.div_ceil(4) * 4 + 4;
        Inbox {
            buf: vec![0; largest + HEADROOM].into_boxed_slice(),
            start: 0,
            end: 0,
            header_digest,
            data_digest,
            max_data,
        }
    }

    /// The bytes received and not yet taken.
    pub(crate) fn available(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// The next PDU, when all of it has arrived; or the error that ends reading (a wrong
    /// header digest, a data segment over the limit), as soon as its header shows it. A
    /// wrong data digest is an error too, with the PDU taken: the stream stays in step.
    pub(crate) fn next_pdu(&mut self) -> Option<Result<Pdu, PduError>> {
        let (hd, dd, max) = (self.header_digest, self.data_digest, self.max_data);
        let held = self.available();
        let n = wire_len(held, hd, dd)?;
        if n > held.len() {
            let bhs: &[u8; BHS_LEN] = held[..BHS_LEN].try_into().expect("wire_len saw a BHS");
            let header = BHS_LEN + bhs[4] as usize * 4 + if hd { 4 } else { 0 };
            if data_segment_length(bhs) > max && held.len() >= header {
                // Reading the header alone reports what is wrong with it.
                let err = Pdu::read_blocking(&mut &held[..header], hd, dd, max).expect_err("data over the limit");
                return Some(Err(err));
            }
            return None;
        }
        let pdu = Pdu::read_blocking(&mut &held[..n], hd, dd, max);
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        Some(pdu)
    }

    /// Receives what the socket holds, without waiting: the bytes received, 0 at the end of
    /// the stream, or WouldBlock when there is nothing yet.
    pub(crate) fn receive(&mut self, sock: &TcpStream) -> io::Result<usize> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let room = &mut self.buf[self.end..];
        debug_assert!(!room.is_empty(), "a whole PDU always fits");
        // SAFETY: `room` is valid for writes of its length for the duration of the call.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                room.as_mut_ptr().cast(),
                room.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.end += n as usize;
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::op;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn receive_all(inbox: &mut Inbox, sock: &TcpStream, want: usize) {
        let mut got = 0;
        while got < want {
            match inbox.receive(sock) {
                Ok(0) => panic!("closed"),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn whole_pdus_come_out_in_order_and_a_partial_one_waits() {
        for (hd, dd) in [(false, false), (true, true)] {
            let (mut client, server) = pair();
            let mut inbox = Inbox::new(hd, dd, 8192);
            let mut wire = Vec::new();
            let mut sent = Vec::new();
            for i in 0..5u32 {
                let mut p = Pdu::new(op::DATA_OUT);
                p.set(16, i);
                p.data = vec![i as u8; 1000 + i as usize];
                p.encode_into(&mut wire, hd, dd);
                sent.push(p);
            }
            let cut = wire.len() - 100;
            client.write_all(&wire[..cut]).unwrap();
            receive_all(&mut inbox, &server, cut);
            for p in &sent[..4] {
                assert_eq!(&inbox.next_pdu().unwrap().unwrap(), p);
            }
            assert!(inbox.next_pdu().is_none(), "the last PDU is not all here");
            assert!(matches!(inbox.receive(&server), Err(e) if e.kind() == io::ErrorKind::WouldBlock));
            client.write_all(&wire[cut..]).unwrap();
            receive_all(&mut inbox, &server, 100);
            assert_eq!(&inbox.next_pdu().unwrap().unwrap(), &sent[4]);
            assert!(inbox.next_pdu().is_none() && inbox.available().is_empty());
            drop(client);
            assert_eq!(inbox.receive(&server).unwrap(), 0, "end of stream");
        }
    }

    #[test]
    fn a_data_segment_over_the_limit_is_refused_from_its_header() {
        let (mut client, server) = pair();
        let mut inbox = Inbox::new(false, false, 4096);
        let mut p = Pdu::new(op::DATA_OUT);
        p.data = vec![1; 8192];
        let wire = p.encode(false, false);
        client.write_all(&wire[..BHS_LEN]).unwrap();
        receive_all(&mut inbox, &server, BHS_LEN);
        assert!(matches!(
            inbox.next_pdu(),
            Some(Err(PduError::TooLong { len: 8192, max: 4096 }))
        ));
    }

    #[test]
    fn a_wrong_data_digest_takes_the_pdu_and_keeps_the_stream_in_step() {
        let (mut client, server) = pair();
        let mut inbox = Inbox::new(true, true, 4096);
        let mut wire = Vec::new();
        let mut bad = Pdu::new(op::DATA_OUT);
        bad.data = vec![9; 100];
        bad.encode_into(&mut wire, true, true);
        let last = wire.len() - 1;
        wire[last] ^= 0xFF;
        let mut good = Pdu::new(op::NOP_OUT);
        good.encode_into(&mut wire, true, true);
        client.write_all(&wire).unwrap();
        receive_all(&mut inbox, &server, wire.len());
        assert!(matches!(inbox.next_pdu(), Some(Err(PduError::DataDigest { .. }))));
        assert_eq!(inbox.next_pdu().unwrap().unwrap().opcode(), op::NOP_OUT);
    }
}
