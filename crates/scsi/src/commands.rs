//! The command table: for every operation code and service action a logical unit implements,
//! its name, the CDB usage mask REPORT SUPPORTED OPERATION CODES returns, how reservations
//! treat it, and the handler that runs it (after FreeBSD CTL's `ctl_cmd_table`). Dispatch,
//! the reservation rules, REPORT SUPPORTED OPERATION CODES and VPD page 0x8F all read this
//! table, so a new command is one row here and one handler.

use std::sync::LazyLock;

use crate::cdb::BlockRange;
use crate::data::Data;
use crate::lun::{CmdResult, Lun, Response};
use crate::nexus::Nexus;
use crate::opcodes::*;
use crate::pr::Access;
use crate::sense::{self, Sense};

/// One command as it arrives: the nexus that sent it, its CDB (as long as its group says, at
/// least) and its data-out.
pub(crate) struct Request<'a> {
    pub nexus: &'a Nexus,
    pub cdb: &'a [u8],
    pub data: &'a [u8],
}

/// What runs a command once it is admitted.
#[derive(Clone, Copy)]
pub(crate) enum Handler {
    /// Decodes its own CDB.
    Cdb(fn(&Lun, &Request) -> CmdResult),
    /// A block command: the LBA, length and FUA are decoded once ([`crate::cdb::block_range`])
    /// and the range checked against the LUN before it runs; with `transfer`, the length
    /// against the largest transfer too.
    Blocks {
        transfer: bool,
        run: fn(&Lun, &Request, BlockRange) -> CmdResult,
    },
    /// READ (6, 10, 12, 16): a block command whose data is read into an aligned buffer; the
    /// batched and planned read paths admit it the same way.
    Read,
    /// PERSISTENT RESERVE IN/OUT, RESERVE, RELEASE: they change or report the reservations, so
    /// they follow rules of their own (and take the LUN's fence themselves) rather than being
    /// checked against them.
    Reservation(fn(&Lun, &Request) -> Response),
    /// Answered by the transport, which knows the LUNs an initiator may see (REPORT LUNS).
    Transport,
}

/// One row of the table.
pub struct Command {
    pub op: u8,
    /// The service action (the low five bits of CDB byte 1), for operation codes that have them.
    pub sa: Option<u8>,
    pub name: &'static str,
    /// A 1 bit for every CDB bit the command looks at (the CDB usage data of REPORT SUPPORTED
    /// OPERATION CODES); as long as the CDB.
    pub usage: &'static [u8],
    /// What a persistent reservation of another initiator lets through.
    pub access: Access,
    /// Allowed while another nexus holds an SPC-2 reservation (SPC-2 5.5.1).
    pub legacy_ok: bool,
    pub(crate) handler: Handler,
}

const fn row(op: u8, name: &'static str, access: Access, usage: &'static [u8], handler: Handler) -> Command {
    Command {
        op,
        sa: None,
        name,
        usage,
        access,
        legacy_ok: false,
        handler,
    }
}

const fn sa_row(op: u8, sa: u8, name: &'static str, access: Access, usage: &'static [u8], handler: Handler) -> Command {
    Command {
        sa: Some(sa),
        ..row(op, name, access, usage, handler)
    }
}

impl Command {
    const fn legacy_ok(self) -> Command {
        Command {
            legacy_ok: true,
            ..self
        }
    }

    /// A third-party copy command, listed in VPD page 0x8F.
    pub fn third_party_copy(&self) -> bool {
        matches!(self.op, THIRD_PARTY_COPY_OUT | THIRD_PARTY_COPY_IN)
    }
}

use Access::{Always, Read, Write};
use Handler::{Blocks, Cdb, Reservation, Transport};

fn none(_: &Lun, _: &Request) -> CmdResult {
    Ok(Vec::new())
}

/// Blocks checked against the LUN's size and the largest transfer.
const fn transfer(run: fn(&Lun, &Request, BlockRange) -> CmdResult) -> Handler {
    Blocks { transfer: true, run }
}

