//! A logical unit: a vdisk with the SCSI state that belongs to it (mode page settings, the lock
//! that makes COMPARE AND WRITE atomic), and the command dispatch.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tessera_volume::{Provisioning, Vdisk, VolumeError};
use tracing::warn;

use crate::opcodes::*;
use crate::sense::{self, Sense};

/// What a command returns: data for the initiator, or a CHECK CONDITION with sense.
pub type CmdResult = Result<Vec<u8>, Sense>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u8,
    pub data: Vec<u8>,
    pub sense: Vec<u8>,
}

/// Settings an initiator may change with MODE SELECT. They live as long as the LUN is exported.
#[derive(Debug, Clone, Copy)]
pub struct ModeState {
    /// Write cache enabled: a write is durable only after SYNCHRONIZE CACHE or with FUA. With it
    /// off, every write is made durable before it completes.
    pub wce: bool,
    /// Descriptor-format sense.
    pub d_sense: bool,
    /// Software write protect.
    pub swp: bool,
}

pub struct Lun {
    pub(crate) vdisk: Arc<Vdisk>,
    /// 16-byte NAA IEEE Registered Extended identifier, stable for the vdisk.
    pub(crate) naa: [u8; 16],
    pub(crate) serial: String,
    pub(crate) read_only: bool,
    pub(crate) mode: Mutex<ModeState>,
    /// Writes hold it shared; COMPARE AND WRITE holds it exclusively, so that no write to the
    /// LUN lands between its compare and its write.
    pub(crate) atomic: RwLock<()>,
    /// Unit attentions waiting for each I_T nexus that has used the LUN.
    ua: Mutex<HashMap<u64, VecDeque<Sense>>>,
}

/// Unit attentions kept per nexus, at most; older ones give way.
const MAX_PENDING_UA: usize = 8;

/// The IEEE company id in the NAA identifier: a locally administered value.
const NAA_OUI: u32 = 0x00_1405;

impl Lun {
    /// `uid` distinguishes vdisks across pools (a pool id with the vdisk id, say).
    pub fn new(vdisk: Arc<Vdisk>, uid: u128, read_only: bool) -> Lun {
        let mut naa = [0u8; 16];
        // NAA 6: 4-bit NAA, 24-bit OUI, 36-bit vendor specific + 64-bit extension.
        let v = uid.to_be_bytes();
        naa[0] = 0x60 | ((NAA_OUI >> 20) & 0x0F) as u8;
        naa[1] = (NAA_OUI >> 12) as u8;
        naa[2] = (NAA_OUI >> 4) as u8;
        naa[3] = ((NAA_OUI & 0x0F) << 4) as u8 | (v[4] & 0x0F);
        naa[4..16].copy_from_slice(&v[4..16]);
        let serial: String = v[8..16].iter().map(|b| format!("{b:02x}")).collect();
        Lun {
            vdisk,
            naa,
            serial,
            read_only,
            mode: Mutex::new(ModeState {
                wce: true,
                d_sense: false,
                swp: false,
            }),
            atomic: RwLock::new(()),
            ua: Mutex::new(HashMap::new()),
        }
    }

    pub fn vdisk(&self) -> &Arc<Vdisk> {
        &self.vdisk
    }

    pub fn block_size(&self) -> u64 {
        self.vdisk.block_size() as u64
    }

    pub fn blocks(&self) -> u64 {
        self.vdisk.size() / self.block_size()
    }

    pub fn thin(&self) -> bool {
        self.vdisk.config().provisioning == Provisioning::Thin
    }

    pub fn mode(&self) -> ModeState {
        *self.mode.lock()
    }

    pub fn write_protected(&self) -> bool {
        self.read_only || self.mode.lock().swp
    }

    /// Encodes sense in the format the control mode page selects.
    pub fn sense_bytes(&self, s: Sense) -> Vec<u8> {
        s.encode(self.mode.lock().d_sense)
    }

    /// Runs one command for an anonymous nexus (0). Blocking: it does the vdisk I/O.
    pub fn execute(&self, cdb: &[u8], data_out: &[u8]) -> Response {
        self.execute_for(0, cdb, data_out)
    }

    /// Runs one command for the I_T nexus `nexus` (an iSCSI session, say). A pending unit
    /// attention for that nexus is reported first, except to INQUIRY and REPORT LUNS; REQUEST
    /// SENSE returns it as its data.
    pub fn execute_for(&self, nexus: u64, cdb: &[u8], data_out: &[u8]) -> Response {
        let op = cdb.first().copied().unwrap_or(0xFF);
        {
            let mut ua = self.ua.lock();
            let q = ua.entry(nexus).or_default();
            if !q.is_empty() && op != INQUIRY && op != REPORT_LUNS {
                let s = q.pop_front().expect("not empty");
                if op == REQUEST_SENSE && cdb.len() >= 6 {
                    let mut d = s.encode(cdb[1] & 0x01 != 0);
                    d.truncate(cdb[4] as usize);
                    return Response {
                        status: sense::GOOD,
                        data: d,
                        sense: Vec::new(),
                    };
                }
                return Response {
                    status: sense::CHECK_CONDITION,
                    data: Vec::new(),
                    sense: self.sense_bytes(s),
                };
            }
        }
        match self.dispatch(nexus, cdb, data_out) {
            Ok(data) => Response {
                status: sense::GOOD,
                data,
                sense: Vec::new(),
            },
            Err(s) => Response {
                status: sense::CHECK_CONDITION,
                data: Vec::new(),
                sense: self.sense_bytes(s),
            },
        }
    }

