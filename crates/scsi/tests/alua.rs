//! Implicit ALUA as a host sees it through one gateway of several: a standby port answers
//! discovery and refuses the medium with the sense multipath drivers act on, a write that
//! arrives there asks for the LUN (and runs once it is granted, or is refused unchanged while
//! the takeover is under way), the groups and this port's ids are reported, and a change of
//! state reaches every nexus as a unit attention.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tessera_scsi::{
    sense, AccessState, Lun, Nexus, OwnerAnswer, OwnerForwarding, PortGroup, PortGroups, PortId, PrState, RamBackend,
    Response, Sense,
};

const MIB: u64 = 1 << 20;

/// A gateway's view of two groups: its own (2, port 2) and the other gateway's (1, port 1).
/// `grant` is the state a request for access leads to.
struct TwoGateways {
    state: AtomicU8,
    grant: AtomicU8,
    requests: AtomicUsize,
    /// What the logical unit told the other gateways (`attentions_raised`).
    raised: Mutex<Vec<([u8; 16], Vec<(PortId, Sense)>)>>,
}

fn state_of(v: u8) -> AccessState {
    match v {
        0 => AccessState::ActiveOptimized,
        2 => AccessState::Standby,
        3 => AccessState::Unavailable,
        _ => AccessState::Transitioning,
    }
}

impl TwoGateways {
    fn new(state: AccessState, grant: AccessState) -> Arc<TwoGateways> {
        Arc::new(TwoGateways {
            state: AtomicU8::new(state.code()),
            grant: AtomicU8::new(grant.code()),
            requests: AtomicUsize::new(0),
            raised: Mutex::default(),
        })
    }
}

impl PortGroups for TwoGateways {
    fn groups(&self) -> Vec<PortGroup> {
        let mine = self.local_state();
        let other = if mine.active() {
            AccessState::Standby
        } else {
            AccessState::ActiveOptimized
        };
        vec![
            PortGroup {
                id: 1,
                state: other,
                preferred: !mine.active(),
                ports: vec![1],
            },
            PortGroup {
                id: 2,
                state: mine,
                preferred: mine.active(),
                ports: vec![2],
            },
        ]
    }

    fn local(&self) -> (u16, u16) {
        (2, 2)
    }

    fn local_state(&self) -> AccessState {
        state_of(self.state.load(Ordering::SeqCst))
    }

    fn request_access(&self) -> AccessState {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let g = self.grant.load(Ordering::SeqCst);
        self.state.store(g, Ordering::SeqCst);
        state_of(g)
    }

    fn attentions_raised(&self, naa: &[u8; 16], notices: &[(PortId, Sense)]) {
        self.raised.lock().unwrap().push((*naa, notices.to_vec()));
    }
}

fn lun(groups: Arc<TwoGateways>) -> Lun {
    Lun::new(Arc::new(RamBackend::new("ram", 4 * MIB, 512)), 7, false).with_port_groups(groups)
}

fn nexus(id: u64) -> Nexus {
    Nexus::new(
        id,
        &format!("iqn.2026-11.io.example:host{id}"),
        [0x40, 0, 0, 0, 0, id as u8],
    )
}

/// The sense key, ASC and ASCQ of a CHECK CONDITION, in fixed or descriptor format; None for
/// any other status.
fn sense_of(r: &tessera_scsi::Response) -> Option<(u8, u8, u8)> {
    (r.status == sense::CHECK_CONDITION).then(|| match r.sense[0] & 0x7F {
        0x72 | 0x73 => (r.sense[1] & 0x0F, r.sense[2], r.sense[3]),
        _ => (r.sense[2] & 0x0F, r.sense[12], r.sense[13]),
    })
}

fn write10(lba: u32) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = 0x2A;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[8] = 1;
    c
}

fn read10(lba: u32) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[8] = 1;
    c
}

const STANDBY: Option<(u8, u8, u8)> = Some((0x2, 0x04, 0x0B));
const TRANSITIONING: Option<(u8, u8, u8)> = Some((0x2, 0x04, 0x0A));

