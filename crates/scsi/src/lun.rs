//! A logical unit: a block backend (a vdisk) with the SCSI state that belongs to it (mode page settings, the lock
//! that makes COMPARE AND WRITE atomic), and the command dispatch.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tessera_disk::IoMeter;

use parking_lot::{Mutex, RwLock};
use tracing::warn;

use crate::alua::{self, AccessState, PortGroups, SinglePort};
use crate::backend::{BackendError, BackendErrorKind, BlockBackend};
use crate::bytes::{alloc, be16};
use crate::commands::{self, Command, Handler, Request};
use crate::data::Data;
use crate::nexus::Nexus;
use crate::opcodes::*;
use crate::pr::{self, Access, Outcome, PortId, PrState, TargetPorts};
use crate::sense::{self, Sense};
use crate::tpc::CopyManager;

/// What a command returns: data for the initiator, or a CHECK CONDITION with sense.
pub type CmdResult = Result<Vec<u8>, Sense>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u8,
    pub data: Data,
    pub sense: Vec<u8>,
}

impl Response {
    /// RESERVATION CONFLICT: a status with neither data nor sense.
    pub fn reservation_conflict() -> Response {
        Response {
            status: sense::RESERVATION_CONFLICT,
            data: Data::default(),
            sense: Vec::new(),
        }
    }
}

/// The table's row for a CDB that is long enough for its operation code and has no NACA bit.
fn command_of(cdb: &[u8]) -> Result<&'static Command, Sense> {
    check_cdb(cdb)?;
    commands::lookup(cdb)
}

/// A CDB long enough for its operation code, without the CONTROL byte's NACA bit (a feature we
/// do not have).
fn check_cdb(cdb: &[u8]) -> Result<(), Sense> {
    let op = *cdb.first().ok_or(sense::INVALID_OPCODE)?;
    let expected = cdb_len(op).ok_or(sense::INVALID_OPCODE)?;
    if cdb.len() < expected || cdb[expected - 1] & 0x04 != 0 {
        return Err(sense::INVALID_FIELD_IN_CDB);
    }
    Ok(())
}

/// Settings an initiator may change with MODE SELECT. Shared by every nexus of the LUN, and
/// saved (when the LUN has a [`ModeStore`]) so that they outlive a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModeState {
    /// Write cache enabled: a write is durable only after SYNCHRONIZE CACHE or with FUA. With it
    /// off, every write is made durable before it completes.
    pub wce: bool,
    /// Descriptor-format sense.
    pub d_sense: bool,
    /// Software write protect.
    pub swp: bool,
}

impl Default for ModeState {
    /// The default values: write cache on, fixed-format sense, no software write protect.
    fn default() -> ModeState {
        ModeState {
            wce: true,
            d_sense: false,
            swp: false,
        }
    }
}

/// Saves the mode settings when MODE SELECT changes them.
pub type ModeStore = Box<dyn Fn(&ModeState) -> Result<(), String> + Send + Sync>;

/// The nexuses of a LUN by initiator port: the initiator's name, then the ISID of its
/// sessions. SAM's I_T nexus is this port with the target port, so what is pending for a nexus
/// outlives one session and reaches the next session the same port logs in (a reinstatement, a
/// reconnection). Two levels, so that a command finds its port without copying the name.
type Ports = HashMap<String, HashMap<[u8; 6], NexusState>>;

/// Saves the persistent reservation state (Some), or forgets it (None). A LUN of one daemon
/// saves it when an initiator asked for APTPL and forgets it when the last APTPL bit received
/// was zero; a LUN that several gateways present in turn saves every change
/// ([`Lun::with_shared_reservations`]).
pub type PrStore = Box<dyn Fn(Option<&PrState>) -> Result<(), String> + Send + Sync>;

/// What the reservation commands share.
#[derive(Default)]
struct Reservations {
    pr: PrState,
    /// The nexus holding an SPC-2 reservation.
    legacy: Option<u64>,
}

struct NexusState {
    /// The port's current session, or its last one.
    nexus: Nexus,
    ua: VecDeque<Sense>,
    /// When the port's last session ended (an order among the LUN's losses, not a time);
    /// None while a session is using it.
    lost: Option<u64>,
}

