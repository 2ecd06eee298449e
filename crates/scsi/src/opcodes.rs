//! Operation codes we implement, their CDB lengths, and the usage masks REPORT SUPPORTED
//! OPERATION CODES returns (a 1 bit for every CDB bit the command looks at).

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

/// READ (6), (10), (12) or (16): the commands that batches of queued reads are made of.
pub fn is_read(op: u8) -> bool {
    matches!(op, READ_6 | READ_10 | READ_12 | READ_16)
}

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

/// One supported command: opcode, service action (if it has one) and CDB usage mask.
pub struct OpInfo {
    pub op: u8,
    pub sa: Option<u8>,
    pub usage: &'static [u8],
}

const fn op(op: u8, usage: &'static [u8]) -> OpInfo {
    OpInfo { op, sa: None, usage }
}
const fn sa(op: u8, sa: u8, usage: &'static [u8]) -> OpInfo {
    OpInfo {
        op,
        sa: Some(sa),
        usage,
    }
}

const PR_IN_USAGE: &[u8] = &[0x5E, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x03];
const PR_OUT_USAGE: &[u8] = &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x03];

pub const SUPPORTED: &[OpInfo] = &[
    op(TEST_UNIT_READY, &[0x00, 0, 0, 0, 0, 0x03]),
    op(REQUEST_SENSE, &[0x03, 0x01, 0, 0, 0xFF, 0x03]),
    op(READ_6, &[0x08, 0x1F, 0xFF, 0xFF, 0xFF, 0x03]),
    op(WRITE_6, &[0x0A, 0x1F, 0xFF, 0xFF, 0xFF, 0x03]),
    op(INQUIRY, &[0x12, 0x01, 0xFF, 0xFF, 0xFF, 0x03]),
    op(MODE_SELECT_6, &[0x15, 0x11, 0, 0, 0xFF, 0x03]),
    op(RESERVE_6, &[0x16, 0, 0, 0, 0, 0x03]),
    op(RELEASE_6, &[0x17, 0, 0, 0, 0, 0x03]),
    op(MODE_SENSE_6, &[0x1A, 0x08, 0xFF, 0xFF, 0xFF, 0x03]),
    op(START_STOP_UNIT, &[0x1B, 0x01, 0, 0x0F, 0xF7, 0x03]),
    op(PREVENT_ALLOW_MEDIUM_REMOVAL, &[0x1E, 0, 0, 0, 0x03, 0x03]),
    op(READ_CAPACITY_10, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0x03]),
    op(READ_10, &[0x28, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03]),
    op(WRITE_10, &[0x2A, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03]),
    op(
        WRITE_VERIFY_10,
        &[0x2E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03],
    ),
    op(VERIFY_10, &[0x2F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03]),
    op(
        PRE_FETCH_10,
        &[0x34, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03],
    ),
    op(READ_DEFECT_DATA_10, &[0x37, 0, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0x03]),
    op(
        SYNCHRONIZE_CACHE_10,
        &[0x35, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03],
    ),
    op(
        WRITE_SAME_10,
        &[0x41, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03],
    ),
    op(UNMAP, &[0x42, 0x01, 0, 0, 0, 0, 0x1F, 0xFF, 0xFF, 0x03]),
    op(MODE_SELECT_10, &[0x55, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x03]),
    op(RESERVE_10, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0x03]),
    op(RELEASE_10, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0x03]),
    op(MODE_SENSE_10, &[0x5A, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0x03]),
    sa(PERSISTENT_RESERVE_IN, 0, PR_IN_USAGE),
    sa(PERSISTENT_RESERVE_IN, 1, PR_IN_USAGE),
    sa(PERSISTENT_RESERVE_IN, 2, PR_IN_USAGE),
    sa(PERSISTENT_RESERVE_IN, 3, PR_IN_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 0, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 1, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 2, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 3, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 4, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 5, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 6, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, 7, PR_OUT_USAGE),
    sa(
        THIRD_PARTY_COPY_OUT,
        0x00,
        &[0x83, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    sa(
        THIRD_PARTY_COPY_OUT,
        0x10,
        &[
            0x83, 0x10, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    sa(
        THIRD_PARTY_COPY_OUT,
        0x11,
        &[
            0x83, 0x11, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    sa(
        THIRD_PARTY_COPY_OUT,
        0x1C,
        &[0x83, 0x1C, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x03],
    ),
    sa(
        THIRD_PARTY_COPY_IN,
        0x00,
        &[0x84, 0x00, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    sa(
        THIRD_PARTY_COPY_IN,
        0x03,
        &[0x84, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    sa(
        THIRD_PARTY_COPY_IN,
        0x04,
        &[0x84, 0x04, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    sa(
        THIRD_PARTY_COPY_IN,
        0x07,
        &[
            0x84, 0x07, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03,
        ],
    ),
    sa(
        THIRD_PARTY_COPY_IN,
        0x08,
        &[0x84, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    op(
        READ_16,
        &[
            0x88, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        COMPARE_AND_WRITE,
        &[
            0x89, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        WRITE_16,
        &[
            0x8A, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        ORWRITE_16,
        &[
            0x8B, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        WRITE_VERIFY_16,
        &[
            0x8E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        VERIFY_16,
        &[
            0x8F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        PRE_FETCH_16,
        &[
            0x90, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        SYNCHRONIZE_CACHE_16,
        &[
            0x91, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    op(
        WRITE_SAME_16,
        &[
            0x93, 0x19, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03,
        ],
    ),
    sa(
        SERVICE_ACTION_IN_16,
        SA_READ_CAPACITY_16,
        &[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    sa(
        SERVICE_ACTION_IN_16,
        SA_GET_LBA_STATUS,
        &[
            0x9E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03,
        ],
    ),
    op(REPORT_LUNS, &[0xA0, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03]),
    sa(
        MAINTENANCE_IN,
        SA_REPORT_SUPPORTED_OPCODES,
        &[0xA3, 0x0C, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    op(
        READ_12,
        &[0xA8, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03],
    ),
    op(
        WRITE_12,
        &[0xAA, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03],
    ),
    sa(
        MAINTENANCE_IN,
        SA_REPORT_TARGET_PORT_GROUPS,
        &[0xA3, 0xEA, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
    op(
        WRITE_VERIFY_12,
        &[0xAE, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03],
    ),
    op(
        VERIFY_12,
        &[0xAF, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03],
    ),
    op(
        READ_DEFECT_DATA_12,
        &[0xB7, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_have_the_cdb_length() {
        for o in SUPPORTED {
            assert_eq!(Some(o.usage.len()), cdb_len(o.op), "opcode {:#x}", o.op);
            assert_eq!(o.usage[0], o.op);
        }
    }

    #[test]
    fn every_dispatched_command_is_reported() {
        // Keep this list in step with Lun::dispatch.
        for op in [
            TEST_UNIT_READY,
            INQUIRY,
            REQUEST_SENSE,
            MODE_SENSE_6,
            MODE_SENSE_10,
            MODE_SELECT_6,
            MODE_SELECT_10,
            START_STOP_UNIT,
            PREVENT_ALLOW_MEDIUM_REMOVAL,
            READ_CAPACITY_10,
            READ_6,
            READ_10,
            READ_12,
            READ_16,
            WRITE_6,
            WRITE_10,
            WRITE_12,
            WRITE_16,
            WRITE_VERIFY_10,
            WRITE_VERIFY_12,
            WRITE_VERIFY_16,
            VERIFY_10,
            VERIFY_12,
            VERIFY_16,
            PRE_FETCH_10,
            PRE_FETCH_16,
            SYNCHRONIZE_CACHE_10,
            SYNCHRONIZE_CACHE_16,
            WRITE_SAME_10,
            WRITE_SAME_16,
            UNMAP,
            COMPARE_AND_WRITE,
            REPORT_LUNS,
            RESERVE_6,
            RELEASE_6,
            ORWRITE_16,
            READ_DEFECT_DATA_10,
            READ_DEFECT_DATA_12,
            RESERVE_10,
            RELEASE_10,
        ] {
            assert!(
                SUPPORTED.iter().any(|o| o.op == op),
                "opcode {op:#x} missing from SUPPORTED"
            );
        }
        for (op, sa) in [
            (SERVICE_ACTION_IN_16, SA_READ_CAPACITY_16),
            (SERVICE_ACTION_IN_16, SA_GET_LBA_STATUS),
            (MAINTENANCE_IN, SA_REPORT_SUPPORTED_OPCODES),
            (MAINTENANCE_IN, SA_REPORT_TARGET_PORT_GROUPS),
            (PERSISTENT_RESERVE_IN, 0),
            (PERSISTENT_RESERVE_IN, 3),
            (PERSISTENT_RESERVE_OUT, 0),
            (PERSISTENT_RESERVE_OUT, 7),
            (THIRD_PARTY_COPY_OUT, 0x00),
            (THIRD_PARTY_COPY_OUT, 0x10),
            (THIRD_PARTY_COPY_OUT, 0x11),
            (THIRD_PARTY_COPY_OUT, 0x1C),
            (THIRD_PARTY_COPY_IN, 0x00),
            (THIRD_PARTY_COPY_IN, 0x03),
            (THIRD_PARTY_COPY_IN, 0x04),
            (THIRD_PARTY_COPY_IN, 0x07),
            (THIRD_PARTY_COPY_IN, 0x08),
        ] {
            assert!(
                SUPPORTED.iter().any(|o| o.op == op && o.sa == Some(sa)),
                "{op:#x}/{sa:#x} missing"
            );
        }
    }
}