#[test]
fn a_standby_port_answers_discovery_and_refuses_the_medium_without_asking_for_it() {
    let g = TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized);
    let l = lun(g.clone());
    let n = nexus(1);
    let inquiry = [0x12, 0, 0, 0, 96, 0];
    assert_eq!(sense_of(&l.execute_for(&n, &inquiry, &[])), None);
    let mode_sense = [0x1A, 0x08, 0x3F, 0, 255, 0];
    assert_eq!(sense_of(&l.execute_for(&n, &mode_sense, &[])), None);
    // TEST UNIT READY and READ CAPACITY touch no data: refused, and no takeover for them.
    assert_eq!(sense_of(&l.execute_for(&n, &[0, 0, 0, 0, 0, 0], &[])), STANDBY);
    assert_eq!(
        sense_of(&l.execute_for(&n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[])),
        STANDBY
    );
    assert_eq!(g.requests.load(Ordering::SeqCst), 0);
}

#[test]
fn a_write_at_a_standby_port_takes_the_lun_over_and_runs() {
    let g = TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized);
    let l = lun(g.clone());
    let n = nexus(1);
    let block = vec![0x5Au8; 512];
    assert_eq!(sense_of(&l.execute_for(&n, &write10(9), &block)), None);
    assert_eq!(g.requests.load(Ordering::SeqCst), 1);
    assert_eq!(l.execute_for(&n, &read10(9), &[]).data.to_vec(), block);
    assert_eq!(g.requests.load(Ordering::SeqCst), 1, "an active port asks for nothing");
}

/// A READ a transport would start on its ring at a standby port is left to the ordinary
/// path, which may wait for the takeover: the receiving thread never asks for access itself.
#[test]
fn a_read_started_at_a_standby_port_asks_for_nothing_and_runs_the_ordinary_way() {
    let g = TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized);
    let l = lun(g.clone());
    let n = nexus(1);
    assert!(matches!(l.start_read(&n, &read10(9)), tessera_scsi::ReadStart::Execute));
    assert_eq!(
        g.requests.load(Ordering::SeqCst),
        0,
        "the receiving thread asked for access"
    );
    assert_eq!(sense_of(&l.execute_for(&n, &read10(9), &[])), None);
    assert_eq!(g.requests.load(Ordering::SeqCst), 1);
}

#[test]
fn while_the_takeover_is_under_way_the_medium_is_refused_and_left_unchanged() {
    let g = TwoGateways::new(AccessState::Standby, AccessState::Transitioning);
    let l = lun(g.clone());
    let n = nexus(1);
    assert_eq!(sense_of(&l.execute_for(&n, &write10(3), &[0xEE; 512])), TRANSITIONING);
    // Transitioning: refused without asking again, reads included, batched ones too.
    assert_eq!(sense_of(&l.execute_for(&n, &read10(3), &[])), TRANSITIONING);
    let batch = l.execute_many_for(&n, &[(&read10(3), &[]), (&read10(4), &[])]);
    assert!(batch.iter().all(|r| sense_of(r) == TRANSITIONING), "{batch:?}");
    assert_eq!(g.requests.load(Ordering::SeqCst), 1);
    // Granted at last: the block still holds what it held before the refused write.
    g.state.store(AccessState::ActiveOptimized.code(), Ordering::SeqCst);
    assert_eq!(l.execute_for(&n, &read10(3), &[]).data.to_vec(), vec![0u8; 512]);
}

#[test]
fn the_groups_and_this_ports_ids_are_reported() {
    let g = TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized);
    let l = lun(g.clone());
    let n = nexus(1);
    let rtpg = [0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let d = l.execute_for(&n, &rtpg, &[]).data.to_vec();
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 24);
    assert_eq!(
        (d[4] & 0x0F, u16::from_be_bytes([d[6], d[7]])),
        (0x0, 1),
        "the other gateway active"
    );
    assert_eq!(
        (d[16] & 0x0F, u16::from_be_bytes([d[18], d[19]])),
        (0x2, 2),
        "this one standby"
    );
    // VPD 0x83: relative target port 2 in target port group 2.
    let vpd = l.execute_for(&n, &[0x12, 0x01, 0x83, 1, 0, 0], &[]).data.to_vec();
    let find = |kind: u8| {
        let mut at = 4;
        while at + 4 <= vpd.len() {
            let len = vpd[at + 3] as usize;
            if vpd[at + 1] & 0x0F == kind {
                return Some(u16::from_be_bytes([vpd[at + 4 + len - 2], vpd[at + 4 + len - 1]]));
            }
            at += 4 + len;
        }
        None
    };
    assert_eq!(find(0x4), Some(2), "relative target port");
    assert_eq!(find(0x5), Some(2), "target port group");
}

