//! Sending: PDUs stamped with the sequence numbers in the order they reach the socket, and
//! the Data-In and SCSI Response PDUs of an answered command.

use super::*;

impl Writer {
    /// The send side; a thread that panicked while sending left at worst a torn PDU, which
    /// the initiator detects, so the lock is taken over rather than poisoned for good.
    pub(super) fn side(&self) -> std::sync::MutexGuard<'_, WriteSide> {
        self.side.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stamps the PDUs' sequence numbers and lengths and sends them in as few writes as the
    /// kernel allows.
    pub(super) fn send(&self, pdus: &mut [Out]) -> io::Result<()> {
        let mut w = self.side();
        if !w.open {
            return Err(io::ErrorKind::NotConnected.into());
        }
        // Headers with their digests, and padding with data digests, side by side in one
        // buffer; the data stays where it is.
        let mut meta = Vec::with_capacity(pdus.len() * (BHS_LEN + 12));
        let mut spans = Vec::with_capacity(pdus.len());
        for p in pdus.iter_mut() {
            put32(&mut p.bhs, at::STAT_SN, w.stat_sn);
            if p.status {
                w.stat_sn = w.stat_sn.wrapping_add(1);
            }
            put32(&mut p.bhs, at::EXP_CMD_SN, self.seq.exp_cmd_sn.load(Ordering::Acquire));
            put32(&mut p.bhs, at::MAX_CMD_SN, self.seq.max_cmd_sn());
            let n = p.data.len();
            p.bhs[4] = 0;
            p.bhs[5] = (n >> 16) as u8;
            p.bhs[6] = (n >> 8) as u8;
            p.bhs[7] = n as u8;
            let head = meta.len();
            meta.extend_from_slice(&p.bhs);
            if self.header_digest {
                meta.extend_from_slice(&crc32c::crc32c(&p.bhs).to_le_bytes());
            }
            let tail = meta.len();
            let pad = [0u8; 3];
            let pad = &pad[..n.div_ceil(4) * 4 - n];
            meta.extend_from_slice(pad);
            if self.data_digest && n > 0 {
                let crc = crc32c::crc32c_append(crc32c::crc32c(p.data), pad);
                meta.extend_from_slice(&crc.to_le_bytes());
            }
            spans.push((head, tail, meta.len()));
        }
        let mut parts: Vec<IoSlice> = Vec::with_capacity(pdus.len() * 3);
        for (p, &(head, tail, end)) in pdus.iter().zip(&spans) {
            parts.push(IoSlice::new(&meta[head..tail]));
            parts.push(IoSlice::new(p.data));
            parts.push(IoSlice::new(&meta[tail..end]));
        }
        parts.retain(|p| !p.is_empty());
        write_all_vectored(&mut w.sock, &mut parts)
    }

    pub(super) fn send_pdu(&self, p: &Pdu, status: bool) {
        let _ = self.send(&mut [Out::of(p, status)]);
    }

    /// Sends nothing after this, and tells the initiator so.
    pub(super) fn close(&self) {
        let mut w = self.side();
        w.open = false;
        let _ = w.sock.shutdown(Shutdown::Write);
    }

    /// Ends the connection both ways: a thread blocked reading it wakes with an error.
    pub(super) fn abort(&self) {
        let _ = self.side().sock.shutdown(Shutdown::Both);
    }
}

