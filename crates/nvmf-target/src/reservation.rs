//! Reservations for one namespace: registrants, the reservation, and what
//! each Reservation command does to them. Transport-free and synchronous:
//! callers hold the state behind a lock, execute the command here, and act on
//! the returned [`Outcome`] (log page 80h entries and AENs, draining the
//! preempted hosts' writes, persisting the record when PTPL is set).
//!
//! Registrations belong to a host, named by its 128-bit Host Identifier: all
//! controllers a host has connected share one registration, as the spec
//! requires for NVMe over Fabrics.
//!
//! Where the spec leaves room, the choices follow Linux nvmet
//! (drivers/nvme/target/pr.c), except where the spec is explicit:
//! - IEKEY is honoured for Register's Unregister and Replace actions only.
//!   Since NVMe 1.3 ("Ignore Existing Key" in RESCAP) IEKEY is meaningless
//!   for Acquire and Release; like nvmet we reject IEKEY = 1 there with
//!   Invalid Field in Command.
//! - Reserved action values (RREGA, RACQA, RRELA) and CPTPL = 01b give
//!   Invalid Field in Command (nvmet answers Invalid Opcode for the former).
//! - Release with a type other than the reservation's gives Invalid Field in
//!   Command, as the spec says (nvmet answers Reservation Conflict).
//! - In the all-registrants types every registrant is a holder (the spec's
//!   definition): any registrant may release, acquire again, or is reported
//!   with RCSTS bit 0 set. The reservation ends when the last registrant
//!   unregisters.
//! - Preempt follows the spec's three cases literally, so a holder that
//!   preempts with its own key changes the type and also removes other
//!   registrants sharing that key; a PRKEY that matches neither the holder
//!   nor anyone else is a conflict; PRKEY 0 is Invalid Field unless the type
//!   is all-registrants. Without a reservation, preempt only unregisters.
//! - A preempt whose PRKEY matches the issuer's own key (outside the
//!   holder-key case) unregisters the issuer too, as in nvmet; the issuer is
//!   never notified nor named for abort.
//! - Clear notifies the other registrants with Reservation Preempted (the
//!   spec's wording and nvmet's); releasing a type other than Write Exclusive
//!   or Exclusive Access notifies them with Reservation Released.
//! - Every successful Reservation Register increments the generation, even
//!   re-registering with the same key (the spec counts commands, not changes).
//! - There is no spec status for "too many registrants"; beyond
//!   [`MAX_REGISTRANTS`] a new registration fails with Internal Error, what
//!   nvmet returns when it cannot allocate one.

use nvme_wire::digest::crc32c;
use nvme_wire::reservation::{
    AcquireAction, RegisterAction, RegisteredCtrl, ReleaseAction, ReportHeader, ResvType, cptpl,
    encode_report_ext, log_type,
};
use nvme_wire::reservation::{
    MASK_REGISTRATION_PREEMPTED, MASK_RESERVATION_PREEMPTED, MASK_RESERVATION_RELEASED,
};
use nvme_wire::sqe::io_opc;
use nvme_wire::status::{
    SC_HOST_ID_INCONSISTENT, SC_INTERNAL, SC_INVALID_FIELD, SC_RESERVATION_CONFLICT, Status,
};

/// A 128-bit NVMe Host Identifier.
pub type HostId = [u8; 16];

/// Upper bound on registrants per namespace; keeps the persistent record small.
pub const MAX_REGISTRANTS: usize = 64;

/// Controller ID reported for a registrant with no controller connected (e.g. restored by PTPL).
pub const CNTLID_NONE: u16 = 0xFFFF;

/// The issuer of a Reservation command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRef {
    pub hostid: HostId,
    pub cntlid: u16,
}

/// A registered host and its reservation key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    pub hostid: HostId,
    pub rkey: u64,
}