#[test]
fn a_change_of_state_reaches_every_nexus_once() {
    let g = TwoGateways::new(AccessState::ActiveOptimized, AccessState::ActiveOptimized);
    let l = lun(g.clone());
    let (a, b) = (nexus(1), nexus(2));
    for n in [&a, &b] {
        assert_eq!(sense_of(&l.execute_for(n, &read10(0), &[])), None);
    }
    l.access_state_changed();
    for n in [&a, &b] {
        assert_eq!(sense_of(&l.execute_for(n, &read10(0), &[])), Some((0x6, 0x2A, 0x06)));
        assert_eq!(sense_of(&l.execute_for(n, &read10(0), &[])), None);
    }
}

#[test]
fn a_standby_port_whose_state_is_the_owners_refuses_reservations_and_mode_select_until_active() {
    let g = TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized);
    let l = lun(g.clone()).with_state_at_owner();
    let n = nexus(1);
    let mut register = vec![0u8; 24];
    register[8..16].copy_from_slice(&0x1111u64.to_be_bytes());
    let pr_out = [0x5F, 6, 0, 0, 0, 0, 0, 0, 24, 0];
    let read_keys = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let reserve6 = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(sense_of(&l.execute_for(&n, &pr_out, &register)), STANDBY);
    assert_eq!(sense_of(&l.execute_for(&n, &read_keys, &[])), STANDBY);
    assert_eq!(sense_of(&l.execute_for(&n, &reserve6, &[])), STANDBY);
    // MODE SENSE still answers; MODE SELECT of the page as it is is refused.
    let sensed = l.execute_for(&n, &[0x1A, 0x08, 0x08, 0, 255, 0], &[]);
    assert_eq!(sense_of(&sensed), None);
    let mut select = vec![0u8; 4];
    select.extend_from_slice(&sensed.data[4..]);
    let cdb = [0x15, 0x10, 0, 0, select.len() as u8, 0];
    assert_eq!(sense_of(&l.execute_for(&n, &cdb, &select)), STANDBY);
    assert_eq!(g.requests.load(Ordering::SeqCst), 0, "none of them asks for the LUN");
    // Once the port is active (it took the LUN over), they run.
    assert_eq!(sense_of(&l.execute_for(&n, &write10(1), &[0; 512])), None);
    assert_eq!(sense_of(&l.execute_for(&n, &pr_out, &register)), None);
    let keys = l.execute_for(&n, &read_keys, &[]);
    assert_eq!(&keys.data[8..16], &0x1111u64.to_be_bytes());
}

/// The owner's LUN as a standby port reaches it: each forwarded command runs there, unless
/// the owner is "away" (no answer in time).
struct ToOwner {
    owner: Arc<Lun>,
    away: std::sync::atomic::AtomicBool,
    forwarded: AtomicUsize,
    /// Run once the owner ran the next command, before its answer reaches the standby port.
    meanwhile: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl ToOwner {
    fn new(owner: &Arc<Lun>) -> Arc<ToOwner> {
        Arc::new(ToOwner {
            owner: owner.clone(),
            away: Default::default(),
            forwarded: AtomicUsize::new(0),
            meanwhile: Mutex::new(None),
        })
    }
}

impl OwnerForwarding for ToOwner {
    fn forward(&self, naa: &[u8; 16], nexus: &Nexus, cdb: &[u8], data: &[u8]) -> Option<OwnerAnswer> {
        assert_eq!(naa, self.owner.naa(), "forwarded for the same logical unit");
        self.forwarded.fetch_add(1, Ordering::SeqCst);
        if self.away.load(Ordering::SeqCst) {
            return None;
        }
        let answer = self.owner.execute_forwarded(nexus, cdb, data);
        if let Some(meanwhile) = self.meanwhile.lock().unwrap().take() {
            meanwhile();
        }
        Some(answer)
    }
}

fn pr_out(sa: u8, kind: u8, key: u64, sa_key: u64) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    (vec![0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0], p)
}