/// PRE-FETCH: nothing is read ahead (the backend's own cache decides); the range is checked.
fn pre_fetch(_: &Lun, _: &Request, _: BlockRange) -> CmdResult {
    Ok(Vec::new())
}

/// Blocks checked against the LUN's size only: they move no data.
const fn range(run: fn(&Lun, &Request, BlockRange) -> CmdResult) -> Handler {
    Blocks { transfer: false, run }
}

/// The usage mask of a 16-byte block command: an 8-byte LBA, a 4-byte length, the group
/// number and CONTROL; `flags` is what byte 1 uses.
const fn rw16(op: u8, flags: u8) -> [u8; 16] {
    let mut u = [0xFF; 16];
    u[0] = op;
    u[1] = flags;
    u[14] = 0x1F;
    u[15] = 0x03;
    u
}

/// The usage mask of POPULATE TOKEN and WRITE USING TOKEN: list identifier, parameter list
/// length, group number.
const fn token(sa: u8) -> [u8; 16] {
    let mut u = rw16(THIRD_PARTY_COPY_OUT, sa);
    u[2] = 0;
    u[3] = 0;
    u[4] = 0;
    u[5] = 0;
    u
}

const PR_IN: &[u8] = &[0x5E, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x03];
const PR_OUT: &[u8] = &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x03];
const POPULATE_TOKEN_USAGE: [u8; 16] = token(SA_POPULATE_TOKEN);
const WRITE_USING_TOKEN_USAGE: [u8; 16] = token(SA_WRITE_USING_TOKEN);
const READ_16_USAGE: [u8; 16] = rw16(READ_16, 0x18);
const WRITE_16_USAGE: [u8; 16] = rw16(WRITE_16, 0x18);
const ORWRITE_16_USAGE: [u8; 16] = rw16(ORWRITE_16, 0x18);
const WRITE_VERIFY_16_USAGE: [u8; 16] = rw16(WRITE_VERIFY_16, 0x12);
const VERIFY_16_USAGE: [u8; 16] = rw16(VERIFY_16, 0x16);
const PRE_FETCH_16_USAGE: [u8; 16] = rw16(PRE_FETCH_16, 0x02);
const SYNCHRONIZE_CACHE_16_USAGE: [u8; 16] = rw16(SYNCHRONIZE_CACHE_16, 0x02);
const WRITE_SAME_16_USAGE: [u8; 16] = rw16(WRITE_SAME_16, 0x19);