/// What an I/O command does to the medium, for the reservation access check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    /// The NVM command set's read and write command groups (NVM Command Set
    /// spec, "Command Behavior in the Presence of a Reservation"). Flush is in
    /// the write group (nvmet agrees). Reservation commands are checked by
    /// their own rules and get `None`, as do commands outside both groups.
    pub fn of_io_opcode(opc: u8) -> Option<Access> {
        const WRITE_UNCORRECTABLE: u8 = 0x04;
        const COMPARE: u8 = 0x05;
        const VERIFY: u8 = 0x0C;
        const COPY: u8 = 0x19;
        match opc {
            io_opc::READ | COMPARE | VERIFY => Some(Access::Read),
            io_opc::WRITE
            | io_opc::WRITE_ZEROES
            | io_opc::DATASET_MANAGEMENT
            | io_opc::FLUSH
            | WRITE_UNCORRECTABLE
            | COPY => Some(Access::Write),
            _ => None,
        }
    }
}

/// The kinds of Reservation Notification log page entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationKind {
    RegistrationPreempted,
    ReservationReleased,
    ReservationPreempted,
}

impl NotificationKind {
    /// The log page 80h Reservation Notification Type.
    pub fn log_type(self) -> u8 {
        match self {
            Self::RegistrationPreempted => log_type::REGISTRATION_PREEMPTED,
            Self::ReservationReleased => log_type::RESERVATION_RELEASED,
            Self::ReservationPreempted => log_type::RESERVATION_PREEMPTED,
        }
    }
    /// The Reservation Notification Mask (feature 81h) bit that suppresses it.
    pub fn mask_bit(self) -> u32 {
        match self {
            Self::RegistrationPreempted => MASK_REGISTRATION_PREEMPTED,
            Self::ReservationReleased => MASK_RESERVATION_RELEASED,
            Self::ReservationPreempted => MASK_RESERVATION_PREEMPTED,
        }
    }
}

/// What a successful command asks of its caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Hosts to notify: a log page 80h entry and an AEN on each of their
    /// controllers (unless masked). Never the issuing host.
    pub notify: Vec<(HostId, NotificationKind)>,
    /// Preempt and Abort: hosts whose outstanding commands on this namespace
    /// must be aborted or drained before the command completes.
    pub abort: Vec<HostId>,
    /// The state changed; persist it if PTPL is on.
    pub changed: bool,
}

impl Outcome {
    fn note(&mut self, hostid: HostId, kind: NotificationKind) {
        if !self.notify.contains(&(hostid, kind)) {
            self.notify.push((hostid, kind));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// The holder; for all-registrants types one registrant stands for all.
    holder: HostId,
    rtype: ResvType,
}

/// Per-namespace reservation state. Plain data: wrap it in a lock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationState {
    registrants: Vec<Registrant>,
    held: Option<Held>,
    generation: u32,
    ptpl: bool,
}

fn conflict() -> Status {
    Status::generic(SC_RESERVATION_CONFLICT)
}
fn invalid_field() -> Status {
    Status::generic(SC_INVALID_FIELD)
}

impl ReservationState {
    pub fn new() -> Self {
        Self::default()
    }

    /// PRGEN: a 32-bit wrapping count of registrations, preemptions and clears.
    pub fn generation(&self) -> u32 {
        self.generation
    }
    /// Persist Through Power Loss state.
    pub fn ptpl(&self) -> bool {
        self.ptpl
    }
    /// Set Features 83h (Reservation Persistence).
    pub fn set_ptpl(&mut self, on: bool) {
        self.ptpl = on;
    }
    pub fn registrants(&self) -> &[Registrant] {
        &self.registrants
    }
    pub fn rtype(&self) -> Option<ResvType> {
        self.held.map(|h| h.rtype)
    }
    /// The holder (for all-registrants types, one of the holders).
    pub fn holder(&self) -> Option<HostId> {
        self.held.map(|h| h.holder)
    }
    /// Whether a reservation exists; the I/O path skips [`check`](Self::check) when not.
    pub fn is_reserved(&self) -> bool {
        self.held.is_some()
    }
    pub fn is_registered(&self, hostid: &HostId) -> bool {
        self.find(hostid).is_some()
    }
    pub fn is_holder(&self, hostid: &HostId) -> bool {
        match self.held {
            None => false,
            Some(h) if h.rtype.all_registrants() => self.is_registered(hostid),
            Some(h) => h.holder == *hostid,
        }
    }