/// SPC-4 5.16.2.4.4: a standby port serves PERSISTENT RESERVE IN and OUT. Where the
/// reservations are the owner's, it has the owner run them: a host registers and reserves
/// through its standby path (as mpathpersist registers down every path), and the owner
/// enforces it at once; reads of the keys agree on both paths. Other commands are still
/// refused there, and an owner that does not answer makes the host try again.
#[test]
fn a_standby_port_whose_reservations_are_the_owners_has_the_owner_run_them() {
    let owner_ports = TwoGateways::new(AccessState::ActiveOptimized, AccessState::ActiveOptimized);
    let owner = Arc::new(lun(owner_ports.clone()));
    let to_owner = ToOwner::new(&owner);
    let g = TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized);
    let standby = lun(g.clone())
        .with_state_at_owner()
        .with_owner_forwarding(to_owner.clone());
    let (n1, n2) = (nexus(1), nexus(2));
    let read_keys = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let read_reservation = [0x5E, 1, 0, 0, 0, 0, 0, 0x10, 0, 0];

    // Host 1 registers through the owner, host 2 through the standby port.
    let (cdb, p) = pr_out(0, 0, 0, 0x1111);
    assert_eq!(sense_of(&owner.execute_for(&n1, &cdb, &p)), None);
    let (cdb, p) = pr_out(0, 0, 0, 0x2222);
    let r = standby.execute_for(&n2, &cdb, &p);
    assert_eq!((r.status, sense_of(&r)), (0, None));
    for (at, n) in [(&*owner, &n1), (&standby, &n2)] {
        let keys = at.execute_for(n, &read_keys, &[]).data.to_vec();
        assert_eq!(&keys[4..8], &16u32.to_be_bytes(), "two keys on either path: {keys:?}");
    }
    // Host 2 reserves WRITE EXCLUSIVE through the standby port: host 1 is kept out at the
    // owner as soon as the command completed.
    let (cdb, p) = pr_out(1, 1, 0x2222, 0);
    assert_eq!(standby.execute_for(&n2, &cdb, &p).status, 0);
    assert_eq!(
        owner.execute_for(&n1, &write10(0), &[0; 512]).status,
        sense::RESERVATION_CONFLICT
    );
    let res = standby.execute_for(&n2, &read_reservation, &[]).data.to_vec();
    assert_eq!((&res[8..16], res[21]), (&0x2222u64.to_be_bytes()[..], 1), "{res:?}");
    // A wrong key through the standby port is the owner's RESERVATION CONFLICT, unchanged.
    let (cdb, p) = pr_out(2, 1, 0x9999, 0);
    assert_eq!(standby.execute_for(&n2, &cdb, &p).status, sense::RESERVATION_CONFLICT);
    // The medium stays refused at the standby port, and nothing else is forwarded.
    let before = to_owner.forwarded.load(Ordering::SeqCst);
    assert_eq!(sense_of(&standby.execute_for(&n2, &[0, 0, 0, 0, 0, 0], &[])), STANDBY);
    assert_eq!(
        sense_of(&standby.execute_for(&n2, &[0x16, 0, 0, 0, 0, 0], &[])),
        STANDBY,
        "RESERVE (6)"
    );
    assert_eq!(to_owner.forwarded.load(Ordering::SeqCst), before);
    // The owner does not answer: the host is told the port is in transition, and nothing
    // changed.
    to_owner.away.store(true, Ordering::SeqCst);
    let (cdb, p) = pr_out(2, 1, 0x2222, 0);
    assert_eq!(sense_of(&standby.execute_for(&n2, &cdb, &p)), TRANSITIONING);
    to_owner.away.store(false, Ordering::SeqCst);
    assert_eq!(
        owner.execute_for(&n1, &write10(0), &[0; 512]).status,
        sense::RESERVATION_CONFLICT
    );
    // Released through the standby port: host 1 writes again.
    assert_eq!(standby.execute_for(&n2, &cdb, &p).status, 0);
    assert_eq!(sense_of(&owner.execute_for(&n1, &write10(0), &[0; 512])), None);
    // The owner runs nothing but reservations for a standby port.
    assert_eq!(
        sense_of(&owner.execute_forwarded(&n2, &write10(0), &[0; 512]).response),
        Some((0x5, 0x20, 0))
    );
    // An owner whose port is no longer active (it gave the LUN up meanwhile, or doubts its
    // lease) runs nothing forwarded: the host sends it again, to the next owner.
    owner_ports
        .state
        .store(AccessState::Transitioning.code(), Ordering::SeqCst);
    let (cdb, p) = pr_out(0, 0, 0, 0x3333);
    assert_eq!(
        sense_of(&owner.execute_forwarded(&nexus(3), &cdb, &p).response),
        TRANSITIONING
    );
    owner_ports.state.store(AccessState::Standby.code(), Ordering::SeqCst);
    assert_eq!(
        sense_of(&owner.execute_forwarded(&nexus(3), &cdb, &p).response),
        TRANSITIONING
    );
    owner_ports
        .state
        .store(AccessState::ActiveOptimized.code(), Ordering::SeqCst);
    let keys = owner.execute_for(&n1, &read_keys, &[]).data.to_vec();
    assert_eq!(&keys[4..8], &16u32.to_be_bytes(), "a key was registered: {keys:?}");
    // Once the port is active it runs them itself.
    g.state.store(AccessState::ActiveOptimized.code(), Ordering::SeqCst);
    let before = to_owner.forwarded.load(Ordering::SeqCst);
    assert_eq!(standby.execute_for(&n2, &read_keys, &[]).status, 0);
    assert_eq!(to_owner.forwarded.load(Ordering::SeqCst), before);
}