pub struct Lun {
    /// The storage: a vdisk, or memory in tests.
    pub(crate) backend: Arc<dyn BlockBackend>,
    /// Where the transport reports each command it answers, if anywhere.
    meter: Option<Arc<dyn IoMeter>>,
    /// 16-byte NAA IEEE Registered Extended identifier, stable for the vdisk.
    pub(crate) naa: [u8; 16],
    pub(crate) serial: String,
    pub(crate) read_only: bool,
    pub(crate) mode: Mutex<ModeState>,
    /// How many times mode settings were taken here (changed here, or read from the
    /// owner's records by a standby port, whether they differed or not). Changed only under
    /// `mode`'s lock: a forwarded MODE SELECT learns by it whether settings were taken
    /// while it was away.
    mode_taken: AtomicU64,
    /// Where MODE SELECT saves the settings; None: they last as long as the LUN.
    pub(crate) mode_store: Option<ModeStore>,
    /// Writes hold it shared; COMPARE AND WRITE holds it exclusively, so that no write to the
    /// LUN lands between its compare and its write.
    pub(crate) atomic: Arc<RwLock<()>>,
    /// Every I_T nexus that has used the LUN, by initiator port, with the unit attentions
    /// waiting for it; those whose session ended are kept (MAX_LOST_NEXUSES, at most).
    nexuses: Mutex<Ports>,
    /// Sessions ended so far, to order the lost nexuses.
    losses: AtomicU64,
    reservations: Mutex<Reservations>,
    pr_store: Option<PrStore>,
    /// Every change of the persistent reservations is saved, whatever APTPL says: the LUN is
    /// presented by several gateways in turn, and the next one must find them as they were.
    pr_shared: bool,
    /// The unit attention every nexus finds at its first command, if any: a LUN presented
    /// by the gateway that took its pool over tells each host so.
    first_contact: Option<Sense>,
    /// The reservations and mode settings are the owner gateway's: a port that is not active
    /// refuses the commands that read or change them ([`Lun::with_state_at_owner`]).
    state_at_owner: bool,
    /// Where a standby port sends the persistent reservation and MODE SELECT commands it
    /// receives, when the reservations and mode settings are the owner's
    /// ([`OwnerForwarding`]).
    forwarding: Option<Arc<dyn OwnerForwarding>>,
    /// Commands hold it shared while they run; reservation changes take it exclusively, so
    /// that no command admitted under the old reservation is still running when PREEMPT (AND
    /// ABORT) completes. In an Arc so that a READ on a transport's ring holds it until its
    /// data has arrived (planned.rs).
    pub(crate) fence: Arc<RwLock<()>>,
    /// Reservation changes and resets waiting for the fence (or holding it): a copy running
    /// under the fence stops at its next chunk for them (`paste_chunked`), rather than hold
    /// them, and every command queued behind them, until it has moved all it was asked to.
    fence_wanted: AtomicUsize,
    /// Tokens and copy results: the daemon's, or this LUN's own.
    pub(crate) tpc: Arc<CopyManager>,
    /// The target port groups the LUN is reached through and their access states.
    pub(crate) alua: Arc<dyn PortGroups>,
}

/// How a standby port reaches the gateway that owns its logical unit, for the persistent
/// reservation and MODE SELECT commands it receives. SPC-4 (5.16.2.4.4) has a port in
/// standby serve PERSISTENT RESERVE IN and OUT and MODE SELECT, and hosts rely on it:
/// Linux's mpathpersist sends a REGISTER down every path, standby ones included, and fails
/// the registration if one path refuses it. The reservations and mode settings live at the
/// owner (it enforces them on every command, and keeps them), so the owner runs them
/// ([`Lun::execute_forwarded`]).
pub trait OwnerForwarding: Send + Sync {
    /// Runs `cdb` (with `data` out) at the owner of the logical unit of designator `naa`,
    /// as from `nexus`'s initiator port; None when no answer came in time.
    fn forward(&self, naa: &[u8; 16], nexus: &Nexus, cdb: &[u8], data: &[u8]) -> Option<OwnerAnswer>;
}

/// What the owner answered a command a standby port forwarded
/// ([`Lun::execute_forwarded`]).
pub struct OwnerAnswer {
    pub response: Response,
    /// The mode settings at the owner once a MODE SELECT it ran took effect: the standby
    /// port takes them rather than keep its own copy, which may lag behind a change made
    /// at the owner. None for any other command (or from an owner that does not say).
    pub mode: Option<ModeState>,
}

impl From<Response> for OwnerAnswer {
    /// An answer that carries no mode settings.
    fn from(response: Response) -> OwnerAnswer {
        OwnerAnswer { response, mode: None }
    }
}

/// Whether a standby port passes command `op` to the owner: the commands SPC-4 has a port
/// in standby serve whose state is the owner's.
fn forwardable(op: u8) -> bool {
    matches!(
        op,
        PERSISTENT_RESERVE_IN | PERSISTENT_RESERVE_OUT | MODE_SELECT_6 | MODE_SELECT_10
    )
}

/// Unit attentions kept per nexus, at most; older ones give way.
const MAX_PENDING_UA: usize = 8;
/// Nexuses with no session kept per LUN, at most: enough for the hosts of a SAN to come back
/// to what they missed, while initiators that take a new ISID for every session (libiscsi
/// does) cannot make the table grow without end. The longest lost give way.
const MAX_LOST_NEXUSES: usize = 256;

/// Queues `s` behind the unit attentions already pending, dropping the oldest when full. A
/// condition already pending is not queued twice: a port whose sessions end one after the
/// other (a tool run again and again) hears of the loss once, not once per session.
fn queue_unit_attention(q: &mut VecDeque<Sense>, s: Sense) {
    if q.contains(&s) {
        return;
    }
    if q.len() >= MAX_PENDING_UA {
        q.pop_front();
    }
    q.push_back(s);
}

/// The IEEE company id in the NAA identifier: a locally administered value.
const NAA_OUI: u32 = 0x00_1405;

/// The NAA designator (VPD page 0x83) of the logical unit of `uid` ([`Lun::new`]).
pub fn naa_of(uid: u128) -> [u8; 16] {
    let mut naa = [0u8; 16];
    // NAA 6: 4-bit NAA, 24-bit OUI, 36-bit vendor specific + 64-bit extension.
    let v = uid.to_be_bytes();
    naa[0] = 0x60 | ((NAA_OUI >> 20) & 0x0F) as u8;
    naa[1] = (NAA_OUI >> 12) as u8;
    naa[2] = (NAA_OUI >> 4) as u8;
    naa[3] = ((NAA_OUI & 0x0F) << 4) as u8 | (v[4] & 0x0F);
    naa[4..16].copy_from_slice(&v[4..16]);
    naa
}