    fn find(&self, hostid: &HostId) -> Option<usize> {
        self.registrants.iter().position(|r| r.hostid == *hostid)
    }

    /// The issuer must be a registrant whose key is CRKEY.
    fn require_key(&self, hostid: &HostId, crkey: u64) -> Result<(), Status> {
        match self.find(hostid) {
            Some(i) if self.registrants[i].rkey == crkey => Ok(()),
            _ => Err(conflict()),
        }
    }

    fn bump(&mut self, out: &mut Outcome) {
        self.generation = self.generation.wrapping_add(1);
        out.changed = true;
    }

    /// Reservation access check for an I/O command (the spec's access table).
    pub fn check(&self, hostid: &HostId, access: Access) -> Result<(), Status> {
        let Some(held) = self.held else {
            return Ok(());
        };
        if self.is_holder(hostid) {
            return Ok(());
        }
        let allowed = (held.rtype.registrants_access() && self.is_registered(hostid))
            || (access == Access::Read && !held.rtype.exclusive_access());
        if allowed { Ok(()) } else { Err(conflict()) }
    }

    /// Removes registrant `i`, ending or handing on the reservation it held.
    fn unregister_at(&mut self, i: usize, out: &mut Outcome) {
        let gone = self.registrants.remove(i);
        let Some(held) = self.held else {
            return;
        };
        if held.rtype.all_registrants() {
            if self.registrants.is_empty() {
                self.held = None;
            } else if held.holder == gone.hostid {
                self.held = Some(Held {
                    holder: self.registrants[0].hostid,
                    ..held
                });
            }
        } else if held.holder == gone.hostid {
            self.held = None;
            // The holder leaving releases the reservation; as on Release, only
            // types that gave registrants access tell them.
            if held.rtype.registrants_access() {
                for r in &self.registrants {
                    out.note(r.hostid, NotificationKind::ReservationReleased);
                }
            }
        }
    }

    /// Reservation Register (0Dh).
    pub fn register(
        &mut self,
        host: &HostRef,
        rrega: u8,
        iekey: bool,
        crkey: u64,
        nrkey: u64,
        cptpl_field: u8,
    ) -> Result<Outcome, Status> {
        let action = RegisterAction::from_raw(rrega).ok_or_else(invalid_field)?;
        let new_ptpl = match cptpl_field {
            cptpl::NO_CHANGE => None,
            cptpl::CLEAR => Some(false),
            cptpl::SET => Some(true),
            _ => return Err(invalid_field()),
        };
        let mut out = Outcome::default();
        let me = self.find(&host.hostid);
        match action {
            RegisterAction::Register => match me {
                Some(i) if self.registrants[i].rkey != nrkey => return Err(conflict()),
                Some(_) => {}
                None if self.registrants.len() >= MAX_REGISTRANTS => {
                    return Err(Status::generic(SC_INTERNAL));
                }
                None => self.registrants.push(Registrant {
                    hostid: host.hostid,
                    rkey: nrkey,
                }),
            },
            RegisterAction::Unregister => match me {
                Some(i) if iekey || self.registrants[i].rkey == crkey => {
                    self.unregister_at(i, &mut out)
                }
                _ => return Err(conflict()),
            },
            RegisterAction::Replace => match me {
                Some(i) if iekey || self.registrants[i].rkey == crkey => {
                    self.registrants[i].rkey = nrkey
                }
                _ => return Err(conflict()),
            },
        }
        if let Some(p) = new_ptpl {
            self.ptpl = p;
        }
        self.bump(&mut out);
        Ok(out)
    }