/// A unit attention the owner raises for an initiator port (its registration preempted)
/// reaches that port's sessions at the standby ports too: the owner's logical unit tells the
/// other gateways, and each standby port queues it for its sessions of that port only. An
/// active port raises its own and takes none from elsewhere.
#[test]
fn unit_attentions_the_owner_raises_reach_the_hosts_on_standby_paths() {
    let at_owner = TwoGateways::new(AccessState::ActiveOptimized, AccessState::ActiveOptimized);
    let kept: tessera_scsi::PrStore = Box::new(|_| Ok(()));
    let owner = Arc::new(lun(at_owner.clone()).with_shared_reservations(PrState::default(), kept));
    let to_owner = ToOwner::new(&owner);
    let standby = lun(TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized))
        .with_state_at_owner()
        .with_owner_forwarding(to_owner);
    let (n1, n2, n3) = (nexus(1), nexus(2), nexus(3));
    let read_keys = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];

    // Host 2 registers through the standby port, host 3 only reads there; host 1 registers
    // and reserves at the owner. Nothing is raised for anyone yet.
    let (cdb, p) = pr_out(0, 0, 0, 0x2222);
    assert_eq!(standby.execute_for(&n2, &cdb, &p).status, 0);
    assert_eq!(standby.execute_for(&n3, &read_keys, &[]).status, 0);
    let (cdb, p) = pr_out(0, 0, 0, 0x1111);
    assert_eq!(owner.execute_for(&n1, &cdb, &p).status, 0);
    let (cdb, p) = pr_out(1, 1, 0x1111, 0);
    assert_eq!(owner.execute_for(&n1, &cdb, &p).status, 0);
    assert!(at_owner.raised.lock().unwrap().is_empty());

    // Host 1 preempts host 2's registration at the owner: the owner tells the other
    // gateways of REGISTRATIONS PREEMPTED for host 2's port.
    let (cdb, p) = pr_out(4, 1, 0x1111, 0x2222);
    assert_eq!(owner.execute_for(&n1, &cdb, &p).status, 0);
    let raised = std::mem::take(&mut *at_owner.raised.lock().unwrap());
    assert_eq!(raised.len(), 1, "{raised:?}");
    let (naa, notices) = &raised[0];
    assert_eq!(naa, owner.naa());
    assert_eq!(notices, &[(PortId::of(&n2), Sense::new(0x6, 0x2A, 0x05))]);

    // Delivered at the standby port: host 2's next command there reports it, once; host 3
    // hears nothing.
    standby.attentions_from_owner(notices);
    let r = standby.execute_for(&n2, &read_keys, &[]);
    assert_eq!(sense_of(&r), Some((0x6, 0x2A, 0x05)));
    let r = standby.execute_for(&n2, &read_keys, &[]);
    assert_eq!(
        (r.status, &r.data[4..8]),
        (0, &8u32.to_be_bytes()[..]),
        "host 1's key only"
    );
    assert_eq!(sense_of(&standby.execute_for(&n3, &read_keys, &[])), None);
    // The owner takes none from elsewhere: it raised its own.
    owner.attentions_from_owner(notices);
    assert_eq!(sense_of(&owner.execute_for(&n1, &read_keys, &[])), None);
    // Host 2 registers again through the standby port, and host 1 clears everything at the
    // owner: every other registrant is told RESERVATIONS PREEMPTED, through the gateways.
    let (cdb, p) = pr_out(0, 0, 0, 0x2222);
    assert_eq!(standby.execute_for(&n2, &cdb, &p).status, 0);
    let (cdb, p) = pr_out(3, 0, 0x1111, 0);
    assert_eq!(owner.execute_for(&n1, &cdb, &p).status, 0);
    let raised = std::mem::take(&mut *at_owner.raised.lock().unwrap());
    assert_eq!(raised.len(), 1, "{raised:?}");
    assert_eq!(raised[0].1, [(PortId::of(&n2), Sense::new(0x6, 0x2A, 0x03))]);
}