impl Lun {
    /// `uid` distinguishes vdisks across pools (a pool id with the vdisk id, say).
    pub fn new(backend: Arc<dyn BlockBackend>, uid: u128, read_only: bool) -> Lun {
        let naa = naa_of(uid);
        let v = uid.to_be_bytes();
        let serial: String = v[8..16].iter().map(|b| format!("{b:02x}")).collect();
        Lun {
            backend,
            meter: None,
            naa,
            serial,
            read_only,
            mode: Mutex::new(ModeState::default()),
            mode_taken: AtomicU64::new(0),
            mode_store: None,
            atomic: Arc::new(RwLock::new(())),
            nexuses: Mutex::new(HashMap::new()),
            losses: AtomicU64::new(0),
            reservations: Mutex::new(Reservations::default()),
            pr_store: None,
            pr_shared: false,
            first_contact: None,
            state_at_owner: false,
            forwarding: None,
            fence: Arc::new(RwLock::new(())),
            fence_wanted: AtomicUsize::new(0),
            tpc: Arc::new(CopyManager::new()),
            alua: Arc::new(SinglePort),
        }
    }

    /// Reached through the target port groups `groups` reports (several gateways presenting
    /// one vdisk) instead of one always active port.
    pub fn with_port_groups(mut self, groups: Arc<dyn PortGroups>) -> Lun {
        self.alua = groups;
        self
    }

    /// The relative target ports the LUN is reached through: its one port, or those of the
    /// gateways that present it, as REPORT TARGET PORT GROUPS lists them.
    fn relative_ports(&self) -> TargetPorts {
        let (group, port) = self.alua.local();
        if group == 0 {
            return TargetPorts::One(port);
        }
        let mut ports: Vec<u16> = self.alua.groups().into_iter().flat_map(|g| g.ports).collect();
        ports.push(port);
        ports.sort_unstable();
        ports.dedup();
        TargetPorts::Gateways(ports)
    }

    /// The local target port group's state changed (a takeover, a release): every nexus
    /// learns of it with ASYMMETRIC ACCESS STATE CHANGED and reads the groups again.
    pub fn access_state_changed(&self) {
        self.unit_attention(sense::ASYMMETRIC_ACCESS_STATE_CHANGED, None);
    }

    /// Whether the local port group lets `cmd` through, asking for access (implicit ALUA)
    /// when a command that reads or writes the medium arrives at a group that is not active.
    fn alua_admits(&self, cmd: &Command) -> Result<(), Sense> {
        let state = self.alua.local_state();
        let owners = matches!(
            cmd.op,
            PERSISTENT_RESERVE_IN
                | PERSISTENT_RESERVE_OUT
                | RESERVE_6
                | RESERVE_10
                | RELEASE_6
                | RELEASE_10
                | MODE_SELECT_6
                | MODE_SELECT_10
        );
        if self.state_at_owner && owners && !state.active() {
            return Err(state.refusal());
        }
        match alua::admits(state, cmd.op, cmd.sa) {
            Err(_) if cmd.access != Access::Always && state == AccessState::Standby => {
                alua::admits(self.alua.request_access(), cmd.op, cmd.sa)
            }
            r => r,
        }
    }

    /// The LUN with each command its transport answers reported to `meter`.
    pub fn with_meter(mut self, meter: Arc<dyn IoMeter>) -> Lun {
        self.meter = Some(meter);
        self
    }

    pub fn meter(&self) -> Option<&Arc<dyn IoMeter>> {
        self.meter.as_ref()
    }

    /// Shares `cm` with the other LUNs of the daemon: tokens made on one can be written
    /// through another.
    pub fn with_copy_manager(mut self, cm: Arc<CopyManager>) -> Lun {
        self.tpc = cm;
        self
    }

    /// Starts from `state` (as saved) and saves persistent reservations through `store`.
    pub fn with_persistent_reservations(mut self, state: PrState, store: PrStore) -> Lun {
        self.reservations.get_mut().pr = state;
        self.pr_store = Some(store);
        self
    }

    /// Starts from `state` (as the last gateway to present the LUN left it) and saves every
    /// change of the persistent reservations through `store` before the command that made it
    /// completes: the gateway that presents the LUN next (after a takeover) goes on from
    /// there. Losing the gateway is not a power loss of the logical unit, so the state is kept
    /// whether or not APTPL was asked for.
    pub fn with_shared_reservations(mut self, state: PrState, store: PrStore) -> Lun {
        self = self.with_persistent_reservations(state, store);
        self.pr_shared = true;
        self
    }

    /// For a LUN presented by a gateway that does not own it (a standby port): its
    /// reservations and mode settings are kept by the owner, so while this port is not active
    /// PERSISTENT RESERVE IN and OUT, RESERVE, RELEASE and MODE SELECT are answered with the
    /// port's state (NOT READY, TARGET PORT IN STANDBY STATE) and go through an active path,
    /// rather than answered from a copy that may be stale or changed where nobody keeps it.
    pub fn with_state_at_owner(mut self) -> Lun {
        self.state_at_owner = true;
        self
    }

