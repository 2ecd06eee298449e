//! Primary commands (SPC-4): INQUIRY and its VPD pages, REQUEST SENSE, MODE SENSE / SELECT,
//! REPORT SUPPORTED OPERATION CODES, REPORT TARGET PORT GROUPS, REPORT TIMESTAMP, REPORT LUNS.

use crate::bytes::{alloc, be16, be32};
use crate::commands::COMMANDS;
use crate::lun::{CmdResult, Lun, ModeState, Response};
use crate::opcodes::*;
use crate::sense::{self, Sense};

pub const VENDOR: &[u8; 8] = b"TESSERA ";
pub const PRODUCT: &[u8; 16] = b"VDISK           ";
pub const REVISION: &[u8; 4] = b"0001";

/// VPD pages we return, in order.
const VPD_PAGES: [u8; 7] = [0x00, 0x80, 0x83, 0x8F, 0xB0, 0xB1, 0xB2];

/// Largest transfer one command may ask for, in bytes.
pub const MAX_TRANSFER_BYTES: u64 = 32 << 20;
/// Most blocks one UNMAP may cover.
pub const MAX_UNMAP_BLOCKS: u64 = 1 << 20;
/// Most blocks one WRITE SAME may cover.
pub const MAX_WRITE_SAME_BLOCKS: u64 = 1 << 30;
pub const MAX_UNMAP_DESCRIPTORS: u64 = 256;
/// COMPARE AND WRITE covers at most this many blocks.
pub const MAX_COMPARE_AND_WRITE_BLOCKS: u64 = 255;

impl Lun {
    pub(crate) fn inquiry(&self, cdb: &[u8]) -> CmdResult {
        let evpd = cdb[1] & 0x01 != 0;
        let page = cdb[2];
        let len = be16(&cdb[3..5]) as usize;
        if !evpd {
            if page != 0 {
                return Err(sense::INVALID_FIELD_IN_CDB);
            }
            let mut d = vec![0u8; 66];
            d[0] = 0x00; // direct access block device, connected
            d[2] = 0x06; // SPC-4
            d[3] = 0x12; // HISUP, response data format 2
            d[4] = (d.len() - 5) as u8;
            d[5] = 0x10 | 0x08; // TPGS = implicit ALUA; 3PC: third-party copy
            d[7] = 0x02; // CMDQUE
            d[8..16].copy_from_slice(VENDOR);
            d[16..32].copy_from_slice(PRODUCT);
            d[32..36].copy_from_slice(REVISION);
            // Version descriptors: SAM-5, SPC-4, SBC-3, iSCSI.
            for (i, v) in [0x00A0u16, 0x0460, 0x04C0, 0x0960].iter().enumerate() {
                d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
            }
            d.truncate(66);
            return Ok(alloc(d, len));
        }
        let body: Vec<u8> = match page {
            0x00 => VPD_PAGES.to_vec(),
            0x80 => self.serial.as_bytes().to_vec(),
            0x83 => self.device_identification(),
            0x8F => self.third_party_copy_vpd(),
            0xB0 => self.block_limits(),
            0xB1 => {
                let mut b = vec![0u8; 0x3C];
                b[1] = 0x01; // medium rotation rate: non-rotating
                b
            }
            0xB2 => {
                let mut b = vec![0u8; 4];
                // LBPU, LBPWS, LBPWS10; LBPRZ: unmapped blocks read as zeros.
                b[1] = 0x80 | 0x40 | 0x20 | 0x04;
                b[2] = if self.thin() { 0x02 } else { 0x01 };
                b
            }
            _ => return Err(sense::INVALID_FIELD_IN_CDB),
        };
        let mut d = vec![0x00, page];
        d.extend_from_slice(&(body.len() as u16).to_be_bytes());
        d.extend_from_slice(&body);
        Ok(alloc(d, len))
    }

