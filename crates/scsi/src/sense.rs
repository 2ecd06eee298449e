//! Status codes and sense data, in fixed (0x70) or descriptor (0x72) format as the control mode
//! page's D_SENSE asks.

pub const GOOD: u8 = 0x00;
/// The target cannot take the command now for lack of resources; the initiator retries.
pub const TASK_SET_FULL: u8 = 0x28;
pub const CHECK_CONDITION: u8 = 0x02;
pub const RESERVATION_CONFLICT: u8 = 0x18;

pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const COPY_ABORTED: u8 = 0xA;
    pub const ABORTED_COMMAND: u8 = 0xB;
    pub const MISCOMPARE: u8 = 0xE;
}

/// A sense key with its additional sense code and qualifier, and an optional INFORMATION field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    pub info: Option<u64>,
    /// For ILLEGAL REQUEST: the CDB byte at fault (sense-key specific field pointer).
    pub cdb_byte: Option<u16>,
}

impl Sense {
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            info: None,
            cdb_byte: None,
        }
    }

    /// Points at the CDB byte whose field is invalid.
    pub fn at_cdb_byte(mut self, byte: u16) -> Sense {
        self.cdb_byte = Some(byte);
        self
    }

    /// Sense-key specific bytes: SKSV, C/D = CDB, and the field pointer.
    fn field_pointer(&self) -> Option<[u8; 3]> {
        let b = self.cdb_byte?.to_be_bytes();
        Some([0x80 | 0x40, b[0], b[1]])
    }

    pub fn with_info(mut self, info: u64) -> Sense {
        self.info = Some(info);
        self
    }

    /// The sense bytes in the format the LUN is set to.
    pub fn encode(&self, descriptor: bool) -> Vec<u8> {
        if descriptor {
            let mut b = vec![0x72, self.key, self.asc, self.ascq, 0, 0, 0, 0];
            if let Some(i) = self.info {
                // Information descriptor: type 0, length 0x0A, VALID.
                b.extend_from_slice(&[0x00, 0x0A, 0x80, 0]);
                b.extend_from_slice(&i.to_be_bytes());
            }
            if let Some(f) = self.field_pointer() {
                // Sense key specific descriptor: type 2, length 6.
                b.extend_from_slice(&[0x02, 0x06, 0, 0, f[0], f[1], f[2], 0]);
            }
            b[7] = (b.len() - 8) as u8;
            b
        } else {
            let mut b = vec![0u8; 18];
            b[0] = 0x70;
            b[2] = self.key;
            b[7] = 10;
            b[12] = self.asc;
            b[13] = self.ascq;
            if let Some(i) = self.info {
                b[0] |= 0x80;
                b[3..7].copy_from_slice(&(i.min(u32::MAX as u64) as u32).to_be_bytes());
            }
            if let Some(f) = self.field_pointer() {
                b[15..18].copy_from_slice(&f);
            }
            b
        }
    }
}

pub const INVALID_OPCODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
pub const LUN_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
pub const INVALID_FIELD_IN_PARAMETER_LIST: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
pub const PARAMETER_LIST_LENGTH_ERROR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1A, 0x00);
pub const SAVING_PARAMETERS_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
pub const SPACE_ALLOCATION_FAILED_WRITE_PROTECT: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x07);
pub const UNRECOVERED_READ_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0C, 0x00);
/// iSCSI's "a data PDU was lost" (RFC 7143 11.4.7.2), for a write whose data cannot be
/// asked for again at ErrorRecoveryLevel 0.
pub const PROTOCOL_SERVICE_CRC_ERROR: Sense = Sense::new(key::ABORTED_COMMAND, 0x47, 0x05);
/// Write data that arrived at another offset than the next one, which in-order data
/// (DataPDUInOrder and DataSequenceInOrder, RFC 7143 13.19-20) must be.
pub const DATA_OFFSET_ERROR: Sense = Sense::new(key::ABORTED_COMMAND, 0x4B, 0x05);
pub const INTERNAL_TARGET_FAILURE: Sense = Sense::new(key::HARDWARE_ERROR, 0x44, 0x00);
pub const MISCOMPARE_DURING_VERIFY: Sense = Sense::new(key::MISCOMPARE, 0x1D, 0x00);
pub const POWER_ON_OCCURRED: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x00);
pub const BUS_DEVICE_RESET_OCCURRED: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x03);
pub const I_T_NEXUS_LOSS_OCCURRED: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x07);
pub const MODE_PARAMETERS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x01);
/// The pool under a thin LUN is allocated past its threshold (SBC-3 4.7.3.7).
pub const THIN_PROVISIONING_SOFT_THRESHOLD_REACHED: Sense = Sense::new(key::UNIT_ATTENTION, 0x38, 0x07);
pub const CAPACITY_DATA_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x09);
pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x06);
/// LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION.
pub const ALUA_TRANSITION: Sense = Sense::new(key::NOT_READY, 0x04, 0x0A);
/// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
pub const PORT_IN_STANDBY: Sense = Sense::new(key::NOT_READY, 0x04, 0x0B);
/// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE.
pub const PORT_UNAVAILABLE: Sense = Sense::new(key::NOT_READY, 0x04, 0x0C);
pub const TOO_MANY_TARGET_DESCRIPTORS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x06);
pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x07);
pub const TOO_MANY_SEGMENT_DESCRIPTORS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x08);
pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x09);
pub const INLINE_DATA_LENGTH_EXCEEDED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x0B);
/// A segment's range goes past a copy target's end. (libiscsi accepts only these ASCs with
/// COPY ABORTED; LOGICAL BLOCK ADDRESS OUT OF RANGE is not among them.)
pub const COPY_ABORTED_SEGMENT_OUT_OF_RANGE: Sense = Sense::new(key::COPY_ABORTED, 0x00, 0x00);
pub const COPY_TARGET_DEVICE_NOT_REACHABLE: Sense = Sense::new(key::COPY_ABORTED, 0x0D, 0x02);
/// A copy target this nexus may not use: a LUN outside its target, or one a reservation
/// keeps from it. Nothing has been read or written.
pub const UNREACHABLE_COPY_TARGET: Sense = Sense::new(key::COPY_ABORTED, 0x08, 0x04);
/// A copy stopped part-way for a reservation change or a reset of a LUN it reads or writes:
/// the initiator sends it again (checked then under what changed).
pub const COPY_STOPPED_FOR_A_RESET_OR_RESERVATION: Sense = Sense::new(key::ABORTED_COMMAND, 0x00, 0x00);
pub const INSUFFICIENT_RESOURCES_TO_CREATE_ROD_TOKEN: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x55, 0x0D);
pub const NO_ADDITIONAL_SENSE: Sense = Sense::new(key::NO_SENSE, 0x00, 0x00);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_and_descriptor_formats() {
        let f = INVALID_FIELD_IN_CDB.encode(false);
        assert_eq!((f[0], f[2], f[7], f[12], f[13]), (0x70, 5, 10, 0x24, 0));
        let d = MISCOMPARE_DURING_VERIFY.with_info(513).encode(true);
        assert_eq!(&d[..4], &[0x72, 0xE, 0x1D, 0]);
        assert_eq!(d[7] as usize, d.len() - 8);
        assert_eq!(u64::from_be_bytes(d[12..20].try_into().unwrap()), 513);
        let f = MISCOMPARE_DURING_VERIFY.with_info(513).encode(false);
        assert_eq!(f[0], 0xF0);
        assert_eq!(u32::from_be_bytes(f[3..7].try_into().unwrap()), 513);
    }
}