/// Every command, sorted by operation code, then service action.
#[rustfmt::skip]
pub static COMMANDS: &[Command] = &[
    row(TEST_UNIT_READY, "TEST UNIT READY", Always, &[0x00, 0, 0, 0, 0, 0x03], Cdb(none)),
    row(REQUEST_SENSE, "REQUEST SENSE", Always, &[0x03, 0x01, 0, 0, 0xFF, 0x03], Cdb(|l, r| l.request_sense(r.cdb))).legacy_ok(),
    row(READ_6, "READ (6)", Read, &[0x08, 0x1F, 0xFF, 0xFF, 0xFF, 0x03], Handler::Read),
    row(WRITE_6, "WRITE (6)", Write, &[0x0A, 0x1F, 0xFF, 0xFF, 0xFF, 0x03], transfer(Lun::write)),
    row(INQUIRY, "INQUIRY", Always, &[0x12, 0x01, 0xFF, 0xFF, 0xFF, 0x03], Cdb(|l, r| l.inquiry(r.cdb))).legacy_ok(),
    row(MODE_SELECT_6, "MODE SELECT (6)", Write, &[0x15, 0x11, 0, 0, 0xFF, 0x03], Cdb(|l, r| l.mode_select(r.nexus.id, r.cdb, r.data))),
    row(RESERVE_6, "RESERVE (6)", Write, &[0x16, 0, 0, 0, 0, 0x03], Reservation(Lun::reservation_command)),
    row(RELEASE_6, "RELEASE (6)", Write, &[0x17, 0, 0, 0, 0, 0x03], Reservation(Lun::reservation_command)).legacy_ok(),
    row(MODE_SENSE_6, "MODE SENSE (6)", Read, &[0x1A, 0x08, 0xFF, 0xFF, 0xFF, 0x03], Cdb(|l, r| l.mode_sense(r.cdb))),
    row(START_STOP_UNIT, "START STOP UNIT", Write, &[0x1B, 0x01, 0, 0x0F, 0xF7, 0x03], Cdb(none)),
    row(PREVENT_ALLOW_MEDIUM_REMOVAL, "PREVENT ALLOW MEDIUM REMOVAL", Write, &[0x1E, 0, 0, 0, 0x03, 0x03], Cdb(none)),
    row(READ_CAPACITY_10, "READ CAPACITY (10)", Always, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0x03], Cdb(|l, _| l.read_capacity_10())),
    row(READ_10, "READ (10)", Read, &[0x28, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03], Handler::Read),
    row(WRITE_10, "WRITE (10)", Write, &[0x2A, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03], transfer(Lun::write)),
    row(WRITE_VERIFY_10, "WRITE AND VERIFY (10)", Write, &[0x2E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03], transfer(Lun::write)),
    row(VERIFY_10, "VERIFY (10)", Read, &[0x2F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03], transfer(Lun::verify)),
    row(PRE_FETCH_10, "PRE-FETCH (10)", Read, &[0x34, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03], range(pre_fetch)),
    row(SYNCHRONIZE_CACHE_10, "SYNCHRONIZE CACHE (10)", Write, &[0x35, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03], range(Lun::synchronize_cache)),
    row(READ_DEFECT_DATA_10, "READ DEFECT DATA (10)", Read, &[0x37, 0, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0x03], Cdb(|l, r| l.read_defect_data(r.cdb))),
    row(WRITE_SAME_10, "WRITE SAME (10)", Write, &[0x41, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0x03], Cdb(|l, r| l.write_same(r.cdb, r.data))),
    row(UNMAP, "UNMAP", Write, &[0x42, 0x01, 0, 0, 0, 0, 0x1F, 0xFF, 0xFF, 0x03], Cdb(|l, r| l.unmap(r.cdb, r.data))),
    row(MODE_SELECT_10, "MODE SELECT (10)", Write, &[0x55, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x03], Cdb(|l, r| l.mode_select(r.nexus.id, r.cdb, r.data))),
    row(RESERVE_10, "RESERVE (10)", Write, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0x03], Reservation(Lun::reservation_command)),
    row(RELEASE_10, "RELEASE (10)", Write, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0x03], Reservation(Lun::reservation_command)).legacy_ok(),
    row(MODE_SENSE_10, "MODE SENSE (10)", Read, &[0x5A, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0x03], Cdb(|l, r| l.mode_sense(r.cdb))),
    sa_row(PERSISTENT_RESERVE_IN, 0, "PERSISTENT RESERVE IN / READ KEYS", Always, PR_IN, Reservation(Lun::reservation_command)).legacy_ok(),
    sa_row(PERSISTENT_RESERVE_IN, 1, "PERSISTENT RESERVE IN / READ RESERVATION", Always, PR_IN, Reservation(Lun::reservation_command)).legacy_ok(),
    sa_row(PERSISTENT_RESERVE_IN, 2, "PERSISTENT RESERVE IN / REPORT CAPABILITIES", Always, PR_IN, Reservation(Lun::reservation_command)).legacy_ok(),
    sa_row(PERSISTENT_RESERVE_IN, 3, "PERSISTENT RESERVE IN / READ FULL STATUS", Always, PR_IN, Reservation(Lun::reservation_command)).legacy_ok(),
    sa_row(PERSISTENT_RESERVE_OUT, 0, "PERSISTENT RESERVE OUT / REGISTER", Always, PR_OUT, Reservation(Lun::reservation_command)),
    sa_row(PERSISTENT_RESERVE_OUT, 1, "PERSISTENT RESERVE OUT / RESERVE", Always, PR_OUT, Reservation(Lun::reservation_command)),
    sa_row(PERSISTENT_RESERVE_OUT, 2, "PERSISTENT RESERVE OUT / RELEASE", Always, PR_OUT, Reservation(Lun::reservation_command)),
    sa_row(PERSISTENT_RESERVE_OUT, 3, "PERSISTENT RESERVE OUT / CLEAR", Always, PR_OUT, Reservation(Lun::reservation_command)),
    sa_row(PERSISTENT_RESERVE_OUT, 4, "PERSISTENT RESERVE OUT / PREEMPT", Always, PR_OUT, Reservation(Lun::reservation_command)),
    sa_row(PERSISTENT_RESERVE_OUT, 5, "PERSISTENT RESERVE OUT / PREEMPT AND ABORT", Always, PR_OUT, Reservation(Lun::reservation_command)),
    sa_row(PERSISTENT_RESERVE_OUT, 6, "PERSISTENT RESERVE OUT / REGISTER AND IGNORE EXISTING KEY", Always, PR_OUT, Reservation(Lun::reservation_command)),
    sa_row(PERSISTENT_RESERVE_OUT, 7, "PERSISTENT RESERVE OUT / REGISTER AND MOVE", Always, PR_OUT, Reservation(Lun::reservation_command)),
    // EXTENDED COPY and WRITE USING TOKEN write (this LUN, or one the copy names, checked
    // again there); POPULATE TOKEN reads.
    sa_row(THIRD_PARTY_COPY_OUT, SA_EXTENDED_COPY_LID1, "EXTENDED COPY (LID1)", Write,
        &[0x83, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.extended_copy(r.nexus, r.cdb, r.data))),
    sa_row(THIRD_PARTY_COPY_OUT, SA_POPULATE_TOKEN, "POPULATE TOKEN", Read, &POPULATE_TOKEN_USAGE, Cdb(|l, r| l.populate_token(r.nexus, r.cdb, r.data))),
    sa_row(THIRD_PARTY_COPY_OUT, SA_WRITE_USING_TOKEN, "WRITE USING TOKEN", Write, &WRITE_USING_TOKEN_USAGE, Cdb(|l, r| l.write_using_token(r.nexus, r.cdb, r.data))),
    sa_row(THIRD_PARTY_COPY_OUT, SA_COPY_OPERATION_ABORT, "COPY OPERATION ABORT", Write,
        &[0x83, 0x1C, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x03], Cdb(|l, r| l.copy_operation_abort(r.nexus.id, r.cdb))),
    // Copy results and token information change nothing.
    sa_row(THIRD_PARTY_COPY_IN, SA_RECEIVE_COPY_STATUS_LID1, "RECEIVE COPY STATUS (LID1)", Always,
        &[0x84, 0x00, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.receive_copy_status(r.nexus.id, r.cdb))),
    sa_row(THIRD_PARTY_COPY_IN, SA_RECEIVE_COPY_OPERATING_PARAMETERS, "RECEIVE COPY OPERATING PARAMETERS", Always,
        &[0x84, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.receive_copy_operating_parameters(r.cdb))),
    sa_row(THIRD_PARTY_COPY_IN, SA_RECEIVE_COPY_FAILURE_DETAILS_LID1, "RECEIVE COPY FAILURE DETAILS (LID1)", Always,
        &[0x84, 0x04, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.receive_copy_failure_details(r.nexus.id, r.cdb))),
    sa_row(THIRD_PARTY_COPY_IN, SA_RECEIVE_ROD_TOKEN_INFORMATION, "RECEIVE ROD TOKEN INFORMATION", Always,
        &[0x84, 0x07, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.receive_rod_token_information(r.nexus.id, r.cdb))),
    sa_row(THIRD_PARTY_COPY_IN, SA_REPORT_ALL_ROD_TOKENS, "REPORT ALL ROD TOKENS", Always,
        &[0x84, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.report_all_rod_tokens(r.nexus.id, r.cdb))),
    row(READ_16, "READ (16)", Read, &READ_16_USAGE, Handler::Read),
    row(COMPARE_AND_WRITE, "COMPARE AND WRITE", Write,
        &[0x89, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0x1F, 0x03], Cdb(|l, r| l.compare_and_write(r.cdb, r.data))),
    row(WRITE_16, "WRITE (16)", Write, &WRITE_16_USAGE, transfer(Lun::write)),
    row(ORWRITE_16, "ORWRITE (16)", Write, &ORWRITE_16_USAGE, transfer(Lun::orwrite)),
    row(WRITE_VERIFY_16, "WRITE AND VERIFY (16)", Write, &WRITE_VERIFY_16_USAGE, transfer(Lun::write)),
    row(VERIFY_16, "VERIFY (16)", Read, &VERIFY_16_USAGE, transfer(Lun::verify)),
    row(PRE_FETCH_16, "PRE-FETCH (16)", Read, &PRE_FETCH_16_USAGE, range(pre_fetch)),
    row(SYNCHRONIZE_CACHE_16, "SYNCHRONIZE CACHE (16)", Write, &SYNCHRONIZE_CACHE_16_USAGE, range(Lun::synchronize_cache)),
    row(WRITE_SAME_16, "WRITE SAME (16)", Write, &WRITE_SAME_16_USAGE, Cdb(|l, r| l.write_same(r.cdb, r.data))),
    sa_row(SERVICE_ACTION_IN_16, SA_READ_CAPACITY_16, "READ CAPACITY (16)", Always,
        &[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.read_capacity_16(r.cdb))),
    sa_row(SERVICE_ACTION_IN_16, SA_GET_LBA_STATUS, "GET LBA STATUS", Read,
        &[0x9E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.get_lba_status(r.cdb))),
    row(REPORT_LUNS, "REPORT LUNS", Always, &[0xA0, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Transport).legacy_ok(),
    sa_row(MAINTENANCE_IN, SA_REPORT_TARGET_PORT_GROUPS, "REPORT TARGET PORT GROUPS", Always,
        &[0xA3, 0xEA, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.report_target_port_groups(r.cdb))).legacy_ok(),
    sa_row(MAINTENANCE_IN, SA_REPORT_SUPPORTED_OPCODES, "REPORT SUPPORTED OPERATION CODES", Always,
        &[0xA3, 0x0C, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.report_supported_opcodes(r.cdb))).legacy_ok(),
    sa_row(MAINTENANCE_IN, SA_REPORT_TIMESTAMP, "REPORT TIMESTAMP", Always,
        &[0xA3, 0x0F, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.report_timestamp(r.cdb))),
    row(READ_12, "READ (12)", Read, &[0xA8, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03], Handler::Read),
    row(WRITE_12, "WRITE (12)", Write, &[0xAA, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03], transfer(Lun::write)),
    row(WRITE_VERIFY_12, "WRITE AND VERIFY (12)", Write, &[0xAE, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03], transfer(Lun::write)),
    row(VERIFY_12, "VERIFY (12)", Read, &[0xAF, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0x03], transfer(Lun::verify)),
    row(READ_DEFECT_DATA_12, "READ DEFECT DATA (12)", Read, &[0xB7, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x03], Cdb(|l, r| l.read_defect_data(r.cdb))),
];