    /// Has a standby port of this LUN, whose reservations and mode settings are the
    /// owner's, run the PERSISTENT RESERVE IN and OUT and MODE SELECT it receives at the
    /// owner through `f`, rather than refuse them.
    pub fn with_owner_forwarding(mut self, f: Arc<dyn OwnerForwarding>) -> Lun {
        self.forwarding = Some(f);
        self
    }

    /// A persistent reservation command or MODE SELECT at a standby port whose state is
    /// the owner's, answered by the owner ([`OwnerForwarding`]); None when it is not one,
    /// or the port cannot forward it, and it goes on here.
    fn forwarded(&self, nexus: &Nexus, cmd: &Command, cdb: &[u8], data: &[u8]) -> Option<Response> {
        let f = self.forwarding.as_ref()?;
        if !self.state_at_owner || !forwardable(cmd.op) || self.alua.local_state() != AccessState::Standby {
            return None;
        }
        let taken_before = {
            let _mode = self.mode.lock();
            self.mode_taken.load(Ordering::Relaxed)
        };
        // Held while the owner runs it, as a command run here holds it: a LUN reset here
        // waits for it (SAM: a reset ends the tasks of every nexus before it completes).
        let answered = {
            let _fence = self.fence.read();
            f.forward(&self.naa, nexus, cdb, data)
        };
        // No answer in time (the owner stalled, or is being replaced): the host tries again,
        // and finds this port or another active by then.
        let Some(answer) = answered else {
            return Some(self.respond(Err(sense::ALUA_TRANSITION)));
        };
        let r = answer.response;
        if r.status == sense::GOOD && matches!(cmd.op, MODE_SELECT_6 | MODE_SELECT_10) {
            self.take_forwarded_mode(nexus, cdb, data, answer.mode, taken_before);
        }
        Some(r)
    }

    /// Takes here a MODE SELECT from `nexus` that the owner took, at once (the next reading
    /// of the owner's records agrees): the owner's settings `owners`, unless settings were
    /// taken here since it was forwarded (`taken_before`: an answer may be older than
    /// them), or the owner did not say; the command's own change to the settings here then.
    /// Each nexus is told MODE PARAMETERS CHANGED once: every other one if the settings
    /// changed, the sender only if they differ from what its command alone makes of them
    /// (a change made at the owner that this port had not read yet).
    fn take_forwarded_mode(
        &self,
        nexus: &Nexus,
        cdb: &[u8],
        data: &[u8],
        owners: Option<ModeState>,
        taken_before: u64,
    ) {
        // The command's change is worked out from the settings it is then taken onto: again
        // if others were taken in between (it reads them without the lock, which it takes).
        for _ in 0..8 {
            let seen = {
                let _mode = self.mode.lock();
                self.mode_taken.load(Ordering::Relaxed)
            };
            let own = self.mode_selected(cdb, data);
            let mut mode = self.mode.lock();
            let taken = self.mode_taken.load(Ordering::Relaxed);
            if taken != seen {
                continue;
            }
            let was = *mode;
            // None: this port's copy would refuse it (the owner's, newer, did not).
            let own = match own {
                Ok(own) => Some(own.unwrap_or(was)),
                Err(_) => None,
            };
            let next = match (owners, own) {
                (Some(owners), _) if taken == taken_before => owners,
                (_, Some(own)) => own,
                // Nothing known better here: the next reading of the owner's records says.
                (_, None) => return,
            };
            self.mode_taken.fetch_add(1, Ordering::Relaxed);
            *mode = next;
            drop(mode);
            if next != was {
                self.unit_attention(sense::MODE_PARAMETERS_CHANGED, Some(nexus.id));
            }
            if own.is_some_and(|own| own != next) {
                self.unit_attention_where(sense::MODE_PARAMETERS_CHANGED, |n| n.id == nexus.id);
            }
            return;
        }
    }

    /// Runs a PERSISTENT RESERVE IN or OUT, or a MODE SELECT, that a standby port of this
    /// logical unit at another gateway received from `nexus` (its initiator port:
    /// registrations are kept by it, whatever the target port) and forwarded here
    /// ([`OwnerForwarding`]). The unit
    /// attentions of that nexus are the standby port's to report: none is reported here,
    /// and the nexus is not kept; what the command tells the nexuses kept here (REGISTRATIONS
    /// PREEMPTED, say) reaches them as from any other nexus.
    pub fn execute_forwarded(&self, nexus: &Nexus, cdb: &[u8], data: &[u8]) -> OwnerAnswer {
        let response = self.run_forwarded(nexus, cdb, data);
        // Read once it took effect: a MODE SELECT of another nexus meanwhile only makes them
        // newer, and the standby port shows the owner's settings all the same.
        let mode_select = matches!(cdb.first(), Some(&MODE_SELECT_6 | &MODE_SELECT_10));
        let mode = (mode_select && response.status == sense::GOOD).then(|| self.mode());
        OwnerAnswer { response, mode }
    }

    fn run_forwarded(&self, nexus: &Nexus, cdb: &[u8], data: &[u8]) -> Response {
        let cmd = match command_of(cdb) {
            Ok(cmd) => cmd,
            Err(s) => return self.respond(Err(s)),
        };
        if !forwardable(cmd.op) {
            return self.respond(Err(sense::INVALID_OPCODE));
        }
        // Given up here meanwhile (a handover), or the lease it is owned under in doubt:
        // nothing is run, and the host sends it again. (Its own state would admit
        // reservation commands at a standby port: this LUN is not one whose reservations
        // are another's.)
        if !self.alua.local_state().active() {
            return self.respond(Err(sense::ALUA_TRANSITION));
        }
        if let Err(s) = self.alua_admits(cmd) {
            return self.respond(Err(s));
        }
        if matches!(cmd.op, MODE_SELECT_6 | MODE_SELECT_10) {
            let _fence = self.fence.read();
            if self.reservation_conflict(nexus, cmd) {
                return Response::reservation_conflict();
            }
            return self.respond(self.mode_select(nexus.id, cdb, data));
        }
        self.reservation_command(&Request { nexus, cdb, data })
    }