    /// Reservation Acquire (11h): Acquire, Preempt, Preempt and Abort.
    pub fn acquire(
        &mut self,
        host: &HostRef,
        racqa: u8,
        iekey: bool,
        rtype: u8,
        crkey: u64,
        prkey: u64,
    ) -> Result<Outcome, Status> {
        let action = AcquireAction::from_raw(racqa).ok_or_else(invalid_field)?;
        if iekey {
            return Err(invalid_field());
        }
        let rtype = ResvType::from_raw(rtype).ok_or_else(invalid_field)?;
        self.require_key(&host.hostid, crkey)?;
        match action {
            AcquireAction::Acquire => {
                let mut out = Outcome::default();
                match self.held {
                    None => {
                        self.held = Some(Held {
                            holder: host.hostid,
                            rtype,
                        });
                        out.changed = true;
                    }
                    Some(h) if h.rtype == rtype && self.is_holder(&host.hostid) => {}
                    Some(_) => return Err(conflict()),
                }
                Ok(out)
            }
            AcquireAction::Preempt => self.preempt(host.hostid, rtype, prkey, false),
            AcquireAction::PreemptAndAbort => self.preempt(host.hostid, rtype, prkey, true),
        }
    }

    fn preempt(
        &mut self,
        me: HostId,
        rtype: ResvType,
        prkey: u64,
        abort: bool,
    ) -> Result<Outcome, Status> {
        let mut out = Outcome::default();
        let with_key = |s: &Self, skip_me: bool| -> Vec<HostId> {
            s.registrants
                .iter()
                .filter(|r| r.rkey == prkey && !(skip_me && r.hostid == me))
                .map(|r| r.hostid)
                .collect()
        };
        match self.held {
            Some(held) if held.rtype.all_registrants() && prkey == 0 => {
                self.held = Some(Held { holder: me, rtype });
                let others: Vec<HostId> = self
                    .registrants
                    .iter()
                    .map(|r| r.hostid)
                    .filter(|h| *h != me)
                    .collect();
                self.evict(&others, me, abort, &mut out);
            }
            Some(held) if !held.rtype.all_registrants() && self.holder_key() == Some(prkey) => {
                self.held = Some(Held { holder: me, rtype });
                let victims = with_key(self, true);
                self.evict(&victims, me, abort, &mut out);
                if held.rtype != rtype {
                    for r in &self.registrants {
                        if r.hostid != me {
                            out.note(r.hostid, NotificationKind::ReservationReleased);
                        }
                    }
                }
            }
            Some(held) if !held.rtype.all_registrants() && prkey == 0 => {
                return Err(invalid_field());
            }
            // No reservation, an all-registrants type with PRKEY != 0, or a
            // PRKEY naming registrants other than the holder: unregister them.
            _ => {
                let victims = with_key(self, false);
                if victims.is_empty() {
                    return Err(conflict());
                }
                self.evict(&victims, me, abort, &mut out);
            }
        }
        self.bump(&mut out);
        Ok(out)
    }

    fn holder_key(&self) -> Option<u64> {
        let h = self.held?;
        self.find(&h.holder).map(|i| self.registrants[i].rkey)
    }

    /// Unregisters `victims` on behalf of a preempt by `me`.
    fn evict(&mut self, victims: &[HostId], me: HostId, abort: bool, out: &mut Outcome) {
        for v in victims {
            if let Some(i) = self.find(v) {
                self.unregister_at(i, out);
            }
            if *v != me {
                out.note(*v, NotificationKind::RegistrationPreempted);
                if abort && !out.abort.contains(v) {
                    out.abort.push(*v);
                }
            }
        }
        // A host preempted after being told of a release needs only the preemption.
        out.notify
            .retain(|(h, k)| *k != NotificationKind::ReservationReleased || !victims.contains(h));
    }

