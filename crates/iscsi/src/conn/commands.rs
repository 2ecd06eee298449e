//! SCSI commands: admission in the command window, and running them on their LUN.

use super::*;

pub(super) fn internal_failure() -> Response {
    Response {
        status: sense::CHECK_CONDITION,
        data: Data::default(),
        sense: sense::INTERNAL_TARGET_FAILURE.encode(false),
    }
}

/// A LUN that does not exist: INQUIRY answers "no device here", everything else fails.
pub(super) fn no_such_lun(cdb: &[u8]) -> Response {
    if cdb[0] == 0x12 && cdb[1] & 0x01 == 0 {
        let mut d = vec![0u8; 36];
        d[0] = 0x7F;
        d[2] = 0x06;
        d[3] = 0x02;
        d[4] = 31;
        let len = u16::from_be_bytes([cdb[3], cdb[4]]) as usize;
        d.truncate(len);
        return Response {
            status: sense::GOOD,
            data: d.into(),
            sense: vec![],
        };
    }
    Response {
        status: sense::CHECK_CONDITION,
        data: Data::default(),
        sense: sense::LUN_NOT_SUPPORTED.encode(false),
    }
}

/// Why a command's R and W bits cannot go with its length, its immediate data or its CDB,
/// if they cannot (RFC 7143 11.3.1): such a command is rejected rather than run on data it did
/// not carry. (A READ with W runs and sends no data, all of it residual, as libiscsi's suite
/// expects.) `read` and `write` are the bits of a command with a length.
fn direction_fault(read: bool, write: bool, edtl: usize, immediate: usize, cdb: &[u8]) -> Option<&'static str> {
    let writes_data = matches!(io_op(cdb), IoOp::Write | IoOp::Unmap | IoOp::Zero);
    if read && write {
        Some("bidirectional commands are not supported")
    } else if edtl > 0 && !read && !write {
        Some("a transfer length with neither R nor W")
    } else if immediate > 0 && !write {
        Some("immediate data without W")
    } else if read && writes_data {
        Some("a command that sends data, with R")
    } else {
        None
    }
}

impl Session {
    /// True if a non-immediate command's CmdSN is inside [ExpCmdSN, MaxCmdSN] and was not
    /// received already (a command sent again past a gap).
    pub(super) fn in_window(&self, rs: &ReadSide, p: &Pdu) -> bool {
        p.immediate() || self.awaited(rs, p.cmd_sn())
    }