    /// Queues at this standby port the unit attentions that the owner's logical unit raised
    /// for initiator ports ([`PortGroups::attentions_raised`] there): each reaches this
    /// port's sessions of its initiator port, as it reached the owner's. Nothing happens
    /// unless this port's reservations are the owner's and it is not active: an active port
    /// raises its own.
    pub fn attentions_from_owner(&self, notices: &[(PortId, Sense)]) {
        if !self.state_at_owner || self.alua.local_state().active() {
            return;
        }
        for (port, s) in notices {
            self.unit_attention_where(*s, |m| port.matches(m));
        }
    }

    /// Every nexus's first command finds the unit attention `s` (then whatever follows). A
    /// gateway that took a pool over presents its LUNs with POWER ON, RESET, OR BUS DEVICE
    /// RESET OCCURRED: to a host this logical unit was just started here, and that unit
    /// attention, above every other, tells it to read the reservations and the port states
    /// again (it stands for the reservation unit attentions the last owner had queued for
    /// its nexuses, which went with it).
    pub fn with_first_contact_attention(mut self, s: Sense) -> Lun {
        self.first_contact = Some(s);
        self
    }

    /// Starts from the mode settings `m`, saving no change (a standby port shows the owner's).
    pub fn with_mode(mut self, m: ModeState) -> Lun {
        *self.mode.get_mut() = m;
        self
    }

    /// The mode settings became `m` elsewhere (at the gateway that owns the LUN's pool, for
    /// a standby port that shows them): every nexus learns of it with MODE PARAMETERS
    /// CHANGED, as the owner's nexuses did.
    pub fn mode_changed_elsewhere(&self, m: ModeState) {
        self.take_mode(m, None);
    }

    /// Takes mode settings `m`: the settings are the LUN's, shared by every nexus, so every
    /// other one than `except` learns of a change (SPC-4 MODE PARAMETERS CHANGED) before
    /// anything else it sends. Nothing happens when they are the settings already.
    pub(crate) fn take_mode(&self, m: ModeState, except: Option<u64>) {
        let mut mode = self.mode.lock();
        self.mode_taken.fetch_add(1, Ordering::Relaxed);
        if *mode == m {
            return;
        }
        *mode = m;
        drop(mode);
        self.unit_attention(sense::MODE_PARAMETERS_CHANGED, except);
    }

    /// Starts from the saved mode settings (the defaults when none were saved) and saves
    /// every change MODE SELECT makes through `store`.
    pub fn with_saved_mode(mut self, saved: Option<ModeState>, store: ModeStore) -> Lun {
        *self.mode.get_mut() = saved.unwrap_or_default();
        self.mode_store = Some(store);
        self
    }

    /// The access state of this daemon's port, for display; None for a LUN served by this
    /// daemon alone (one group, 0, always active/optimized).
    pub fn access(&self) -> Option<AccessState> {
        let state = self.alua.local_state();
        (self.alua.local().0 != 0 || state != AccessState::ActiveOptimized).then_some(state)
    }