/// An owner that holds a forwarded command until told to answer it.
struct HeldOwner {
    started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl OwnerForwarding for HeldOwner {
    fn forward(&self, _: &[u8; 16], _: &Nexus, _: &[u8], _: &[u8]) -> Option<OwnerAnswer> {
        self.started.lock().unwrap().send(()).unwrap();
        self.release.lock().unwrap().recv().ok()?;
        let response = Response {
            status: sense::GOOD,
            data: Default::default(),
            sense: Vec::new(),
        };
        Some(response.into())
    }
}

/// SAM: a LUN reset completes once the tasks of every nexus have ended. At a standby port,
/// a reservation command another host forwarded to the owner is such a task: the reset
/// waits for the owner's answer.
#[test]
fn a_lun_reset_at_a_standby_port_waits_for_the_commands_it_forwarded() {
    let (started, forwarding) = std::sync::mpsc::channel();
    let (release, held) = std::sync::mpsc::channel();
    let owner = Arc::new(HeldOwner {
        started: std::sync::Mutex::new(started),
        release: std::sync::Mutex::new(held),
    });
    let standby = Arc::new(
        lun(TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized))
            .with_state_at_owner()
            .with_owner_forwarding(owner),
    );
    let host = std::thread::spawn({
        let standby = standby.clone();
        move || {
            let (cdb, p) = pr_out(0, 0, 0, 0x2222);
            standby.execute_for(&nexus(2), &cdb, &p).status
        }
    });
    forwarding.recv().unwrap();
    let (reset_done, done) = std::sync::mpsc::channel();
    let reset = std::thread::spawn({
        let standby = standby.clone();
        move || {
            standby.wait_for_commands();
            reset_done.send(()).unwrap();
        }
    });
    assert!(
        done.recv_timeout(std::time::Duration::from_millis(300)).is_err(),
        "the reset ended while a forwarded command still ran at the owner"
    );
    release.send(()).unwrap();
    done.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the reset waits on after the owner answered");
    assert_eq!(host.join().unwrap(), sense::GOOD);
    reset.join().unwrap();
}