/// Where each operation code's rows start in [`COMMANDS`], and how many it has.
static INDEX: LazyLock<[(usize, usize); 256]> = LazyLock::new(|| {
    let mut index = [(0, 0); 256];
    for (i, c) in COMMANDS.iter().enumerate() {
        let e = &mut index[c.op as usize];
        if e.1 == 0 {
            e.0 = i;
        }
        e.1 += 1;
    }
    index
});

/// READ (6), (10), (12) or (16), by the table: the commands that batches of queued reads, and
/// reads planned onto a transport's ring, are made of.
pub fn is_read(op: u8) -> bool {
    let (start, n) = INDEX[op as usize];
    n == 1 && matches!(COMMANDS[start].handler, Handler::Read)
}

/// The row of a CDB's command, or the sense for a command we do not have.
pub fn lookup(cdb: &[u8]) -> Result<&'static Command, Sense> {
    let op = *cdb.first().ok_or(sense::INVALID_OPCODE)?;
    let (start, n) = INDEX[op as usize];
    match &COMMANDS[start..start + n] {
        [] => Err(sense::INVALID_OPCODE),
        [only] if only.sa.is_none() => Ok(only),
        rows => {
            let sa = cdb.get(1).map(|b| b & 0x1F);
            rows.iter()
                .find(|c| c.sa == sa)
                .ok_or_else(|| unknown_service_action(op))
        }
    }
}