    fn device_identification(&self) -> Vec<u8> {
        let mut b = Vec::new();
        // NAA, binary, associated with the logical unit.
        b.extend_from_slice(&[0x01, 0x03, 0x00, 16]);
        b.extend_from_slice(&self.naa);
        // T10 vendor id, ASCII: vendor + serial.
        let t10: Vec<u8> = VENDOR.iter().copied().chain(self.serial.bytes()).collect();
        b.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
        b.extend_from_slice(&t10);
        // The relative target port and target port group this daemon serves the LUN through,
        // for iSCSI (protocol 5, PIV).
        let (group, port) = self.alua.local();
        let (group, port) = (group.to_be_bytes(), port.to_be_bytes());
        b.extend_from_slice(&[0x51, 0x94, 0x00, 4, 0, 0, port[0], port[1]]);
        b.extend_from_slice(&[0x51, 0x95, 0x00, 4, 0, 0, group[0], group[1]]);
        b
    }

    fn block_limits(&self) -> Vec<u8> {
        let bs = self.block_size();
        let mut b = vec![0u8; 0x3C];
        b[0] = 0x00; // WSNZ clear: WRITE SAME with zero blocks runs to the end of the LUN
        b[1] = MAX_COMPARE_AND_WRITE_BLOCKS as u8;
        let grain_blocks = (self.backend.grain_size() / bs) as u32;
        b[2..4].copy_from_slice(&((4096 / bs).max(1) as u16).to_be_bytes());
        b[4..8].copy_from_slice(&((MAX_TRANSFER_BYTES / bs) as u32).to_be_bytes());
        b[8..12].copy_from_slice(&grain_blocks.to_be_bytes());
        b[16..20].copy_from_slice(&(MAX_UNMAP_BLOCKS as u32).to_be_bytes());
        b[20..24].copy_from_slice(&(MAX_UNMAP_DESCRIPTORS as u32).to_be_bytes());
        // Only whole grains are freed: that is the unmap granularity.
        b[24..28].copy_from_slice(&grain_blocks.to_be_bytes());
        b[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, alignment 0
        b[32..40].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
        b
    }

    pub(crate) fn request_sense(&self, cdb: &[u8]) -> CmdResult {
        let desc = cdb[1] & 0x01 != 0;
        Ok(alloc(sense::NO_ADDITIONAL_SENSE.encode(desc), cdb[4] as usize))
    }

    /// The mode pages for page control `pc`: current (0), changeable (1), default (2) or
    /// saved (3), which are the current ones: every change is saved as it is made.
    fn mode_pages(&self, page: u8, pc: u8) -> Result<Vec<u8>, Sense> {
        let m = if pc == 2 { ModeState::default() } else { self.mode() };
        let changeable = pc == 1;
        // PS: the caching and control pages can be saved.
        let ps = if self.mode_store.is_some() { 0x80 } else { 0 };
        let caching = |out: &mut Vec<u8>| {
            let mut p = vec![0u8; 20];
            p[0] = 0x08 | ps;
            p[1] = 0x12;
            if changeable {
                p[2] = 0x04;
            } else if m.wce {
                p[2] = 0x04;
            }
            out.extend_from_slice(&p);
        };
        let control = |out: &mut Vec<u8>| {
            let mut p = vec![0u8; 12];
            p[0] = 0x0A | ps;
            p[1] = 0x0A;
            if changeable {
                p[2] = 0x04;
                p[4] = 0x08;
            } else {
                p[2] = if m.d_sense { 0x04 } else { 0 };
                p[3] = 0x10; // queue algorithm: unrestricted reordering allowed
                p[4] = if m.swp { 0x08 } else { 0 };
                p[8..10].copy_from_slice(&0xFFFFu16.to_be_bytes()); // busy timeout: unlimited
            }
            out.extend_from_slice(&p);
        };
        let informational = |out: &mut Vec<u8>| {
            let mut p = vec![0u8; 12];
            p[0] = 0x1C;
            p[1] = 0x0A;
            out.extend_from_slice(&p);
        };
        let mut out = Vec::new();
        match page {
            0x08 => caching(&mut out),
            0x0A => control(&mut out),
            0x1C => informational(&mut out),
            0x3F => {
                caching(&mut out);
                control(&mut out);
                informational(&mut out);
            }
            _ => return Err(sense::INVALID_FIELD_IN_CDB),
        }
        Ok(out)
    }

    pub(crate) fn mode_sense(&self, cdb: &[u8]) -> CmdResult {
        let ten = cdb[0] == MODE_SENSE_10;
        let dbd = cdb[1] & 0x08 != 0;
        let llbaa = ten && cdb[1] & 0x10 != 0;
        let pc = cdb[2] >> 6;
        let page = cdb[2] & 0x3F;
        let subpage = cdb[3];
        if pc == 3 && self.mode_store.is_none() {
            return Err(sense::SAVING_PARAMETERS_NOT_SUPPORTED);
        }
        if subpage != 0 && subpage != 0xFF {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        let pages = self.mode_pages(page, pc)?;
        let blocks = self.blocks();
        let bs = self.block_size();
        let mut bd = Vec::new();
        if !dbd {
            if llbaa {
                bd.extend_from_slice(&blocks.to_be_bytes());
                bd.extend_from_slice(&[0, 0, 0, 0]);
                bd.extend_from_slice(&(bs as u32).to_be_bytes());
            } else {
                bd.extend_from_slice(&(blocks.min(0xFFFF_FFFF) as u32).to_be_bytes());
                bd.push(0);
                bd.extend_from_slice(&(bs as u32).to_be_bytes()[1..]);
            }
        }
        // Device-specific parameter: WP, DPOFUA.
        let dsp = if self.write_protected() { 0x80 } else { 0 } | 0x10;
        let mut d = Vec::new();
        if ten {
            let total = 8 + bd.len() + pages.len();
            d.extend_from_slice(&((total - 2) as u16).to_be_bytes());
            d.extend_from_slice(&[0, dsp, if llbaa { 1 } else { 0 }, 0]);
            d.extend_from_slice(&(bd.len() as u16).to_be_bytes());
        } else {
            let total = 4 + bd.len() + pages.len();
            d.extend_from_slice(&[(total - 1) as u8, 0, dsp, bd.len() as u8]);
        }
        d.extend_from_slice(&bd);
        d.extend_from_slice(&pages);
        let len = if ten { be16(&cdb[7..9]) } else { cdb[4] as u64 } as usize;
        Ok(alloc(d, len))
    }

    pub(crate) fn mode_select(&self, nexus: u64, cdb: &[u8], d: &[u8]) -> CmdResult {
        // SP: save the pages. Every change is saved when the LUN can save at all.
        if cdb[1] & 0x01 != 0 && self.mode_store.is_none() {
            return Err(sense::SAVING_PARAMETERS_NOT_SUPPORTED);
        }
        let Some(next) = self.mode_selected(cdb, d)? else {
            return Ok(Vec::new());
        };
        let was = self.mode();
        // Saved before it takes effect: a setting the host was told about survives a restart.
        if let Some(store) = &self.mode_store {
            if let Err(e) = store(&next) {
                tracing::warn!(lun = %self.backend.name(), error = %e, "cannot save the mode settings");
                return Err(sense::INTERNAL_TARGET_FAILURE);
            }
        }
        self.take_mode(next, Some(nexus));
        if was.wce && !next.wce {
            // Turning the cache off makes what it held durable now: the writes that saw it
            // on (each reads the setting under this lock, shared) end first, so that the
            // flush covers them too; the writes after see it off.
            drop(self.atomic.write());
            self.backend.flush().map_err(|e| self.io_sense(e, true))?;
        }
        Ok(Vec::new())
    }

    /// The mode settings MODE SELECT `cdb` with parameter list `d` asks for, checked
    /// against what MODE SENSE reports as changeable; None when they are the settings now.
    pub(crate) fn mode_selected(&self, cdb: &[u8], d: &[u8]) -> Result<Option<ModeState>, Sense> {
        let ten = cdb[0] == MODE_SELECT_10;
        let len = if ten { be16(&cdb[7..9]) } else { cdb[4] as u64 } as usize;
        if len == 0 {
            return Ok(None);
        }
        if d.len() < len {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let d = &d[..len];
        let (hdr, bdl) = if ten {
            if d.len() < 8 {
                return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
            }
            (8, be16(&d[6..8]) as usize)
        } else {
            if d.len() < 4 {
                return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
            }
            (4, d[3] as usize)
        };
        let mut pos = hdr + bdl;
        if pos > d.len() {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let mut next = self.mode();
        while pos < d.len() {
            if pos + 2 > d.len() {
                return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
            }
            let code = d[pos] & 0x3F;
            if d[pos] & 0x40 != 0 {
                return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST); // subpage format
            }
            let plen = d[pos + 1] as usize;
            let page = d.get(pos..pos + 2 + plen).ok_or(sense::PARAMETER_LIST_LENGTH_ERROR)?;
            // The page must be what MODE SENSE returns, changing only changeable bits.
            let current = self
                .mode_pages(code, 0)
                .map_err(|_| sense::INVALID_FIELD_IN_PARAMETER_LIST)?;
            let mask = self
                .mode_pages(code, 1)
                .map_err(|_| sense::INVALID_FIELD_IN_PARAMETER_LIST)?;
            if current.len() != page.len() {
                return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
            }
            for i in 2..page.len() {
                if (page[i] ^ current[i]) & !mask[i] != 0 {
                    return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
                }
            }
            match code {
                0x08 => next.wce = page[2] & 0x04 != 0,
                0x0A => {
                    next.d_sense = page[2] & 0x04 != 0;
                    next.swp = page[4] & 0x08 != 0;
                }
                _ => {}
            }
            pos += 2 + plen;
        }
        Ok((next != self.mode()).then_some(next))
    }

    pub(crate) fn report_supported_opcodes(&self, cdb: &[u8]) -> CmdResult {
        let rctd = cdb[2] & 0x80 != 0;
        let options = cdb[2] & 0x07;
        let req_op = cdb[3];
        // A 16-bit field: one past 0xFF names no service action of ours, not its low byte's.
        let req_sa = u8::try_from(be16(&cdb[4..6])).ok();
        let len = be32(&cdb[6..10]) as usize;
        let timeouts = |d: &mut Vec<u8>| d.extend_from_slice(&[0, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mut d = Vec::new();
        match options {
            0 => {
                d.extend_from_slice(&[0, 0, 0, 0]);
                for o in COMMANDS {
                    d.push(o.op);
                    d.push(0);
                    d.extend_from_slice(&(o.sa.unwrap_or(0) as u16).to_be_bytes());
                    d.push(0);
                    d.push(if rctd { 0x02 } else { 0 } | if o.sa.is_some() { 0x01 } else { 0 });
                    d.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                    if rctd {
                        timeouts(&mut d);
                    }
                }
                let n = (d.len() - 4) as u32;
                d[0..4].copy_from_slice(&n.to_be_bytes());
            }
            1..=3 => {
                let found = COMMANDS
                    .iter()
                    .find(|o| o.op == req_op && (options == 1 || (o.sa.is_some() && o.sa == req_sa)));
                let has_sa = COMMANDS.iter().any(|o| o.op == req_op && o.sa.is_some());
                // Asking without a service action for a command that has them, or with one for a
                // command that has none, is an invalid field.
                if (options == 1 && has_sa)
                    || (options == 2 && found.is_none() && !has_sa && COMMANDS.iter().any(|o| o.op == req_op))
                {
                    // The field pointer says the reporting options, not the command, are at
                    // fault: initiators take a bare INVALID FIELD as "not implemented".
                    return Err(sense::INVALID_FIELD_IN_CDB.at_cdb_byte(2));
                }
                match found {
                    Some(o) => {
                        d.push(0);
                        d.push(if rctd { 0x80 } else { 0 } | 0x03);
                        d.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                        d.extend_from_slice(o.usage);
                        if rctd {
                            timeouts(&mut d);
                        }
                    }
                    None => d.extend_from_slice(&[0, 0x01, 0, 0]), // not supported
                }
            }
            _ => return Err(sense::INVALID_FIELD_IN_CDB),
        }
        Ok(alloc(d, len))
    }
}

impl Lun {
    /// REPORT TARGET PORT GROUPS: implicit ALUA, with the groups and states the LUN's
    /// [`PortGroups`](crate::alua::PortGroups) gives (one always active group by default).
    pub(crate) fn report_target_port_groups(&self, cdb: &[u8]) -> CmdResult {
        let extended = cdb[1] >> 5 == 1;
        let len = be32(&cdb[6..10]) as usize;
        let d = crate::alua::report(&self.alua.groups(), extended, self.alua.transition_seconds());
        Ok(alloc(d, len))
    }

    /// REPORT TIMESTAMP (SPC-4 6.34): the host's clock, in milliseconds since the Unix epoch,
    /// so an initiator can line its logs up with ours. We have no SET TIMESTAMP: the clock is
    /// set outside SCSI (origin 011b).
    pub(crate) fn report_timestamp(&self, cdb: &[u8]) -> CmdResult {
        let len = be32(&cdb[6..10]) as usize;
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut d = vec![0u8; 12];
        d[0..2].copy_from_slice(&10u16.to_be_bytes());
        d[2] = 0b011;
        d[4..10].copy_from_slice(&ms.to_be_bytes()[2..8]);
        Ok(alloc(d, len))
    }
}

/// REPORT LUNS over the LUNs the initiator may see; the transport answers it.
pub fn report_luns(cdb: &[u8], luns: &[u64]) -> Response {
    let bad = |s: Sense| Response {
        status: sense::CHECK_CONDITION,
        data: Default::default(),
        sense: s.encode(false),
    };
    if cdb.len() < 12 {
        return bad(sense::INVALID_FIELD_IN_CDB);
    }
    let select = cdb[2];
    let len = be32(&cdb[6..10]) as usize;
    if len < 16 {
        return bad(sense::INVALID_FIELD_IN_CDB);
    }
    if !matches!(select, 0x00 | 0x01 | 0x02 | 0x10 | 0x11 | 0x12) {
        return bad(sense::INVALID_FIELD_IN_CDB);
    }
    let mut sorted = luns.to_vec();
    sorted.sort_unstable();
    let mut d = vec![0u8; 8];
    if select != 0x01 {
        for l in sorted {
            d.extend_from_slice(&encode_lun(l));
        }
    }
    let n = (d.len() - 8) as u32;
    d[0..4].copy_from_slice(&n.to_be_bytes());
    Response {
        status: sense::GOOD,
        data: alloc(d, len).into(),
        sense: vec![],
    }
}

/// SAM LUN encoding: peripheral addressing below 256, flat space up to 16383.
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        b[0] = 0x40 | ((lun >> 8) & 0x3F) as u8;
        b[1] = lun as u8;
    }
    b
}

/// The LUN number in an 8-byte SAM LUN field (SAM-5 4.7), or u64::MAX, which no LUN has, for
/// a field that names none of ours: another bus, or a second level below the first.
pub fn decode_lun(b: &[u8; 8]) -> u64 {
    if b[2..].iter().any(|&x| x != 0) {
        return u64::MAX;
    }
    match b[0] >> 6 {
        0 if b[0] & 0x3F == 0 => b[1] as u64,
        1 => (((b[0] & 0x3F) as u64) << 8) | b[1] as u64,
        _ => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_fields_decode_to_their_lun_or_to_none() {
        for lun in [0, 1, 255, 256, 0x3FFF] {
            assert_eq!(decode_lun(&encode_lun(lun)), lun);
        }
        // Another bus, a second level, an address method we do not give out: no LUN of ours,
        // not the LUN their first bytes would alias.
        for field in [
            [0x01, 0, 0, 0, 0, 0, 0, 0],
            [0, 0, 0, 1, 0, 0, 0, 0],
            [0, 3, 0, 0, 0, 0, 0, 9],
            [0x40, 1, 0x40, 0, 0, 0, 0, 0],
            [0x80, 0, 0, 0, 0, 0, 0, 0],
            [0xC1, 0x01, 0, 0, 0, 0, 0, 0],
        ] {
            assert_eq!(decode_lun(&field), u64::MAX, "{field:02x?}");
        }
    }
}