/// Reservations that gateways keep in turn change only while the port is active: at an
/// owner whose port is no longer active (a handover under way), a host's PERSISTENT
/// RESERVE OUT is answered with a transition, and nothing is changed or saved; the host
/// sends it again, to the next owner.
#[test]
fn shared_reservations_change_only_while_the_port_is_active() {
    let ports = TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized);
    let saves = Arc::new(AtomicUsize::new(0));
    let counted = saves.clone();
    let kept: tessera_scsi::PrStore = Box::new(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let l = lun(ports.clone()).with_shared_reservations(PrState::default(), kept);
    let n = nexus(1);
    let read_keys = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let (cdb, p) = pr_out(0, 0, 0, 0x1111);
    assert_eq!(sense_of(&l.execute_for(&n, &cdb, &p)), TRANSITIONING);
    assert_eq!(saves.load(Ordering::SeqCst), 0);
    ports.state.store(AccessState::ActiveOptimized.code(), Ordering::SeqCst);
    assert_eq!(&l.execute_for(&n, &read_keys, &[]).data[4..8], &[0, 0, 0, 0]);
    assert_eq!(l.execute_for(&n, &cdb, &p).status, 0);
    assert_eq!(saves.load(Ordering::SeqCst), 1);
    assert_eq!(&l.execute_for(&n, &read_keys, &[]).data[4..8], &[0, 0, 0, 8]);
}