/// SERVICE ACTION IN (16) and MAINTENANCE IN gather unrelated commands under one operation
/// code: an unknown service action there is a command we do not have (as LIO answers).
/// Elsewhere it is a bad field of a command we have.
fn unknown_service_action(op: u8) -> Sense {
    match op {
        SERVICE_ACTION_IN_16 | MAINTENANCE_IN => sense::INVALID_OPCODE,
        _ => sense::INVALID_FIELD_IN_CDB.at_cdb_byte(1),
    }
}

impl Lun {
    /// Runs a command admitted under the reservations (any but a [`Handler::Reservation`]).
    pub(crate) fn run(&self, cmd: &Command, req: &Request) -> Result<Data, Sense> {
        match cmd.handler {
            Cdb(run) => run(self, req).map(Data::Bytes),
            Blocks { transfer, run } => {
                let blocks = self.checked_range(req.cdb, transfer)?;
                run(self, req, blocks).map(Data::Bytes)
            }
            Handler::Read => self.read(req.cdb),
            // A LUN does not know which other LUNs the initiator may see.
            Transport => Err(sense::INVALID_OPCODE),
            Reservation(_) => unreachable!("reservation commands are answered before admission"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_sorted_unique_and_as_long_as_their_cdb() {
        for w in COMMANDS.windows(2) {
            assert!(
                (w[0].op, w[0].sa) < (w[1].op, w[1].sa),
                "{} before {}",
                w[0].name,
                w[1].name
            );
        }
        for c in COMMANDS {
            assert_eq!(Some(c.usage.len()), cdb_len(c.op), "{}", c.name);
            assert_eq!(c.usage[0], c.op, "{}", c.name);
            // An operation code has service actions in every row or in none.
            assert!(
                COMMANDS
                    .iter()
                    .filter(|o| o.op == c.op)
                    .all(|o| o.sa.is_some() == c.sa.is_some()),
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn the_reads_are_the_four_read_commands() {
        let reads: Vec<u8> = (0..=255u8).filter(|&op| is_read(op)).collect();
        assert_eq!(reads, [READ_6, READ_10, READ_16, READ_12]);
    }

    #[test]
    fn every_row_is_found_and_nothing_else() {
        for c in COMMANDS {
            let mut cdb = vec![0u8; 16];
            cdb[0] = c.op;
            cdb[1] = c.sa.unwrap_or(0);
            assert!(std::ptr::eq(lookup(&cdb).unwrap(), c), "{}", c.name);
        }
        assert_eq!(lookup(&[0xC0, 0]).err(), Some(sense::INVALID_OPCODE));
        assert_eq!(lookup(&[]).err(), Some(sense::INVALID_OPCODE));
        assert_eq!(lookup(&[SERVICE_ACTION_IN_16, 0x1F]).err(), Some(sense::INVALID_OPCODE));
        assert_eq!(
            lookup(&[THIRD_PARTY_COPY_IN, 0x1F]).err(),
            Some(sense::INVALID_FIELD_IN_CDB.at_cdb_byte(1))
        );
    }
}