    /// A SCSI Command PDU: the command to run, or None while its data is still to come.
    pub(super) fn scsi_command(&self, rs: &mut ReadSide, p: Pdu) -> Option<Job> {
        if !self.in_window(rs, &p) {
            // RFC 7143 3.2.2.1: a command outside the window is silently ignored.
            debug!(cmd_sn = p.cmd_sn(), "command outside the CmdSN window dropped");
            return None;
        }
        let arrived = Instant::now();
        self.advance(rs, &p);
        if rs.writes.contains_key(&p.itt()) || self.running.contains(p.itt()) {
            // A tag names one task of the session (RFC 7143 11.2.1.8): a second one under it
            // would take the first's place, which then is never answered nor aborted.
            debug!(itt = p.itt(), "command with the tag of a task in progress rejected");
            self.reject(&p, 0x07);
            return None;
        }
        let Some(target) = &self.ctx.target else {
            // A discovery session carries no SCSI commands.
            self.reject(&p, 0x04);
            return None;
        };
        let flags = p.flags();
        let edtl = p.expected_data_transfer_length() as usize;
        // R and W mean nothing without a length to move (a host may send them with none).
        let (read, write) = (flags & 0x40 != 0 && edtl > 0, flags & 0x20 != 0 && edtl > 0);
        if let Some(why) = direction_fault(read, write, edtl, p.data.len(), p.cdb()) {
            debug!(itt = p.itt(), opcode = p.cdb()[0], edtl, why, "command rejected");
            self.reject(&p, 0x09);
            return None;
        }
        let cdb = p.cdb().to_vec();
        let lun_field = p.lun();
        let lun = target.lun(decode_lun(&lun_field));
        let seq = &self.writer.seq;
        seq.outstanding.fetch_add(1, Ordering::AcqRel);
        if write && edtl > p.data.len() {
            if edtl > tessera_scsi::MAX_TRANSFER_BYTES as usize + (1 << 20) {
                self.reject(&p, 0x09);
                seq.outstanding.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
            let unsolicited_end = if self.ctx.params.initial_r2t || flags & 0x80 != 0 {
                p.data.len()
            } else {
                (self.ctx.params.first_burst as usize).min(edtl).max(p.data.len())
            };
            // The buffer is paid for before it exists; without room, the command ends with
            // TASK SET FULL once its unsolicited data (which cannot be refused) has passed.
            let limits = self.ctx.reg.limits();
            let charge = Charge::take(&self.write_budget, self.ctx.reg.write_total(), edtl, &limits);
            let buf = match &charge {
                Some(_) => {
                    let mut buf = vec![0u8; edtl];
                    buf[..p.data.len()].copy_from_slice(&p.data);
                    buf
                }
                None => {
                    debug!(
                        itt = p.itt(),
                        edtl,
                        session = self.write_budget.used(),
                        "no room for a write's data: TASK SET FULL"
                    );
                    Vec::new()
                }
            };
            let mut t = WriteTask {
                arrived,
                lun_field,
                cdb,
                lun,
                buf,
                received: p.data.len(),
                unsolicited_end,
                r2t: None,
                r2t_sn: 0,
                next_offset: unsolicited_end,
                data_sn: 0,
                edtl,
                lost_data: charge.is_none().then_some(Fail::TaskSetFull),
                charge,
            };
            if t.lost_data.is_some() {
                if t.received >= t.unsolicited_end {
                    return Some(t.into_job(p.itt()));
                }
                // Its buffer is empty: nothing is solicited, unsolicited data is dropped.
                t.next_offset = edtl;
            } else if t.received >= t.unsolicited_end {
                self.next_r2t(rs, p.itt(), &mut t);
            }
            rs.writes.insert(p.itt(), t);
            return None;
        }
        let itt = p.itt();
        let mut data_out = p.data;
        data_out.truncate(edtl);
        Some(Job {
            itt,
            arrived,
            lun_field,
            lun,
            cdb,
            data_out,
            edtl,
            read,
            fail: None,
            _charge: None,
        })
    }

    /// Runs the commands and sends their data and status, all in one write.
    pub(super) fn run_jobs(&self, jobs: Vec<Job>) {
        let resps = self.execute(&jobs);
        self.respond(&jobs, &resps);
    }

    /// Each command's response. Consecutive commands for one LUN go to it as one batch.
    pub(super) fn execute(&self, jobs: &[Job]) -> Vec<Response> {
        let mut out = Vec::with_capacity(jobs.len());
        let mut rest = jobs;
        while let Some(first) = rest.first() {
            // Commands the LUN itself runs, on the same LUN as the first.
            let same = |j: &Job| {
                j.fail.is_none()
                    && j.cdb[0] != REPORT_LUNS
                    && matches!((&first.lun, &j.lun), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
            };
            let n = rest.iter().take_while(|j| same(j)).count().max(1);
            let (group, tail) = rest.split_at(n);
            rest = tail;
            match (&first.lun, n) {
                (Some(l), 2..) => {
                    let cmds: Vec<(&[u8], &[u8])> = group.iter().map(|j| (&j.cdb[..], &j.data_out[..])).collect();
                    // A bug in one command fails those it ran with, not the session.
                    match catch_unwind(AssertUnwindSafe(|| l.execute_many_for(&self.ctx.nexus, &cmds))) {
                        Ok(r) => out.extend(r),
                        Err(_) => {
                            warn!(opcode = first.cdb[0], "command batch panicked");
                            out.extend(group.iter().map(|_| internal_failure()));
                        }
                    }
                }
                _ => out.push(self.execute_one(first)),
            }
        }
        out
    }

    pub(super) fn execute_one(&self, job: &Job) -> Response {
        if let Some(Fail::TaskSetFull) = job.fail {
            return Response {
                status: sense::TASK_SET_FULL,
                data: Data::default(),
                sense: Vec::new(),
            };
        }
        if let Some(Fail::Sense(sense)) = job.fail {
            return Response {
                status: sense::CHECK_CONDITION,
                data: Data::default(),
                sense: match &job.lun {
                    Some(l) => l.sense_bytes(sense),
                    None => sense.encode(false),
                },
            };
        }
        if job.cdb[0] == REPORT_LUNS {
            let numbers = self.ctx.target.as_ref().map(|t| t.lun_numbers()).unwrap_or_default();
            return report_luns(&job.cdb, &numbers);
        }
        match &job.lun {
            // A bug in one command fails that command, not the session.
            Some(l) => catch_unwind(AssertUnwindSafe(|| {
                l.execute_for(&self.ctx.nexus, &job.cdb, &job.data_out)
            }))
            .unwrap_or_else(|_| {
                warn!(opcode = job.cdb[0], "command panicked");
                internal_failure()
            }),
            None => no_such_lun(&job.cdb),
        }
    }
}