    /// Reservation Release (15h): Release and Clear.
    pub fn release(
        &mut self,
        host: &HostRef,
        rrela: u8,
        iekey: bool,
        rtype: u8,
        crkey: u64,
    ) -> Result<Outcome, Status> {
        let action = ReleaseAction::from_raw(rrela).ok_or_else(invalid_field)?;
        if iekey {
            return Err(invalid_field());
        }
        self.require_key(&host.hostid, crkey)?;
        let mut out = Outcome::default();
        let me = host.hostid;
        match action {
            ReleaseAction::Release => {
                let Some(held) = self.held else {
                    return Ok(out);
                };
                if !self.is_holder(&me) {
                    return Ok(out);
                }
                if rtype != held.rtype.raw() {
                    return Err(invalid_field());
                }
                self.held = None;
                out.changed = true;
                if held.rtype.registrants_access() {
                    for r in &self.registrants {
                        if r.hostid != me {
                            out.note(r.hostid, NotificationKind::ReservationReleased);
                        }
                    }
                }
            }
            ReleaseAction::Clear => {
                for r in &self.registrants {
                    if r.hostid != me {
                        out.note(r.hostid, NotificationKind::ReservationPreempted);
                    }
                }
                self.registrants.clear();
                self.held = None;
                self.bump(&mut out);
            }
        }
        Ok(out)
    }

    /// The registered controllers: one entry per controller of each
    /// registrant (`ctrls_of` names them), or one with [`CNTLID_NONE`] for a
    /// registrant with none connected.
    pub fn registered_ctrls(&self, ctrls_of: impl Fn(&HostId) -> Vec<u16>) -> Vec<RegisteredCtrl> {
        let mut v = Vec::new();
        for r in &self.registrants {
            let holds = self.is_holder(&r.hostid);
            let mut ids = ctrls_of(&r.hostid);
            if ids.is_empty() {
                ids.push(CNTLID_NONE);
            }
            v.extend(ids.into_iter().map(|cntlid| RegisteredCtrl {
                cntlid,
                holds,
                hostid: r.hostid,
                rkey: r.rkey,
            }));
        }
        v
    }