    /// Queues a unit attention for every nexus that has used the LUN, but `except`.
    pub fn unit_attention(&self, s: Sense, except: Option<u64>) {
        for (n, q) in self.ua.lock().iter_mut() {
            if Some(*n) != except {
                if q.len() >= MAX_PENDING_UA {
                    q.pop_front();
                }
                q.push_back(s);
            }
        }
    }

    /// LUN RESET (or a target reset) asked by `from`: every nexus learns of it, the one that
    /// asked included (as libiscsi's multipath test expects of every path).
    pub fn reset(&self, from: u64) {
        let _ = from;
        self.unit_attention(sense::BUS_DEVICE_RESET_OCCURRED, None);
    }

    /// The vdisk grew: every nexus learns of it.
    pub fn capacity_changed(&self) {
        self.unit_attention(sense::CAPACITY_DATA_CHANGED, None);
    }

    /// A nexus went away (its session ended): nothing more is kept for it.
    pub fn forget_nexus(&self, nexus: u64) {
        self.ua.lock().remove(&nexus);
    }

    fn dispatch(&self, nexus: u64, cdb: &[u8], d: &[u8]) -> CmdResult {
        let op = *cdb.first().ok_or(sense::INVALID_OPCODE)?;
        let expected = cdb_len(op).ok_or(sense::INVALID_OPCODE)?;
        if cdb.len() < expected {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        // The CONTROL byte's NACA bit asks for a feature we do not have.
        if cdb[expected - 1] & 0x04 != 0 {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        match op {
            TEST_UNIT_READY => Ok(Vec::new()),
            INQUIRY => self.inquiry(cdb),
            REQUEST_SENSE => self.request_sense(cdb),
            MODE_SENSE_6 | MODE_SENSE_10 => self.mode_sense(cdb),
            MODE_SELECT_6 | MODE_SELECT_10 => self.mode_select(nexus, cdb, d),
            START_STOP_UNIT | PREVENT_ALLOW_MEDIUM_REMOVAL => Ok(Vec::new()),
            MAINTENANCE_IN if cdb[1] & 0x1F == SA_REPORT_SUPPORTED_OPCODES => self.report_supported_opcodes(cdb),
            MAINTENANCE_IN if cdb[1] & 0x1F == SA_REPORT_TARGET_PORT_GROUPS => self.report_target_port_groups(cdb),
            READ_CAPACITY_10 => self.read_capacity_10(),
            SERVICE_ACTION_IN_16 if cdb[1] & 0x1F == SA_READ_CAPACITY_16 => self.read_capacity_16(cdb),
            SERVICE_ACTION_IN_16 if cdb[1] & 0x1F == SA_GET_LBA_STATUS => self.get_lba_status(cdb),
            READ_6 | READ_10 | READ_12 | READ_16 => self.read(cdb),
            WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 | WRITE_VERIFY_10 | WRITE_VERIFY_12 | WRITE_VERIFY_16 => {
                self.write(cdb, d)
            }
            VERIFY_10 | VERIFY_12 | VERIFY_16 => self.verify(cdb, d),
            PRE_FETCH_10 | PRE_FETCH_16 => self.pre_fetch(cdb),
            SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => self.synchronize_cache(cdb),
            WRITE_SAME_10 | WRITE_SAME_16 => self.write_same(cdb, d),
            UNMAP => self.unmap(cdb, d),
            COMPARE_AND_WRITE => self.compare_and_write(cdb, d),
            _ => Err(sense::INVALID_OPCODE),
        }
    }

    /// Maps an engine error to sense: lack of space is SPACE ALLOCATION FAILED WRITE PROTECT
    /// (never silent loss), lost redundancy a medium error.
    pub(crate) fn io_sense(&self, e: VolumeError, writing: bool) -> Sense {
        if e.is_no_space() {
            return sense::SPACE_ALLOCATION_FAILED_WRITE_PROTECT;
        }
        warn!(vdisk = %self.vdisk.name(), error = %e, "I/O failed");
        match e {
            VolumeError::Layout(_) | VolumeError::Pool(_) if writing => sense::WRITE_ERROR,
            VolumeError::Layout(_) | VolumeError::Pool(_) => sense::UNRECOVERED_READ_ERROR,
            _ => sense::INTERNAL_TARGET_FAILURE,
        }
    }
}

/// Truncates data to the allocation length.
pub(crate) fn alloc(mut data: Vec<u8>, len: usize) -> Vec<u8> {
    data.truncate(len);
    data
}

pub(crate) fn be16(b: &[u8]) -> u64 {
    u16::from_be_bytes([b[0], b[1]]) as u64
}
pub(crate) fn be32(b: &[u8]) -> u64 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64
}
pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}
