//! What the read side answers itself: rejects, text (SendTargets), task management.

use super::*;

impl Session {
    pub(super) fn reject(&self, p: &Pdu, reason: u8) {
        debug!(opcode = p.opcode(), reason, "reject");
        let mut r = Pdu::new(op::REJECT);
        r.bhs[1] = 0x80;
        r.bhs[2] = reason;
        put32(&mut r.bhs, at::ITT, NO_TAG);
        r.data = p.bhs.to_vec();
        self.writer.send_pdu(&r, true);
    }

    /// Notes a non-immediate command received, and moves ExpCmdSN past it and past those
    /// received after it across a gap it fills. Without that, a session whose initiator sent
    /// a command again after a digest error (RFC 7143 7.8) kept ExpCmdSN there: its window
    /// shrank with every command until none was let in. Only the reader calls this, so a
    /// load then a store is enough.
    pub(super) fn advance(&self, rs: &mut ReadSide, p: &Pdu) {
        if !p.immediate() {
            self.received(rs, p.cmd_sn());
        }
    }

    /// Counts CmdSN `sn` as received ([`advance`](Self::advance)). Its callers have found
    /// it [`awaited`](Self::awaited), inside the window.
    fn received(&self, rs: &mut ReadSide, sn: u32) {
        let seq = &self.writer.seq;
        let exp = seq.exp_cmd_sn.load(Ordering::Acquire);
        let ahead = sn.wrapping_sub(exp);
        if ahead >= u128::BITS {
            return; // not in any window: the window is at most CMD_WINDOW long
        }
        rs.cmd_sn_ahead |= 1 << ahead;
        let filled = rs.cmd_sn_ahead.trailing_ones();
        if filled > 0 {
            rs.cmd_sn_ahead = rs.cmd_sn_ahead.checked_shr(filled).unwrap_or(0);
            seq.exp_cmd_sn.store(exp.wrapping_add(filled), Ordering::Release);
        }
    }

    /// Whether CmdSN `sn` is inside [ExpCmdSN, MaxCmdSN] and was not received yet.
    pub(super) fn awaited(&self, rs: &ReadSide, sn: u32) -> bool {
        let seq = &self.writer.seq;
        let exp = seq.exp_cmd_sn.load(Ordering::Acquire);
        let ahead = sn.wrapping_sub(exp);
        ahead <= seq.max_cmd_sn().wrapping_sub(exp) && rs.cmd_sn_ahead.checked_shr(ahead).unwrap_or(0) & 1 == 0
    }

    /// Whether the RefCmdSN of ABORT TASK `p` is awaited, and before `p`'s own CmdSN.
    fn never_received(&self, rs: &ReadSide, p: &Pdu) -> bool {
        let referenced = get32(&p.bhs, 32);
        let before = (1..1 << 31).contains(&p.cmd_sn().wrapping_sub(referenced));
        before && self.awaited(rs, referenced)
    }

    pub(super) fn text(&self, p: Pdu) {
        let keys = text::parse(&p.data).unwrap_or_default();
        let mut out: Vec<(String, String)> = Vec::new();
        let ctx = &self.ctx;
        for (k, v) in keys {
            if k == "SendTargets" {
                let targets: Vec<Arc<Target>> = match v.as_str() {
                    "All" if ctx.target.is_none() => ctx.reg.targets(),
                    "" | "All" => ctx.target.iter().cloned().collect(),
                    name => ctx.reg.target(name).into_iter().collect(),
                };
                // A target the initiator may not log in to is not revealed either.
                let visible = |t: &Arc<Target>| t.access().visible_to(&ctx.initiator, ctx.authenticated.as_ref());
                let addresses = crate::portal::target_addresses(&ctx.reg.portals(), ctx.local);
                for t in targets.iter().filter(|t| visible(t)) {
                    out.push(("TargetName".into(), t.iqn.clone()));
                    for a in &addresses {
                        out.push(("TargetAddress".into(), a.clone()));
                    }
                }
            } else {
                out.push((k, "NotUnderstood".into()));
            }
        }
        let mut r = Pdu::new(op::TEXT_RESP);
        r.bhs[1] = 0x80;
        put32(&mut r.bhs, at::ITT, p.itt());
        put32(&mut r.bhs, at::TTT, NO_TAG);
        r.data = text::encode(&out);
        self.writer.send_pdu(&r, true);
    }