/// Writes every byte of `parts` (none of them empty), IOV_MAX slices at a time, again for
/// what a short write left.
pub(super) fn write_all_vectored(sock: &mut TcpStream, mut parts: &mut [IoSlice]) -> io::Result<()> {
    while !parts.is_empty() {
        let end = parts.len().min(MAX_IOV);
        match sock.write_vectored(&parts[..end]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The data segment of a SCSI Response that carries sense: its length, then the sense.
pub(super) fn sense_segment(sense: &[u8]) -> Vec<u8> {
    if sense.is_empty() {
        return Vec::new();
    }
    let mut d = (sense.len() as u16).to_be_bytes().to_vec();
    d.extend_from_slice(sense);
    d
}

/// Data-In PDUs (the last one carrying status when there is no sense) or a SCSI Response,
/// with their data borrowed from `resp`.
#[allow(clippy::too_many_arguments)]
pub(super) fn response_pdus<'a>(
    itt: u32,
    lun: [u8; 8],
    resp: &'a Response,
    sense_segment: &'a [u8],
    edtl: usize,
    read: bool,
    wanted: Option<usize>,
    max_seg: usize,
) -> Vec<Out<'a>> {
    let (mut over, mut under) = (0usize, 0usize);
    let mut data: &[u8] = &resp.data;
    if read {
        if data.len() > edtl {
            over = data.len() - edtl;
            data = &data[..edtl];
        } else if edtl > data.len() {
            under = edtl - data.len();
        }
    } else if !data.is_empty() {
        // Without R the initiator takes no Data-In: all the command returned is residual.
        over = data.len();
        data = &[];
    } else if let Some(w) = wanted {
        if w > edtl {
            over = w - edtl;
        } else {
            under = edtl - w;
        }
    }
    let residual_flags = if over > 0 {
        0x04
    } else if under > 0 {
        0x02
    } else {
        0
    };
    let residual = (over + under) as u32;
    let collapse = resp.status == sense::GOOD && !data.is_empty();
    let n = data.len();
    let mut out = Vec::with_capacity(n.div_ceil(max_seg.max(1)) + 1);
    let mut offset = 0;
    let mut data_sn = 0;
    while offset < n {
        let len = max_seg.min(n - offset);
        let last = offset + len == n;
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = op::DATA_IN;
        bhs[8..16].copy_from_slice(&lun);
        put32(&mut bhs, at::ITT, itt);
        put32(&mut bhs, at::TTT, NO_TAG);
        put32(&mut bhs, at::DATA_SN, data_sn);
        put32(&mut bhs, at::BUFFER_OFFSET, offset as u32);
        let mut status = false;
        if last {
            bhs[1] = 0x80;
            if collapse {
                bhs[1] |= 0x01 | residual_flags;
                bhs[3] = resp.status;
                put32(&mut bhs, at::RESIDUAL, residual);
                status = true;
            }
        }
        out.push(Out {
            bhs,
            data: &data[offset..offset + len],
            status,
        });
        offset += len;
        data_sn += 1;
    }
    if !collapse {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = op::SCSI_RESP;
        bhs[1] = 0x80 | residual_flags;
        bhs[3] = resp.status;
        put32(&mut bhs, at::ITT, itt);
        // ExpDataSN: how many Data-In PDUs went before.
        put32(&mut bhs, at::DATA_SN, data_sn);
        put32(&mut bhs, at::RESIDUAL, residual);
        out.push(Out {
            bhs,
            data: sense_segment,
            status: true,
        });
    }
    out
}

impl Session {
    /// Sends the commands' data and status, all in one write; they are no longer outstanding.
    /// A command a task management function aborted gets no answer.
    pub(super) fn respond(&self, jobs: &[Job], resps: &[Response]) {
        self.writer
            .seq
            .outstanding
            .fetch_sub(jobs.len() as u32, Ordering::AcqRel);
        let aborted = self.running.finish(jobs.iter().map(|j| j.itt));
        let senses: Vec<Vec<u8>> = resps.iter().map(|r| sense_segment(&r.sense)).collect();
        let max_seg = self.ctx.params.max_xmit_data_segment as usize;
        let mut pdus = Vec::with_capacity(jobs.len());
        for (job, resp) in jobs.iter().zip(resps) {
            if let Some((l, m)) = job.lun.as_ref().and_then(|l| Some((l, l.meter()?))) {
                let ok = resp.status == sense::GOOD;
                let bytes = if ok {
                    transfer_length(&job.cdb, l.block_size()).unwrap_or(0)
                } else {
                    0
                };
                m.done(io_op(&job.cdb), bytes, job.arrived.elapsed(), ok);
            }
        }
        for (((job, resp), sense), _) in jobs.iter().zip(resps).zip(&senses).zip(&aborted).filter(|(_, &a)| !a) {
            // What the CDB asks to move, for the residual of a write.
            let wanted = if job.read {
                None
            } else {
                job.lun
                    .as_ref()
                    .and_then(|l| transfer_length(&job.cdb, l.block_size()))
                    .map(|w| w as usize)
            };
            pdus.extend(response_pdus(
                job.itt,
                job.lun_field,
                resp,
                sense,
                job.edtl,
                job.read,
                wanted,
                max_seg,
            ));
        }
        if pdus.is_empty() {
            return;
        }
        if let Err(e) = self.writer.send(&mut pdus) {
            // The initiator is gone; ending the socket ends the reader's wait too.
            debug!(error = %e, itt = jobs[0].itt, "response not sent");
            self.writer.abort();
        }
    }
}
