//! The read side: receiving PDUs without blocking, READs on the ring, batching, and handing
//! the read side to a successor before running a command.

use super::*;

/// Sleeps until the socket has bytes or a read on the ring completes, NOP_TICK at most (for
/// the keepalive).
pub(super) fn wait(rs: &ReadSide) {
    let ring = rs.ring.as_ref().filter(|r| r.in_flight() > 0);
    let mut fds = [
        libc::pollfd {
            fd: rs.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            // A negative descriptor is skipped.
            fd: ring.map_or(-1, |r| r.fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let tick = NOP_TICK.as_millis() as libc::c_int;
    // SAFETY: fds is a valid array of pollfd for the duration of the call. An error (EINTR)
    // just ends the wait early: the caller looks again.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, tick) };
}

impl Session {
    /// Receives PDUs and handles those that need no LUN, and starts READs on the ring and
    /// answers them as their reads complete, until a command is ready to run on this thread
    /// or the connection ends; Err says why it ended abnormally. A READ that runs here comes
    /// with the READs already received behind it (MAX_BATCH), when they do too.
    pub(super) fn next_jobs(self: &Arc<Self>, rs: &mut ReadSide) -> Result<Next, String> {
        let mut batch: Vec<Job> = Vec::new();
        let mut done = Vec::new();
        loop {
            let mut progress = false;
            if let Some(ring) = rs.ring.as_mut() {
                if ring.reap(&mut done) {
                    progress = true;
                    rs.ring_bytes -= read_bytes(&done);
                    batch.extend(self.answer_ring(&mut done));
                }
            }
            if !batch.is_empty() && !self.batch_grows(rs, &batch) {
                break;
            }
            if let Some(pdu) = rs.inbox.next_pdu() {
                match self.take(rs, pdu)? {
                    Some(Next::Run(jobs)) => {
                        for job in jobs {
                            self.running.start(job.itt, decode_lun(&job.lun_field));
                            if let Some(job) = self.start_on_ring(rs, job) {
                                batch.push(job);
                            }
                        }
                    }
                    Some(Next::Stop) => {
                        // The commands on the ring are answered before the logout is (serve
                        // answers it once every command has): their I/O completes anyway, and
                        // the initiator is owed their status. Those that must run again the
                        // ordinary way run here, where no plan is held any more.
                        self.drain(rs, &mut batch);
                        if !batch.is_empty() {
                            self.run_jobs(std::mem::take(&mut batch));
                        }
                        return Ok(Next::Stop);
                    }
                    None => {}
                }
                continue;
            }
            if let Some(ring) = rs.ring.as_mut() {
                progress |= ring.submit();
            }
            if !batch.is_empty() {
                break;
            }
            match rs.inbox.receive(&rs.sock) {
                Ok(0) => return Err("connection closed".into()),
                Ok(_) => {
                    rs.last_heard = Instant::now();
                    rs.pinged = None;
                    progress = true;
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(e.to_string()),
            }
            if !progress {
                self.keepalive(rs)?;
                wait(rs);
            }
        }
        if let Some(ring) = rs.ring.as_mut() {
            ring.submit();
        }
        if !self.successor() {
            // Nobody would reap the reads in flight while this thread runs its commands,
            // which may wait for the grains those reads hold.
            self.drain(rs, &mut batch);
        }
        Ok(Next::Run(batch))
    }

    /// Whether the batch of commands to run here should take the next PDU too: a READ
    /// already received behind READs, within the batch's bounds.
    pub(super) fn batch_grows(&self, rs: &ReadSide, batch: &[Job]) -> bool {
        let p = &self.ctx.params;
        if batch.len() >= MAX_BATCH || !batch.iter().all(|j| is_read(j.cdb[0])) {
            return false;
        }
        let buf = rs.inbox.available();
        match wire_len(buf, p.header_digest, p.data_digest) {
            Some(n) if n <= buf.len() && buf[0] & 0x3F == op::SCSI_CMD && is_read(buf[32]) => {
                // The next READ's buffer, counted at the largest block size until its LUN
                // is known.
                let edtl = u32::from_be_bytes([buf[20], buf[21], buf[22], buf[23]]) as usize;
                let asked = transfer_length(&buf[32..48], 4096).unwrap_or(0).min(MAX_TRANSFER_BYTES);
                batch.iter().map(Job::read_bytes).sum::<usize>() + edtl.max(asked as usize) <= MAX_BATCH_BYTES
            }
            _ => false,
        }
    }

    /// Starts a command's disk I/O on the ring if it is a READ or a WRITE the LUN can plan,
    /// or answers it if it needs none; the command back if it must run the ordinary way.
    pub(super) fn start_on_ring(&self, rs: &mut ReadSide, job: Job) -> Option<Job> {
        let Some(ring) = rs.ring.as_mut() else {
            return Some(job);
        };
        if let Some(lun) = job.lun.as_ref().filter(|_| !job.read && job.fail.is_none()) {
            let start = catch_unwind(AssertUnwindSafe(|| {
                lun.start_write(&self.ctx.nexus, &job.cdb, &job.data_out)
            }))
            .unwrap_or_else(|_| {
                warn!(opcode = job.cdb[0], "command panicked");
                WriteStart::Execute
            });
            return match start {
                WriteStart::Execute => Some(job),
                WriteStart::Planned(write) => {
                    let writes = write.submissions(&job.data_out);
                    // SAFETY: the writes read the job's data, which travels with it in the
                    // ring, unchanged, until they have completed.
                    unsafe { ring.start_writes((job, OnRing::Write(write)), &writes) };
                    None
                }
            };
        }
        let lun = match &job.lun {
            Some(l) if job.read && job.fail.is_none() && is_read(job.cdb[0]) => l,
            _ => return Some(job),
        };
        // Past this much read data in flight the READ runs on this thread, which stops
        // receiving meanwhile: a client that queues huge READs (immediate ones skip the
        // CmdSN window) is slowed down, and the buffers stay bounded.
        if rs.ring_bytes + job.read_bytes() > MAX_RING_BYTES {
            return Some(job);
        }
        // A bug in one command fails that command, not the session.
        let start = catch_unwind(AssertUnwindSafe(|| lun.start_read(&self.ctx.nexus, &job.cdb))).unwrap_or_else(|_| {
            warn!(opcode = job.cdb[0], "command panicked");
            ReadStart::Answer(internal_failure())
        });
        match start {
            ReadStart::Execute => Some(job),
            ReadStart::Answer(resp) => {
                self.respond(&[job], &[resp]);
                None
            }
            ReadStart::Planned(mut read) => {
                let reads = read.submissions();
                // SAFETY: the reads fill the PlannedRead's own buffer, which travels with it
                // in the ring until they have completed.
                rs.ring_bytes += job.read_bytes();
                unsafe { ring.start((job, OnRing::Read(read)), &reads) };
                None
            }
        }
    }

    /// Answers the commands whose disk I/O has completed; those with a read that failed or
    /// came back short are returned, to run the ordinary way, which reads around a failing
    /// member and repairs it, and so are those with a write that failed (nothing was
    /// answered: the ordinary way writes them again, and reports why they fail if they do).
    pub(super) fn answer_ring(&self, done: &mut Vec<((Job, OnRing), bool)>) -> Vec<Job> {
        let mut jobs = Vec::with_capacity(done.len());
        let mut resps = Vec::with_capacity(done.len());
        let mut failed = Vec::new();
        for ((job, on), ok) in done.drain(..) {
            let mut read = match on {
                OnRing::Read(read) => read,
                OnRing::Write(write) if ok => {
                    resps.push(write.into_response());
                    jobs.push(job);
                    continue;
                }
                OnRing::Write(write) => {
                    debug!(itt = job.itt, "a write on the ring failed; write again");
                    drop(write);
                    failed.push(job);
                    continue;
                }
            };
            if ok && read.verified() {
                resps.push(read.into_response());
                jobs.push(job);
            } else {
                debug!(
                    itt = job.itt,
                    "a read on the ring failed or did not match its checksums; read again"
                );
                drop(read);
                failed.push(job);
            }
        }
        if !jobs.is_empty() {
            self.respond(&jobs, &resps);
        }
        failed
    }

    /// Waits for every READ on the ring, answering them.
    pub(super) fn drain(&self, rs: &mut ReadSide, batch: &mut Vec<Job>) {
        let Some(ring) = rs.ring.as_mut() else { return };
        let mut done = Vec::new();
        while ring.in_flight() > 0 {
            ring.reap_or_wait(&mut done);
            rs.ring_bytes -= read_bytes(&done);
            batch.extend(self.answer_ring(&mut done));
        }
    }

    /// Makes sure a thread will take the read side once this one leaves it to run commands:
    /// one waiting for it already, or a new one. False when neither can be had.
    pub(super) fn successor(self: &Arc<Self>) -> bool {
        if self.idle.load(Ordering::Acquire) > 0 {
            return true;
        }
        if self.threads.load(Ordering::Acquire) >= MAX_THREADS {
            return false;
        }
        self.threads.fetch_add(1, Ordering::AcqRel);
        let c = self.clone();
        match std::thread::Builder::new()
            .name("iscsi-conn".into())
            .spawn(move || serve_thread(&c))
        {
            Ok(h) => {
                self.handles.lock().push(h);
                true
            }
            Err(e) => {
                self.threads.fetch_sub(1, Ordering::AcqRel);
                warn!(error = %e, "cannot start another iSCSI thread; the session goes on with fewer");
                false
            }
        }
    }

    /// After NOP_INTERVAL without a byte from the initiator, sends it a NOP-In; Err if
    /// nothing came NOP_TIMEOUT after that.
    pub(super) fn keepalive(&self, rs: &mut ReadSide) -> Result<(), String> {
        match rs.pinged {
            Some(t) if t.elapsed() >= NOP_TIMEOUT => Err("no answer to NOP-In".into()),
            Some(_) => Ok(()),
            None if rs.last_heard.elapsed() >= NOP_INTERVAL => {
                let mut p = Pdu::new(op::NOP_IN);
                p.bhs[1] = 0x80;
                put32(&mut p.bhs, at::ITT, NO_TAG);
                put32(&mut p.bhs, at::TTT, 0x7FFF_FFFF);
                self.writer.send_pdu(&p, false);
                rs.pinged = Some(Instant::now());
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Handles a PDU as read (or its read error): Some when it completes a command to run or
    /// ends the session, Err when the connection must end.
    pub(super) fn take(&self, rs: &mut ReadSide, pdu: Result<Pdu, PduError>) -> Result<Option<Next>, String> {
        match pdu {
            Ok(p) => self.handle(rs, p),
            Err(PduError::DataDigest { bhs }) => {
                // The header is sound: reject the PDU and carry on (RFC 7143 7.8). A
                // Data-Out's write then fails, as for a missing PDU.
                let mut rej = Pdu::new(op::REJECT);
                rej.bhs[1] = 0x80;
                rej.bhs[2] = 0x02;
                put32(&mut rej.bhs, at::ITT, NO_TAG);
                rej.data = bhs.to_vec();
                self.writer.send_pdu(&rej, true);
                let mut lost = Pdu::new(op::DATA_OUT);
                lost.bhs = *bhs;
                if lost.opcode() == op::DATA_OUT {
                    lost.data = vec![0; data_segment_length(&lost.bhs)];
                    return Ok(self.data_out(rs, lost, false)?.map(|job| Next::Run(vec![job])));
                }
                Ok(None)
            }
            Err(PduError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err("connection closed".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Handles one PDU: Some when it completes a command to run, or ends the session.
    pub(super) fn handle(&self, rs: &mut ReadSide, p: Pdu) -> Result<Option<Next>, String> {
        let numbered = matches!(
            p.opcode(),
            op::NOP_OUT | op::TEXT_REQ | op::TASK_MGMT_REQ | op::LOGOUT_REQ
        );
        if numbered && !p.immediate() && !self.awaited(rs, p.cmd_sn()) {
            // RFC 7143 3.2.2.1: outside the window, or received already, it is ignored.
            debug!(
                opcode = p.opcode(),
                cmd_sn = p.cmd_sn(),
                "request outside the CmdSN window dropped"
            );
            return Ok(None);
        }
        match p.opcode() {
            op::SCSI_CMD => return Ok(self.scsi_command(rs, p).map(|job| Next::Run(vec![job]))),
            op::DATA_OUT => return Ok(self.data_out(rs, p, true)?.map(|job| Next::Run(vec![job]))),
            op::NOP_OUT => {
                self.advance(rs, &p);
                if p.itt() != NO_TAG {
                    let mut r = Pdu::new(op::NOP_IN);
                    r.bhs[1] = 0x80;
                    r.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
                    put32(&mut r.bhs, at::ITT, p.itt());
                    put32(&mut r.bhs, at::TTT, NO_TAG);
                    r.data = p.data;
                    self.writer.send_pdu(&r, true);
                }
            }
            op::TEXT_REQ => {
                self.advance(rs, &p);
                self.text(p);
            }
            op::TASK_MGMT_REQ => {
                self.advance(rs, &p);
                self.task_management(rs, p);
            }
            op::LOGOUT_REQ => {
                self.advance(rs, &p);
                let reason = p.flags() & 0x7F;
                let mut r = Pdu::new(op::LOGOUT_RESP);
                r.bhs[1] = 0x80;
                // Removing a connection for recovery needs ErrorRecoveryLevel 2.
                r.bhs[2] = if reason == 2 { 2 } else { 0 };
                put32(&mut r.bhs, at::ITT, p.itt());
                let p = &self.ctx.params;
                r.bhs[40..42].copy_from_slice(&(p.default_time2wait as u16).to_be_bytes());
                r.bhs[42..44].copy_from_slice(&(p.default_time2retain as u16).to_be_bytes());
                // Answered once the session's commands have finished and its reservations and
                // other I_T nexus state are released (serve), so an initiator that logs in
                // again on hearing it finds them gone.
                *self.logout.lock() = Some(r);
                return Ok(Some(Next::Stop));
            }
            _ => self.reject(&p, 0x05),
        }
        Ok(None)
    }
}