    /// Runs a task management function. Its answer waits until the commands it aborted have
    /// ended (running.rs), on a thread of its own so that this reader goes on: it reaps the
    /// reads on its ring, which those commands may be.
    pub(super) fn task_management(&self, rs: &mut ReadSide, p: Pdu) {
        let function = p.flags() & 0x7F;
        let lun = decode_lun(&p.lun());
        let luns: Vec<Arc<Lun>> = match (&self.ctx.target, function) {
            (Some(t), 5) => t.lun(lun).into_iter().collect(),
            (Some(t), 6 | 7) => t.lun_numbers().into_iter().filter_map(|n| t.lun(n)).collect(),
            _ => Vec::new(),
        };
        let (response, aborted) = match function {
            // ABORT TASK: a write still waiting for data is dropped; a running command is
            // aborted. A task already answered does not exist: its answer stands. One never
            // received (lost to a digest error) whose CmdSN is in the window, before this
            // request's, is counted as received, which closes the gap it left (RFC 7143
            // 11.6.1), and the function is complete.
            1 => {
                let tag = p.ttt();
                let waiting = rs.writes.len();
                self.drop_writes(rs, |itt, _| itt == tag);
                let dropped = rs.writes.len() < waiting;
                let running = self.running.abort(|itt, _| itt == tag);
                let response = if dropped || !running.is_empty() {
                    0
                } else if self.never_received(rs, &p) {
                    self.received(rs, get32(&p.bhs, 32));
                    0
                } else {
                    1
                };
                (response, running)
            }
            // ABORT TASK SET, CLEAR TASK SET: this session's commands to the logical unit.
            // (CLEAR TASK SET's commands of other sessions run on and are answered.)
            2 | 4 => {
                self.drop_writes(rs, |_, t| decode_lun(&t.lun_field) == lun);
                (0, self.running.abort(|_, l| l == lun))
            }
            // LUN RESET, TARGET WARM and COLD RESET: this session's commands to the logical
            // unit (or to any, for a target reset) are aborted, and the other nexuses get a
            // unit attention; their commands run on and are answered, but the function is
            // answered only once they have ended (below).
            5 | 6 | 7 => {
                self.drop_writes(rs, |_, t| function != 5 || decode_lun(&t.lun_field) == lun);
                for l in &luns {
                    l.reset(self.ctx.nexus.id);
                }
                (0, self.running.abort(|_, l| function != 5 || l == lun))
            }
            _ => (5, Vec::new()), // not supported
        };
        let answer_with = |response: u8| {
            let mut r = Pdu::new(op::TASK_MGMT_RESP);
            r.bhs[1] = 0x80;
            r.bhs[2] = response;
            put32(&mut r.bhs, at::ITT, p.itt());
            r
        };
        let r = answer_with(response);
        // A reset also waits for the commands other nexuses have running on its units.
        let reset: Vec<Arc<Lun>> = if matches!(function, 5..=7) { luns } else { Vec::new() };
        if aborted.is_empty() && reset.is_empty() {
            self.writer.send_pdu(&r, true);
            return;
        }
        let (running, writer, tags) = (self.running.clone(), self.writer.clone(), aborted.clone());
        let answer = std::thread::Builder::new().name("iscsi-tmf".into()).spawn(move || {
            running.wait_ended(&tags);
            for l in &reset {
                l.wait_for_commands();
            }
            writer.send_pdu(&r, true);
        });
        if let Err(e) = answer {
            // No thread to wait on: the function is rejected (the host goes on to a stronger
            // one) and the commands are answered as if it never came, rather than the
            // function answered before they ended.
            warn!(error = %e, "cannot start a thread to answer a task management function");
            self.running.unabort(&aborted);
            self.writer.send_pdu(&answer_with(255), true);
        }
    }
}
