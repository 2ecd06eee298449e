//! Write data: unsolicited data, R2T and Data-Out, until a write's buffer is whole.

use super::*;

impl Session {
    /// Drops the writes still waiting for data that `which` picks by tag and task; they are no
    /// longer outstanding.
    pub(super) fn drop_writes(&self, rs: &mut ReadSide, which: impl Fn(u32, &WriteTask) -> bool) {
        let before = rs.writes.len();
        rs.writes.retain(|&itt, t| !which(itt, t));
        let dropped = (before - rs.writes.len()) as u32;
        self.writer.seq.outstanding.fetch_sub(dropped, Ordering::AcqRel);
    }

    /// Sends the next R2T of a write, if data remains to be asked for.
    pub(super) fn next_r2t(&self, rs: &mut ReadSide, itt: u32, t: &mut WriteTask) {
        if t.r2t.is_some() || t.next_offset >= t.buf.len() {
            return;
        }
        let len = (t.buf.len() - t.next_offset).min(self.ctx.params.max_burst as usize);
        let ttt = rs.next_ttt;
        rs.next_ttt = rs.next_ttt.wrapping_add(1).max(1);
        let mut r = Pdu::new(op::R2T);
        r.bhs[1] = 0x80;
        r.bhs[8..16].copy_from_slice(&t.lun_field);
        put32(&mut r.bhs, at::ITT, itt);
        put32(&mut r.bhs, at::TTT, ttt);
        put32(&mut r.bhs, at::DATA_SN, t.r2t_sn);
        put32(&mut r.bhs, at::BUFFER_OFFSET, t.next_offset as u32);
        put32(&mut r.bhs, at::DESIRED_LENGTH, len as u32);
        t.r2t = Some((ttt, t.next_offset, len));
        t.r2t_sn += 1;
        t.data_sn = 0;
        t.next_offset += len;
        self.writer.send_pdu(&r, false);
    }

    /// A Data-Out PDU: the write it completes, if it does; Err for a protocol error that ends
    /// the connection. `intact` is false when its data digest was wrong.
    pub(super) fn data_out(&self, rs: &mut ReadSide, p: Pdu, intact: bool) -> Result<Option<Job>, String> {
        let itt = p.itt();
        let Some(mut t) = rs.writes.remove(&itt) else {
            // Data for a task we do not have (aborted, or failed for lost data): drop it.
            debug!(itt, "Data-Out for an unknown task");
            return Ok(None);
        };
        let offset = p.buffer_offset() as usize;
        let end = offset + p.data.len();
        let in_window = match t.r2t {
            Some((ttt, o, l)) if p.ttt() == ttt => offset >= o && end <= o + l,
            _ => p.ttt() == NO_TAG && end <= t.unsolicited_end,
        };
        if !in_window || end > t.edtl {
            warn!(itt, offset, len = p.data.len(), "Data-Out outside what was asked for");
            self.writer.seq.outstanding.fetch_sub(1, Ordering::AcqRel);
            self.reject(&p, 0x09);
            return Err("protocol error: Data-Out outside the solicited range".into());
        }
        // A wrong DataSN means a PDU went missing, an implied digest error (RFC 7143 7.9).
        // At ErrorRecoveryLevel 0 the data cannot be asked for again: the task ends with
        // PROTOCOL SERVICE CRC ERROR once the initiator has sent the rest of the sequence
        // (7.8), and the connection goes on.
        if t.lost_data.is_none() && (!intact || p.data_sn() != t.data_sn) {
            warn!(
                itt,
                data_sn = p.data_sn(),
                expected = t.data_sn,
                intact,
                "Data-Out lost: the command will fail"
            );
            t.lost_data = Some(Fail::Sense(sense::PROTOCOL_SERVICE_CRC_ERROR));
        }
        // Data comes in order (DataPDUInOrder and DataSequenceInOrder are Yes), so what has
        // arrived is the buffer's first `received` bytes and the next PDU starts there. One
        // elsewhere (sent again, or skipping ahead) would leave zeros counted as data.
        if t.lost_data.is_none() && offset != t.received {
            warn!(
                itt,
                offset,
                expected = t.received,
                "Data-Out out of order: the command will fail"
            );
            t.lost_data = Some(Fail::Sense(sense::DATA_OFFSET_ERROR));
        }
        t.data_sn = t.data_sn.wrapping_add(1);
        if p.final_bit() {
            if let Some((ttt, _, _)) = t.r2t {
                if p.ttt() == ttt {
                    t.r2t = None;
                }
            }
        }
        if t.lost_data.is_some() {
            t.received += p.data.len();
            // The end of the sequence, or of the unsolicited data of a write refused for
            // want of room (no R2T follows for it).
            let done = p.final_bit()
                && (matches!(t.lost_data, Some(Fail::Sense(_))) || t.r2t.is_none() && end >= t.unsolicited_end);
            if !done {
                rs.writes.insert(itt, t);
                return Ok(None);
            }
            return Ok(Some(t.into_job(itt)));
        }
        t.buf[offset..end].copy_from_slice(&p.data);
        t.received += p.data.len();
        if t.received >= t.buf.len() {
            return Ok(Some(t.into_job(itt)));
        }
        if p.final_bit() {
            if p.ttt() == NO_TAG {
                // The unsolicited data ended, perhaps short of FirstBurstLength: the rest is
                // asked for from where it stopped.
                t.next_offset = t.received;
            }
            self.next_r2t(rs, itt, &mut t);
        }
        rs.writes.insert(itt, t);
        Ok(None)
    }
}