/// SPC-4 5.16.2.4.4: a standby port serves MODE SELECT too. Where the mode settings are the
/// owner's, the owner runs it and keeps the result; the standby port takes the owner's new
/// settings at once, and every other nexus on either port is told MODE PARAMETERS CHANGED,
/// the one that sent it only of what its command did not change. What the owner refuses is
/// refused, unchanged, and an owner that does not answer makes the host try again. An
/// answer that comes back after the standby port read the owner's settings is not taken
/// over them.
#[test]
fn a_standby_port_has_the_owner_run_mode_select_and_takes_its_settings() {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let store: tessera_scsi::ModeStore = {
        let kept = kept.clone();
        Box::new(move |m| {
            kept.lock().unwrap().push(*m);
            Ok(())
        })
    };
    let owner = Arc::new(
        lun(TwoGateways::new(
            AccessState::ActiveOptimized,
            AccessState::ActiveOptimized,
        ))
        .with_saved_mode(None, store),
    );
    let to_owner = ToOwner::new(&owner);
    let standby = Arc::new(
        lun(TwoGateways::new(AccessState::Standby, AccessState::ActiveOptimized))
            .with_state_at_owner()
            .with_owner_forwarding(to_owner.clone()),
    );
    let (n1, n2, n3) = (nexus(1), nexus(2), nexus(3));
    let inquiry = [0x12, 0, 0, 0, 36, 0];
    owner.execute_for(&n1, &inquiry, &[]);
    standby.execute_for(&n2, &inquiry, &[]);
    standby.execute_for(&n3, &inquiry, &[]);
    let caching = [0x1A, 0x08, 0x08, 0, 255, 0];
    let wce = |l: &Lun, n: &Nexus| l.execute_for(n, &caching, &[]).data[4 + 2] & 0x04 != 0;
    assert!(wce(&standby, &n2) && wce(&owner, &n1), "the write cache starts on");
    let page = standby.execute_for(&n2, &caching, &[]).data.to_vec();
    let mut off = vec![0u8; 4];
    off.extend_from_slice(&page[4..]);
    off[4 + 2] &= !0x04;
    let select = [0x15, 0x10, 0, 0, off.len() as u8, 0];

    // The owner does not answer: nothing changes.
    to_owner.away.store(true, Ordering::SeqCst);
    assert_eq!(sense_of(&standby.execute_for(&n2, &select, &off)), TRANSITIONING);
    to_owner.away.store(false, Ordering::SeqCst);
    assert!(kept.lock().unwrap().is_empty() && wce(&standby, &n2));
    // A change the owner refuses (a bit that cannot change) is refused, unchanged.
    let mut bad = off.clone();
    bad[4 + 3] ^= 0xF0;
    assert_eq!(
        sense_of(&standby.execute_for(&n2, &select, &bad)),
        Some((0x5, 0x26, 0x00))
    );
    assert!(kept.lock().unwrap().is_empty());

    // Host 2 turns the write cache off through the standby port: the owner keeps it, both
    // ports report it, the others are told.
    let r = standby.execute_for(&n2, &select, &off);
    assert_eq!((r.status, sense_of(&r)), (0, None));
    assert_eq!(kept.lock().unwrap().len(), 1);
    assert!(!kept.lock().unwrap()[0].wce);
    assert!(!wce(&standby, &n2), "at once at the standby port");
    assert_eq!(
        sense_of(&owner.execute_for(&n1, &caching, &[])),
        Some((0x6, 0x2A, 0x01))
    );
    assert!(!wce(&owner, &n1));
    assert_eq!(
        sense_of(&standby.execute_for(&n3, &caching, &[])),
        Some((0x6, 0x2A, 0x01))
    );
    assert!(!wce(&standby, &n3));
    // What the standby port later reads of the owner's records is what it has: no second
    // unit attention.
    standby.mode_changed_elsewhere(kept.lock().unwrap()[0]);
    assert_eq!(sense_of(&standby.execute_for(&n2, &caching, &[])), None);
    assert_eq!(sense_of(&standby.execute_for(&n3, &caching, &[])), None);

    // Host 1 turns the write cache back on at the owner, which the standby port has not read
    // yet. A MODE SELECT of another page through the standby port then leaves it with the
    // owner's settings, not with its own copy's changed.
    let mut on = off.clone();
    on[4 + 2] |= 0x04;
    assert_eq!(owner.execute_for(&n1, &select, &on).status, 0);
    assert!(
        wce(&owner, &n1) && !wce(&standby, &n2),
        "the standby port heard already"
    );
    let control = [0x1A, 0x08, 0x0A, 0, 255, 0];
    let page = standby.execute_for(&n2, &control, &[]).data.to_vec();
    let mut d_sense = vec![0u8; 4];
    d_sense.extend_from_slice(&page[4..]);
    d_sense[4 + 2] |= 0x04;
    let select_control = [0x15, 0x10, 0, 0, d_sense.len() as u8, 0];
    assert_eq!(standby.execute_for(&n2, &select_control, &d_sense).status, 0);
    assert!(owner.mode().d_sense && standby.mode().d_sense);
    assert!(
        standby.mode().wce,
        "the standby port worked the settings out from its own copy: {:?}, the owner has {:?}",
        standby.mode(),
        owner.mode()
    );
    // Both hosts at the standby port are told: host 2 of the write cache host 1 changed.
    let test_unit_ready = [0u8; 6];
    for n in [&n2, &n3] {
        assert_eq!(
            sense_of(&standby.execute_for(n, &test_unit_ready, &[])),
            Some((0x6, 0x2A, 0x01)),
            "{} was not told MODE PARAMETERS CHANGED",
            n.initiator
        );
        assert_eq!(
            sense_of(&standby.execute_for(n, &test_unit_ready, &[])),
            Some((0x2, 0x04, 0x0B)),
            "told once, then standby"
        );
    }
    // The standby port reads the owner's settings between the owner's running a MODE SELECT
    // and its answer's coming back (host 1 changed them again meanwhile): the answer, older,
    // is not taken over them.
    *to_owner.meanwhile.lock().unwrap() = Some(Box::new({
        let (owner, standby, n1) = (owner.clone(), standby.clone(), n1.clone());
        let mut fixed = d_sense.clone();
        fixed[4 + 2] &= !0x04;
        move || {
            // Host 1 hears first of the change host 2 made.
            for _ in 0..16 {
                if owner.execute_for(&n1, &[0u8; 6], &[]).status == 0 {
                    break;
                }
            }
            assert_eq!(owner.execute_for(&n1, &select_control, &fixed).status, 0);
            standby.mode_changed_elsewhere(owner.mode());
        }
    }));
    assert_eq!(standby.execute_for(&n2, &select, &off).status, 0);
    let cache_off_fixed_sense = tessera_scsi::ModeState {
        wce: false,
        d_sense: false,
        swp: false,
    };
    assert_eq!(owner.mode(), cache_off_fixed_sense);
    assert_eq!(
        standby.mode(),
        owner.mode(),
        "an answer older than what the standby port read was taken"
    );
}
