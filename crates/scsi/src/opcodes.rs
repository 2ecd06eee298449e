//! Operation codes and service actions we implement, and CDB lengths by group. What each one
//! does, and how, is in the command table (commands.rs).

pub const TEST_UNIT_READY: u8 = 0x00;
pub const REQUEST_SENSE: u8 = 0x03;
pub const READ_6: u8 = 0x08;
pub const WRITE_6: u8 = 0x0A;
pub const INQUIRY: u8 = 0x12;
pub const MODE_SELECT_6: u8 = 0x15;
pub const RESERVE_6: u8 = 0x16;
pub const RELEASE_6: u8 = 0x17;
pub const MODE_SENSE_6: u8 = 0x1A;
pub const START_STOP_UNIT: u8 = 0x1B;
pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1E;
pub const READ_CAPACITY_10: u8 = 0x25;
pub const READ_10: u8 = 0x28;
pub const WRITE_10: u8 = 0x2A;
pub const WRITE_VERIFY_10: u8 = 0x2E;
pub const VERIFY_10: u8 = 0x2F;
pub const PRE_FETCH_10: u8 = 0x34;
pub const READ_DEFECT_DATA_10: u8 = 0x37;
pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
pub const WRITE_SAME_10: u8 = 0x41;
pub const UNMAP: u8 = 0x42;
pub const MODE_SELECT_10: u8 = 0x55;
pub const RESERVE_10: u8 = 0x56;
pub const RELEASE_10: u8 = 0x57;
pub const MODE_SENSE_10: u8 = 0x5A;
pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
pub const READ_16: u8 = 0x88;
pub const COMPARE_AND_WRITE: u8 = 0x89;
pub const ORWRITE_16: u8 = 0x8B;
pub const WRITE_16: u8 = 0x8A;
pub const WRITE_VERIFY_16: u8 = 0x8E;
pub const VERIFY_16: u8 = 0x8F;
pub const PRE_FETCH_16: u8 = 0x90;
pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
pub const WRITE_SAME_16: u8 = 0x93;
pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
pub const THIRD_PARTY_COPY_OUT: u8 = 0x83;
pub const THIRD_PARTY_COPY_IN: u8 = 0x84;
pub const REPORT_LUNS: u8 = 0xA0;
pub const MAINTENANCE_IN: u8 = 0xA3;
pub const READ_12: u8 = 0xA8;
pub const WRITE_12: u8 = 0xAA;
pub const WRITE_VERIFY_12: u8 = 0xAE;
pub const VERIFY_12: u8 = 0xAF;
pub const READ_DEFECT_DATA_12: u8 = 0xB7;

pub const SA_READ_CAPACITY_16: u8 = 0x10;
pub const SA_GET_LBA_STATUS: u8 = 0x12;
pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
pub const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;
pub const SA_REPORT_TIMESTAMP: u8 = 0x0F;

// THIRD PARTY COPY OUT.
pub const SA_EXTENDED_COPY_LID1: u8 = 0x00;
pub const SA_POPULATE_TOKEN: u8 = 0x10;
pub const SA_WRITE_USING_TOKEN: u8 = 0x11;
pub const SA_COPY_OPERATION_ABORT: u8 = 0x1C;
// THIRD PARTY COPY IN.
pub const SA_RECEIVE_COPY_STATUS_LID1: u8 = 0x00;
pub const SA_RECEIVE_COPY_OPERATING_PARAMETERS: u8 = 0x03;
pub const SA_RECEIVE_COPY_FAILURE_DETAILS_LID1: u8 = 0x04;
pub const SA_RECEIVE_ROD_TOKEN_INFORMATION: u8 = 0x07;
pub const SA_REPORT_ALL_ROD_TOKENS: u8 = 0x08;

/// The CDB length of an operation code, by its group.
pub fn cdb_len(op: u8) -> Option<usize> {
    match op >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}