    /// Reservation Report (0Eh) into `buf` (the host's NUMD, possibly short);
    /// returns the full structure length. Fabrics Host Identifiers are 128
    /// bits, so the classic format (EDS = 0) is refused with Host Identifier
    /// Inconsistent Format, as the spec requires.
    pub fn report(
        &self,
        eds: bool,
        ctrls_of: impl Fn(&HostId) -> Vec<u16>,
        buf: &mut [u8],
    ) -> Result<usize, Status> {
        if !eds {
            return Err(Status::generic(SC_HOST_ID_INCONSISTENT));
        }
        let mut ctrls = self.registered_ctrls(ctrls_of);
        ctrls.truncate(usize::from(u16::MAX));
        let hdr = ReportHeader {
            generation: self.generation,
            rtype: self.rtype().map_or(0, ResvType::raw),
            regctl: ctrls.len() as u16,
            ptpls: self.ptpl,
        };
        Ok(encode_report_ext(&hdr, &ctrls, buf))
    }
}

/// Why a persistent record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PersistError {
    #[error("reservation record is {0} bytes, too short or not a whole number of entries")]
    Length(usize),
    #[error("reservation record has a wrong magic; not a flashpool reservation record")]
    Magic,
    #[error("reservation record version {0} is not supported (this build reads 1)")]
    Version(u8),
    #[error("reservation record checksum mismatch; the record is corrupt")]
    Checksum,
    #[error("reservation record holds {0} registrants, more than {MAX_REGISTRANTS}")]
    TooMany(usize),
    #[error("reservation record is inconsistent: {0}")]
    Invalid(&'static str),
}

const MAGIC: [u8; 4] = *b"FPRV";
const VERSION: u8 = 1;
const HEADER: usize = 16;
const ENTRY: usize = 24;
const CRC: usize = 4;
const NO_HOLDER: u16 = 0xFFFF;

impl ReservationState {
    /// A versioned, checksummed record of the whole state, at most
    /// 16 + 64 * 24 + 4 bytes: magic "FPRV", version, flags (bit 0 PTPL),
    /// RTYPE (0 = none), reserved, generation u32, count u16, holder index
    /// u16 (FFFFh = none), then (host id, key) entries, then CRC32C of all
    /// preceding bytes. Little-endian.
    pub fn encode_persistent(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + self.registrants.len() * ENTRY + CRC);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(u8::from(self.ptpl));
        b.push(self.rtype().map_or(0, ResvType::raw));
        b.push(0);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&(self.registrants.len() as u16).to_le_bytes());
        let holder = self
            .held
            .and_then(|h| self.find(&h.holder))
            .map_or(NO_HOLDER, |i| i as u16);
        b.extend_from_slice(&holder.to_le_bytes());
        for r in &self.registrants {
            b.extend_from_slice(&r.hostid);
            b.extend_from_slice(&r.rkey.to_le_bytes());
        }
        let crc = crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a record written by [`encode_persistent`](Self::encode_persistent);
    /// anything else is an error, never a panic.
    pub fn decode_persistent(b: &[u8]) -> Result<Self, PersistError> {
        if b.len() < HEADER + CRC || !(b.len() - HEADER - CRC).is_multiple_of(ENTRY) {
            return Err(PersistError::Length(b.len()));
        }
        if b[0..4] != MAGIC {
            return Err(PersistError::Magic);
        }
        if b[4] != VERSION {
            return Err(PersistError::Version(b[4]));
        }
        let (body, tail) = b.split_at(b.len() - CRC);
        let want = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        if crc32c(body) != want {
            return Err(PersistError::Checksum);
        }
        let flags = body[5];
        if flags & !1 != 0 {
            return Err(PersistError::Invalid("unknown flag bits"));
        }
        let generation = u32::from_le_bytes([body[8], body[9], body[10], body[11]]);
        let count = usize::from(u16::from_le_bytes([body[12], body[13]]));
        let holder = u16::from_le_bytes([body[14], body[15]]);
        if count > MAX_REGISTRANTS {
            return Err(PersistError::TooMany(count));
        }
        if body.len() != HEADER + count * ENTRY {
            return Err(PersistError::Length(b.len()));
        }
        let mut registrants: Vec<Registrant> = Vec::with_capacity(count);
        for e in body[HEADER..].chunks_exact(ENTRY) {
            let mut hostid = [0u8; 16];
            hostid.copy_from_slice(&e[..16]);
            let mut key = [0u8; 8];
            key.copy_from_slice(&e[16..24]);
            if registrants.iter().any(|r| r.hostid == hostid) {
                return Err(PersistError::Invalid("a host is registered twice"));
            }
            registrants.push(Registrant {
                hostid,
                rkey: u64::from_le_bytes(key),
            });
        }
        let held = match (body[6], holder) {
            (0, NO_HOLDER) => None,
            (0, _) => return Err(PersistError::Invalid("a holder without a reservation")),
            (_, NO_HOLDER) => return Err(PersistError::Invalid("a reservation without a holder")),
            (t, i) => {
                let rtype = ResvType::from_raw(t)
                    .ok_or(PersistError::Invalid("unknown reservation type"))?;
                let r = registrants
                    .get(usize::from(i))
                    .ok_or(PersistError::Invalid("holder index out of range"))?;
                Some(Held {
                    holder: r.hostid,
                    rtype,
                })
            }
        };
        Ok(ReservationState {
            registrants,
            held,
            generation,
            ptpl: flags & 1 != 0,
        })
    }
}

#[cfg(test)]
#[path = "reservation_tests.rs"]
mod tests;