    /// The persistent reservation state, for display.
    pub fn reservations(&self) -> PrState {
        self.reservations.lock().pr.clone()
    }

    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.backend
    }

    /// The NAA designator of VPD page 0x83, by which copy descriptors name the LUN.
    pub fn naa(&self) -> &[u8; 16] {
        &self.naa
    }

    pub fn block_size(&self) -> u64 {
        self.backend.block_size() as u64
    }

    pub fn blocks(&self) -> u64 {
        self.backend.size() / self.block_size()
    }

    pub fn thin(&self) -> bool {
        self.backend.thin()
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

    /// Runs one command for the local nexus. Blocking: it does the vdisk I/O.
    pub fn execute(&self, cdb: &[u8], data_out: &[u8]) -> Response {
        self.execute_for(&Nexus::local(), cdb, data_out)
    }

    /// Runs one command for the I_T nexus `nexus` (an iSCSI session, say). A pending unit
    /// attention for that nexus is reported first, except to INQUIRY and REPORT LUNS; REQUEST
    /// SENSE returns it as its data.
    pub fn execute_for(&self, nexus: &Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
        let op = cdb.first().copied().unwrap_or(0xFF);
        let reported = self.unit_attentions(nexus, |q| {
            if q.is_empty() || op == INQUIRY || op == REPORT_LUNS {
                return None;
            }
            let s = q.pop_front().expect("not empty");
            if op == REQUEST_SENSE && cdb.len() >= 6 {
                let mut d = s.encode(cdb[1] & 0x01 != 0);
                d.truncate(cdb[4] as usize);
                return Some(Response {
                    status: sense::GOOD,
                    data: d.into(),
                    sense: Vec::new(),
                });
            }
            Some(Response {
                status: sense::CHECK_CONDITION,
                data: Data::default(),
                sense: self.sense_bytes(s),
            })
        });
        if let Some(r) = reported {
            return r;
        }
        // Every command past this point has its whole CDB, and a row in the command table
        // that says how reservations treat it and what runs it.
        let cmd = match command_of(cdb) {
            Ok(cmd) => cmd,
            Err(s) => return self.respond(Err(s)),
        };
        let req = Request {
            nexus,
            cdb,
            data: data_out,
        };
        if let Some(r) = self.forwarded(nexus, cmd, cdb, data_out) {
            return r;
        }
        if let Err(s) = self.alua_admits(cmd) {
            return self.respond(Err(s));
        }
        if let Handler::Reservation(own_rules) = cmd.handler {
            return own_rules(self, &req);
        }
        let _fence = self.fence.read();
        if self.reservation_conflict(nexus, cmd) {
            return Response::reservation_conflict();
        }
        let mut ran = None;
        self.backend
            .as_writer(&nexus.initiator, &mut || ran = Some(self.run(cmd, &req)));
        self.respond_data(ran.expect("run"))
    }

    /// Runs `(cdb, data_out)` commands of one nexus as [`execute_for`](Self::execute_for)
    /// would, one response each, in order. Consecutive READs are admitted together and their
    /// blocks read as one batch (one submission to each disk), which is what a queue of small
    /// reads from one initiator needs; every other command runs on its own.
    pub fn execute_many_for(&self, nexus: &Nexus, cmds: &[(&[u8], &[u8])]) -> Vec<Response> {
        let mut out: Vec<Option<Response>> = cmds.iter().map(|_| None).collect();
        let is_read = |cdb: &[u8]| cdb.first().copied().is_some_and(commands::is_read);
        let mut i = 0;
        while i < cmds.len() {
            if is_read(cmds[i].0) {
                // Admitted and read under one hold of the fence, as a single command is.
                let _fence = self.fence.read();
                let mut reads = Vec::new();
                let mut at = Vec::new();
                while i < cmds.len() && is_read(cmds[i].0) {
                    match self.admit_read(nexus, cmds[i].0) {
                        Some(Ok(Some(blocks))) => {
                            reads.push(blocks);
                            at.push(i);
                        }
                        Some(Ok(None)) => out[i] = Some(self.respond(Ok(Vec::new()))),
                        Some(Err(r)) => out[i] = Some(r),
                        // A unit attention to report: the single path does that, below.
                        None => break,
                    }
                    i += 1;
                }
                for (j, r) in at.into_iter().zip(self.read_blocks_many(&reads)) {
                    out[j] = Some(self.respond_data(r.map(Data::Blocks)));
                }
            }
            if i < cmds.len() && out[i].is_none() {
                out[i] = Some(self.execute_for(nexus, cmds[i].0, cmds[i].1));
                i += 1;
            }
        }
        out.into_iter().map(|r| r.expect("every command answered")).collect()
    }

    /// What execute_for checks before it runs a READ, for a batch: None if a unit attention
    /// waits for the nexus or this port is not active (execute_for then runs it, asking for
    /// access), else the blocks to read (None for none) or the answer instead.
    /// The caller holds the fence.
    pub(crate) fn admit_read(&self, nexus: &Nexus, cdb: &[u8]) -> Option<Result<Option<(u64, u64)>, Response>> {
        if self.unit_attentions(nexus, |q| !q.is_empty()) {
            return None;
        }
        // Never asks for access here, on a transport's receiving thread: a standby port's
        // takeover may wait on the cluster, and runs on the ordinary path.
        if !self.alua.local_state().active() {
            return None;
        }
        let cmd = match command_of(cdb) {
            Ok(cmd) => cmd,
            Err(s) => return Some(Err(self.respond(Err(s)))),
        };
        if let Err(s) = self.alua_admits(cmd) {
            return Some(Err(self.respond(Err(s))));
        }
        if self.reservation_conflict(nexus, cmd) {
            return Some(Err(Response::reservation_conflict()));
        }
        Some(self.plan_read(cdb).map_err(|s| self.respond(Err(s))))
    }

    /// What execute_for checks before it runs a WRITE, for a transport that starts its disk
    /// writes itself: the blocks to write, or None when the command must run the ordinary way
    /// (a unit attention to report, a port not active here or a refusal to answer, a
    /// reservation in the way, a write-protected LUN, a range to refuse). FUA, and the write
    /// cache off, need nothing more: a planned write is answered once its disks say it is as
    /// durable as a flush makes it ([`BlockBackend::try_plan_write`]). The caller holds the
    /// fence.
    pub(crate) fn admit_write(&self, nexus: &Nexus, cdb: &[u8]) -> Option<(u64, u64)> {
        if !matches!(cdb.first(), Some(&(WRITE_10 | WRITE_12 | WRITE_16))) {
            return None;
        }
        if self.unit_attentions(nexus, |q| !q.is_empty()) {
            return None;
        }
        let cmd = command_of(cdb).ok()?;
        // Never asks for access: a standby port's takeover runs on the ordinary path.
        alua::admits(self.alua.local_state(), cmd.op, cmd.sa).ok()?;
        if self.reservation_conflict(nexus, cmd) || self.write_protected() {
            return None;
        }
        let r = self.checked_range(cdb, true).ok()?;
        if r.blocks == 0 {
            return None;
        }
        Some((r.lba, r.blocks))
    }

    /// Runs `f` on the unit attentions waiting for `nexus`, registering the nexus first so
    /// that later unit attentions (resets, capacity changes) reach it. A new session of a
    /// port takes over what its last session left.
    fn unit_attentions<R>(&self, nexus: &Nexus, f: impl FnOnce(&mut VecDeque<Sense>) -> R) -> R {
        let mut all = self.nexuses.lock();
        if !all.contains_key(nexus.initiator.as_str()) {
            all.insert(nexus.initiator.clone(), HashMap::new());
        }
        let ports = all.get_mut(nexus.initiator.as_str()).expect("inserted above");
        let entry = ports.entry(nexus.isid).or_insert_with(|| NexusState {
            nexus: nexus.clone(),
            ua: self.first_contact.into_iter().collect(),
            lost: None,
        });
        if entry.nexus.id != nexus.id {
            entry.nexus = nexus.clone();
            entry.lost = None;
        }
        f(&mut entry.ua)
    }

    /// Whether a reservation (SPC-2 or persistent) keeps the nexus from running the command.
    fn reservation_conflict(&self, nexus: &Nexus, cmd: &Command) -> bool {
        let r = self.reservations.lock();
        let legacy_conflict = r.legacy.is_some_and(|h| h != nexus.id) && !cmd.legacy_ok;
        legacy_conflict || !r.pr.allows(nexus, cmd.access)
    }

    /// Whether a third-party copy issued by `nexus` may read (`write` false: a source) or
    /// write this LUN: no SPC-2 or persistent reservation of another nexus in the way, as if
    /// the nexus had sent the READ or WRITE itself.
    /// A LUN whose local port group is not active takes part only once access is granted.
    pub(crate) fn copy_allowed(&self, nexus: &Nexus, write: bool) -> bool {
        let state = match self.alua.local_state() {
            AccessState::Standby => self.alua.request_access(),
            s => s,
        };
        if !state.active() {
            return false;
        }
        let r = self.reservations.lock();
        let access = if write { Access::Write } else { Access::Read };
        r.legacy.is_none_or(|h| h == nexus.id) && r.pr.allows(nexus, access)
    }

    pub(crate) fn respond(&self, r: CmdResult) -> Response {
        self.respond_data(r.map(Data::Bytes))
    }

    pub(crate) fn respond_data(&self, r: Result<Data, Sense>) -> Response {
        match r {
            Ok(data) => Response {
                status: sense::GOOD,
                data,
                sense: Vec::new(),
            },
            Err(s) => Response {
                status: sense::CHECK_CONDITION,
                data: Data::default(),
                sense: self.sense_bytes(s),
            },
        }
    }

    /// Queues a unit attention for every nexus that has used the LUN, but `except`.
    pub fn unit_attention(&self, s: Sense, except: Option<u64>) {
        self.unit_attention_where(s, |n| Some(n.id) != except);
    }

    fn unit_attention_where(&self, s: Sense, pick: impl Fn(&Nexus) -> bool) {
        for e in self.nexuses.lock().values_mut().flat_map(|ports| ports.values_mut()) {
            if pick(&e.nexus) {
                queue_unit_attention(&mut e.ua, s);
            }
        }
    }

    /// PERSISTENT RESERVE IN/OUT, RESERVE and RELEASE.
    pub(crate) fn reservation_command(&self, req: &Request) -> Response {
        let (n, cdb, d) = (req.nexus, req.cdb, req.data);
        let conflict = Response::reservation_conflict();
        if cdb[0] == PERSISTENT_RESERVE_IN {
            let _fence = self.fence.read();
            let r = self.reservations.lock();
            let mut data = match r.pr.pr_in(cdb, &self.relative_ports()) {
                Ok(d) => d,
                Err(s) => return self.respond(Err(s)),
            };
            if cdb[1] & 0x1F == 2 && self.pr_store.is_none() {
                data[2] &= !0x01; // PTPL_C: nowhere to persist to
            }
            return self.respond(Ok(alloc(data, be16(&cdb[7..9]) as usize)));
        }
        let _fence = self.fence_exclusive();
        let mut guard = self.reservations.lock();
        let r = &mut *guard;
        if cdb[0] != PERSISTENT_RESERVE_OUT {
            return match pr::legacy(&r.pr, &mut r.legacy, n, cdb) {
                Outcome::Good => self.respond(Ok(Vec::new())),
                Outcome::Check(s) => self.respond(Err(s)),
                Outcome::Conflict => conflict,
            };
        }
        if r.legacy.is_some_and(|h| h != n.id) {
            return conflict;
        }
        let wants_aptpl = match cdb[1] & 0x1F {
            0 | 6 => d.get(20).is_some_and(|b| b & 1 != 0),
            7 => d.get(17).is_some_and(|b| b & 1 != 0),
            _ => false,
        };
        if wants_aptpl && self.pr_store.is_none() {
            return self.respond(Err(sense::INVALID_FIELD_IN_PARAMETER_LIST));
        }
        // Reservations that gateways keep in turn change only while this port is active:
        // given up while the command waited for those in flight (a handover), nothing is
        // changed or saved here, and the host sends it again, to the next owner.
        if self.pr_shared && !self.alua.local_state().active() {
            return self.respond(Err(sense::ALUA_TRANSITION));
        }
        let before = r.pr.clone();
        let mut notices = Vec::new();
        match r.pr.pr_out(n, cdb, d, &self.relative_ports(), &mut notices) {
            Outcome::Good => {}
            other => {
                r.pr = before;
                return match other {
                    Outcome::Check(s) => self.respond(Err(s)),
                    _ => conflict,
                };
            }
        }
        if let Some(store) = &self.pr_store {
            if r.pr != before && (self.pr_shared || r.pr.aptpl || before.aptpl) {
                if let Err(e) = store((self.pr_shared || r.pr.aptpl).then_some(&r.pr)) {
                    warn!(lun = %self.backend.name(), error = %e, "cannot save persistent reservations");
                    r.pr = before;
                    return self.respond(Err(sense::INTERNAL_TARGET_FAILURE));
                }
            }
        }
        drop(guard);
        for (port, s) in &notices {
            self.unit_attention_where(*s, |m| m.id != n.id && port.matches(m));
        }
        if self.pr_shared && !notices.is_empty() && self.alua.local_state().active() {
            self.alua.attentions_raised(&self.naa, &notices);
        }
        self.respond(Ok(Vec::new()))
    }

    /// LUN RESET (or a target reset) asked by `from`: every nexus learns of it, the one that
    /// asked included (as libiscsi's multipath test expects of every path). SPC-2
    /// reservations end; persistent ones stay.
    pub fn reset(&self, from: u64) {
        let _ = from;
        self.reservations.lock().legacy = None;
        self.unit_attention(sense::BUS_DEVICE_RESET_OCCURRED, None);
    }

    /// Returns once no command admitted before the call still runs on the LUN, whatever
    /// nexus sent it (new ones wait meanwhile): a LUN or target reset is answered only then,
    /// so that no write sent before it lands after its answer.
    pub fn wait_for_commands(&self) {
        drop(self.fence_exclusive());
    }

    /// The fence, exclusively, the wait for it known to the copies under way
    /// (`fence_wanted`).
    fn fence_exclusive(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        struct Wanting<'a>(&'a AtomicUsize);
        impl Drop for Wanting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.fence_wanted.fetch_add(1, Ordering::SeqCst);
        let _wanting = Wanting(&self.fence_wanted);
        self.fence.write()
    }

    /// Whether a reservation change or a reset waits for the LUN's commands to end.
    pub fn fence_wanted(&self) -> bool {
        self.fence_wanted.load(Ordering::SeqCst) > 0
    }

    /// The vdisk grew: every nexus learns of it.
    pub fn capacity_changed(&self) {
        self.unit_attention(sense::CAPACITY_DATA_CHANGED, None);
    }

    /// The I_T nexus `nexus` can no longer address this LUN (it was taken out of the
    /// session's target, while another target still presents it): its SPC-2 reservation and
    /// its copy results end, as they would with the nexus; no command of it could release
    /// them, and the reservation would refuse every other host until a LUN reset.
    pub fn unreachable_from(&self, nexus: u64) {
        self.tpc.forget_nexus(nexus);
        let mut r = self.reservations.lock();
        if r.legacy == Some(nexus) {
            r.legacy = None;
        }
    }

    /// A session of the nexus ended (logout, a dropped connection, a reinstatement): its
    /// SPC-2 reservation and copy results end with it (SAM's I_T nexus loss); the port's next
    /// session is told with I_T NEXUS LOSS OCCURRED, after any unit attention still pending.
    /// Persistent reservations are the port's and stay.
    pub fn nexus_lost(&self, nexus: &Nexus) {
        self.unreachable_from(nexus.id);
        let mut all = self.nexuses.lock();
        let Some(entry) = all
            .get_mut(nexus.initiator.as_str())
            .and_then(|ports| ports.get_mut(&nexus.isid))
        else {
            return; // the session never used the LUN
        };
        queue_unit_attention(&mut entry.ua, sense::I_T_NEXUS_LOSS_OCCURRED);
        // A reinstating session may have taken the port over already; then it is not lost.
        if entry.nexus.id != nexus.id {
            return;
        }
        entry.lost = Some(self.losses.fetch_add(1, Ordering::Relaxed));
        let lost = all
            .values()
            .flat_map(|ports| ports.values())
            .filter(|e| e.lost.is_some())
            .count();
        if lost > MAX_LOST_NEXUSES {
            let oldest = all
                .values()
                .flat_map(|ports| ports.values())
                .filter(|e| e.lost.is_some())
                .min_by_key(|e| e.lost)
                .map(|e| (e.nexus.initiator.clone(), e.nexus.isid));
            if let Some((initiator, isid)) = oldest {
                if let Some(ports) = all.get_mut(&initiator) {
                    ports.remove(&isid);
                    if ports.is_empty() {
                        all.remove(&initiator);
                    }
                }
            }
        }
    }

    /// Maps a backend error to sense: lack of space is SPACE ALLOCATION FAILED WRITE PROTECT
    /// (never silent loss), lost redundancy a medium error.
    pub(crate) fn io_sense(&self, e: BackendError, writing: bool) -> Sense {
        if e.kind == BackendErrorKind::NoSpace {
            return sense::SPACE_ALLOCATION_FAILED_WRITE_PROTECT;
        }
        warn!(lun = %self.backend.name(), error = %e, "I/O failed");
        match e.kind {
            BackendErrorKind::Refused => sense::ALUA_TRANSITION,
            BackendErrorKind::Medium if writing => sense::WRITE_ERROR,
            BackendErrorKind::Medium => sense::UNRECOVERED_READ_ERROR,
            _ => sense::INTERNAL_TARGET_FAILURE,
        }
    }
}
