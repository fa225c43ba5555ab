//! Multi-record assembly: kernel messages → classified [`FaultEvent`]s.
//!
//! Some faults span several records. The scanner holds an event while its
//! follow-up records may still arrive and attaches them:
//!
//! - `NVRM: GPU at PCI:…: GPU-uuid` / `NVRM: GPU Board Serial Number: …` precede a GPU's
//!   first XID: remembered per PCI address and attached (UUID, `gpu_serial`) to every
//!   later event of that GPU. They are never events themselves.
//! - XID 79 is emitted at once; the driver's `NVRM: GPU …: GPU has fallen off the bus.`
//!   that follows it is absorbed. The same line without an XID 79 is its own event.
//! - An AER summary (`AER: … error received: <source>`) holds; the `PCIe Bus Error`,
//!   `device [vvvv:dddd] error status/mask` and `[ n] Name` detail lines are attached.
//! - SXid lines hold for their `Severity …` / `Data {…}` follow-ups.
//! - XID 119/120 (GSP RPC timeout) hold for the GSP RPC history dump.
//! - Machine checks hold for their `[Hardware Error]` detail lines; driver errors
//!   (`RmInitAdapter failed!`, `rm_init_adapter failed`, probe failures) merge.
//! - NIC lines (`mlx5_core`: link up/down, port module events, health reports)
//!   are one event each, emitted at once.
//!
//! A held event is emitted on the next unrelated record, by [`Scanner::flush_expired`]
//! once its hold window (default [`DEFAULT_HOLD_USEC`] of record time) has passed, or by
//! [`Scanner::finish`]. Everything else is emitted at once.

use crate::message::{
    AerDetail, AerSummary, DriverErrorMsg, EccMsg, MceMsg, McePart, Message, NicEvent, NicMsg,
    SxidMsg, ThermalMsg, XidMsg, contains, find, interesting, module_status, parse_message,
    parse_nvlink5,
};
use crate::pci::{normalize_pci, pci_matches, same_text};
use crate::policy::{ContextWindow, Policy};
use gpuwatch_proto::{Attrs, FaultEvent, FaultEventRef, FaultKind, ShortName};
use std::sync::Arc;

mod details;
use details::{
    aer_name, cpu_number, insert_attr, mce_bit, mce_details, multi_line_xid, note_fallen,
    note_sxid, within_repeat_window, xid_line_attrs,
};

/// Default hold window for multi-record faults: 50 ms of record time.
pub const DEFAULT_HOLD_USEC: u64 = 50_000;

/// Window after an XID 79 in which `GPU has fallen off the bus` of the same GPU is
/// the driver's echo of it, not a new fault.
const FALLEN_ECHO_USEC: u64 = 1_000_000;
/// Lines of one XID fault: on a real H200 one misaligned store gave three XID 13
/// lines within 3 ms (the SM warp exception and the ESR dump without a pid, then
/// the channel line with pid and name) while NVML reported one XID 13. Lines of the
/// same GPU and XID whose pid and channel agree (or are absent) within this window
/// of the first are one occurrence.
const XID_REPEAT_USEC: u64 = 10_000;
/// How long after an SXid head line its follow-up lines can come: the driver
/// prints a report's lines together (milliseconds apart in real logs).
const SXID_REPORT_USEC: u64 = 1_000_000;
/// Cap on the assembled message of one event (follow-ups beyond are counted).
const MAX_MESSAGE_BYTES: usize = 8 * 1024;
/// GPUs whose identity lines are remembered.
const MAX_IDENTITIES: usize = 256;

/// Metadata of one record handed to the scanner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordMeta {
    /// kmsg sequence number.
    pub seq: Option<u64>,
    /// Monotonic time since boot, microseconds (drives the hold window).
    pub monotonic_usec: Option<u64>,
    /// Wall-clock time, Unix nanoseconds.
    pub time_unix_nano: Option<u64>,
    /// syslog facility.
    pub facility: Option<u8>,
    /// syslog level.
    pub level: Option<u8>,
}

#[derive(Debug)]
struct Identity {
    pci: String,
    uuid: String,
    serial: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeldKind {
    Sxid,
    Aer,
    Gsp,
    FallenOff,
    Mce,
    DriverError,
    /// An XID line without a process: the driver may print more lines of the same
    /// fault right after it (see `XID_REPEAT_USEC`).
    Xid,
}

#[derive(Debug)]
struct Held {
    kind: HeldKind,
    ev: FaultEvent,
    started_usec: Option<u64>,
    /// Devices whose AER detail lines belong to this event (normalised).
    devices: Vec<String>,
    aer_errors: Vec<String>,
    dropped_lines: u32,
    /// AER: the source named by the summary printed its own detail lines.
    source_detail: bool,
    /// Machine check: the report parts seen (bit per [`McePart`]).
    mce_parts: u8,
    /// XID: kernel lines of this one occurrence.
    lines: u32,
    /// XID: the line naming the process arrived; nothing more belongs to it.
    complete: bool,
}

impl Held {
    fn new(kind: HeldKind, ev: FaultEvent, devices: Vec<String>) -> Held {
        Held {
            kind,
            started_usec: ev.monotonic_usec,
            ev,
            devices,
            aer_errors: Vec::new(),
            dropped_lines: 0,
            source_detail: false,
            mce_parts: 0,
            lines: 1,
            complete: false,
        }
    }

    fn append(&mut self, msg: &str) {
        if self.ev.message.len() + msg.len() + 1 > MAX_MESSAGE_BYTES {
            self.dropped_lines += 1;
            return;
        }
        self.ev.message.push('\n');
        self.ev.message.push_str(msg);
    }

    /// Another line of the held XID's fault: the same GPU and code, a pid and
    /// channel that agree (or are absent), within the repeat window. Its pid,
    /// process and channel fill what the first lines lacked.
    fn attach_xid(&mut self, x: &XidMsg<'_>, meta: &RecordMeta) -> bool {
        let ev = &mut self.ev;
        let same = x.code == ev.code
            && x.code_as_printed.is_none()
            && pci_matches(x.pci, &ev.pci_address)
            && x.pid.is_none_or(|p| ev.pid.is_none_or(|q| p == q))
            && x.channel
                .is_none_or(|c| ev.attributes.get("channel").is_none_or(|d| d == c))
            && within_repeat_window(ev, meta);
        if !same {
            return false;
        }
        if ev.pid.is_none() {
            ev.pid = x.pid;
        }
        if ev.process.is_empty()
            && let Some(p) = x.process
        {
            ev.process = p.to_owned();
        }
        if let Some(c) = x.channel {
            ev.attributes
                .entry("channel".to_owned())
                .or_insert_with(|| c.to_owned());
        }
        self.lines += 1;
        // The driver prints the line with the process last: the report is complete.
        self.complete = x.pid.is_some();
        true
    }

    /// An AER detail line of one of the held summary's devices (or, for a summary
    /// that printed no source, of the first device that reports): the faulting
    /// device, severity, type, status and error bits.
    fn attach_aer(&mut self, d: &AerDetail<'_>) -> bool {
        let device = match d {
            AerDetail::BusError { device, .. }
            | AerDetail::Status { device, .. }
            | AerDetail::Bit { device, .. }
            | AerDetail::Other { device } => *device,
        };
        let dev = device.and_then(normalize_pci);
        if let Some(dev) = &dev
            && !self.devices.iter().any(|d| d == dev)
        {
            // A summary whose source was not printed accepts the first device.
            let open = self.devices.len() == 1 && !self.ev.attributes.contains_key("aer_type");
            if !(open && matches!(d, AerDetail::BusError { .. })) {
                return false;
            }
            self.devices.push(dev.clone());
            self.ev.pci_address = dev.clone();
        }
        // The faulting device is the one whose error registers are printed:
        // the summary's source when it prints them, else the first device that
        // does (AMD root ports report source 0000:00:00.0 for their own errors).
        if let (AerDetail::BusError { .. }, Some(dev)) = (d, &dev)
            && !self.source_detail
        {
            let is_source = self.devices.last() == Some(dev);
            if is_source || !self.ev.attributes.contains_key("aer_type") {
                self.ev.pci_address = dev.clone();
            }
            self.source_detail = is_source;
        }
        self.aer_detail(d);
        true
    }

    /// What an AER detail line says, recorded on the held event.
    fn aer_detail(&mut self, d: &AerDetail<'_>) {
        match d {
            AerDetail::BusError {
                severity,
                error_type,
                ..
            } => {
                if self.ev.attributes.contains_key("aer_type") {
                    // A second error group of the same device: keep the first
                    // type, record the most severe severity.
                    let cur = self.ev.attributes.get("aer_severity").cloned();
                    if cur.as_deref() == Some("corrected") {
                        attr(&mut self.ev, "aer_severity", severity.as_str());
                    }
                } else {
                    attr(&mut self.ev, "aer_severity", severity.as_str());
                    if let Some(t) = error_type {
                        attr(&mut self.ev, "aer_type", *t);
                    }
                }
            }
            AerDetail::Status { status, .. } => {
                self.ev
                    .attributes
                    .entry("aer_status".to_owned())
                    .or_insert_with(|| (*status).to_owned());
            }
            AerDetail::Bit { name, .. } => {
                if self.aer_errors.len() < 32 && !self.aer_errors.iter().any(|e| e == name) {
                    self.aer_errors.push((*name).to_owned());
                }
            }
            AerDetail::Other { .. } => {}
        }
    }

    /// Another driver-error line of the same GPU (or of none named).
    fn attach_driver_error(&mut self, d: &DriverErrorMsg<'_>) -> bool {
        let dev = norm(d.pci);
        if !dev.is_empty() && !self.ev.pci_address.is_empty() && dev != self.ev.pci_address {
            return false;
        }
        if self.ev.pci_address.is_empty() {
            self.ev.pci_address = dev;
        }
        // A code printed by a later line completes an event started by a
        // line without one (`rm_init_adapter failed` before `RmInitAdapter failed! (..)`).
        if let Some(c) = d.code
            && self
                .ev
                .attributes
                .get("driver_error")
                .is_none_or(|v| !v.contains('('))
        {
            attr(&mut self.ev, "driver_error", format!("{} ({c})", d.error));
        }
        true
    }

    /// A machine-check line of a part the held report does not have yet (or a
    /// detail line).
    fn attach_mce(&mut self, m: &MceMsg) -> bool {
        if m.part.is_some_and(|p| self.mce_parts & mce_bit(p) != 0) {
            return false;
        }
        if let Some(p) = m.part {
            self.mce_parts |= mce_bit(p);
        }
        mce_details(&mut self.ev, m);
        true
    }
}

/// Where finished events go.
enum Sink<'s> {
    /// Appended, owned.
    Owned(&'s mut Vec<FaultEvent>),
    /// Handed over borrowed; the scanner keeps (and reuses) what it owned.
    View(&'s mut dyn FnMut(&FaultEventRef<'_>)),
}

/// Stateful kernel-message scanner: multi-record assembly, identity context and
/// classification. One per input stream (not shared between threads).
#[derive(Debug)]
pub struct Scanner {
    policy: Arc<Policy>,
    ctx: ContextWindow,
    hold_usec: u64,
    held: Option<Held>,
    identities: Vec<Identity>,
    last_identity: Option<usize>,
    /// (normalised PCI, monotonic time) of the last XID 79 of each GPU (several GPUs
    /// can fall off together; each one's later report is the echo of its XID).
    last_fallen: Vec<(String, Option<u64>)>,
    /// (normalised switch PCI, code, monotonic time) of the last SXid head line of
    /// each switch and code: a follow-up line without a head of its own is a
    /// report of its own (see `Scanner::start_sxid`).
    last_sxid: Vec<(String, u32, Option<u64>)>,
    /// Fallen-off-the-bus events waiting for their GPU's XID 79 and echo lines, in
    /// input order, at most one per GPU (several GPUs can fall off together; each
    /// keeps its own event). Never non-empty together with `held`.
    fallen: Vec<Held>,
    /// The head (`NVRM: The NVIDIA GPU <pci>`) and continuation lines of the
    /// driver's three-line "fallen off the bus" report seen so far: only the head
    /// names the GPU, so the block is collected until its last line arrives.
    prelude: Option<Prelude>,
    /// Driver version from `NVRM: loading NVIDIA UNIX … Kernel Module … <version>`:
    /// NVLink5 XIDs are decoded with the intrInfo layout of that generation.
    driver_version: Option<String>,
    /// Emptied events handed back by the reader ([`Scanner::recycle`]): new events
    /// reuse their strings' buffers.
    spare: Vec<FaultEvent>,
    /// GPU addresses of XID lines as printed and normalised (see
    /// [`Scanner::pci_name`]).
    pci_names: Vec<(String, String)>,
}

/// An unfinished three-line "fallen off the bus" report (see [`Scanner::push`]).
#[derive(Debug)]
struct Prelude {
    pci: String,
    meta: RecordMeta,
    text: String,
    lines: u8,
}

/// Lines a fallen-off-the-bus report has before its `fallen off the bus` line.
const PRELUDE_MAX_LINES: u8 = 2;
/// GPUs whose fallen-off-the-bus events can wait at once (more: the oldest is emitted).
const MAX_FALLEN_PENDING: usize = 64;

/// Events kept for reuse by [`Scanner::recycle`].
const MAX_SPARE_EVENTS: usize = 16;

/// Resets every field of `ev` to its default in place, its strings emptied but
/// keeping their capacity (`write_into` names every field, so a field added to
/// `FaultEvent` does not compile until it is handled there).
fn empty(ev: &mut FaultEvent) {
    FaultEventRef::EMPTY.write_into(ev);
}

fn attr(ev: &mut FaultEvent, key: &str, value: impl Into<String>) {
    ev.attributes.insert(key.to_owned(), value.into());
}

fn norm(pci: Option<&str>) -> String {
    pci.and_then(normalize_pci).unwrap_or_default()
}

impl Scanner {
    /// A scanner classifying with `policy`.
    pub fn new(policy: Arc<Policy>) -> Scanner {
        Scanner {
            policy,
            ctx: ContextWindow::new(),
            hold_usec: DEFAULT_HOLD_USEC,
            held: None,
            identities: Vec::new(),
            last_identity: None,
            last_fallen: Vec::new(),
            last_sxid: Vec::new(),
            fallen: Vec::new(),
            prelude: None,
            driver_version: None,
            spare: Vec::new(),
            pci_names: Vec::new(),
        }
    }

    /// Sets the hold window for multi-record faults (microseconds of record time).
    pub fn with_hold_usec(mut self, hold_usec: u64) -> Scanner {
        self.hold_usec = hold_usec;
        self
    }

    /// Cheap check on the raw (escaped) message: false ⇒ [`Scanner::push`] would
    /// produce nothing and hold nothing (memchr prefilter; no allocation).
    pub fn interesting(message: &[u8]) -> bool {
        interesting(message)
    }

    /// The same check on a whole raw saved-log line, prefix included, before
    /// [`parse_line`](crate::parse_line) decodes it: false ⇒ the message `parse_line`
    /// extracts fails [`Scanner::interesting`], so a reader can skip the line without
    /// decoding it (but must still `push` it, e.g. as `""`, while
    /// [`Scanner::has_pending`]: an unrelated record ends a held event).
    ///
    /// Sound because the message is a part of the line whose decoding (rsyslog `#ooo`,
    /// invalid UTF-8 → U+FFFD) never creates the printable bytes a marker is made of;
    /// a kmsg `\xNN` escape could, so a line with a backslash always passes.
    pub fn interesting_line(line: &[u8]) -> bool {
        // The usual driver line, `[  123.456789] NVRM: …`, holds the `NVRM` marker
        // where its message starts: found there without the general search.
        if line.first() == Some(&b'[') {
            // The kernel's own stamp closes at a fixed place: looked at first.
            let close = crate::line::kernel_stamp_close(line)
                .or_else(|| crate::message::find_byte(&line[..line.len().min(40)], 1, b']'));
            if close.is_some_and(|c| line.get(c + 1..c + 6) == Some(b" NVRM")) {
                return true;
            }
        }
        interesting(line) || memchr::memchr(b'\\', line).is_some()
    }

    /// Hands an event the reader is done with back: the next events reuse its
    /// buffers, so a reader that recycles every event allocates nothing per XID
    /// event once the buffers have grown (attributes excepted).
    pub fn recycle(&mut self, mut ev: FaultEvent) {
        if self.spare.len() < MAX_SPARE_EVENTS {
            empty(&mut ev);
            self.spare.push(ev);
        }
    }

    /// A new event of `kind` for the record `meta` / `message` (a recycled one when
    /// there is one).
    fn event(&mut self, kind: FaultKind, meta: &RecordMeta, message: &str) -> FaultEvent {
        let mut ev = self.spare.pop().unwrap_or_default();
        ev.message.push_str(message);
        ev.kmsg_seq = meta.seq;
        ev.monotonic_usec = meta.monotonic_usec;
        ev.time_unix_nano = meta.time_unix_nano;
        ev.facility = meta.facility.map(u32::from);
        ev.level = meta.level.map(u32::from);
        ev.count = 1;
        ev.set_kind(kind);
        ev
    }

    /// Index in `pci_names` of the address `printed`, normalised once per GPU (a node
    /// has a handful): `None` when it is not a PCI address.
    fn pci_name(&mut self, printed: &str) -> Option<usize> {
        if let Some(i) = self
            .pci_names
            .iter()
            .position(|(p, _)| same_text(p, printed))
        {
            return Some(i);
        }
        let normal = normalize_pci(printed)?;
        if self.pci_names.len() >= MAX_IDENTITIES {
            self.pci_names.clear();
        }
        self.pci_names.push((printed.to_owned(), normal));
        Some(self.pci_names.len() - 1)
    }

    /// True while an event is held waiting for follow-up records.
    pub fn has_pending(&self) -> bool {
        self.held.is_some() || !self.fallen.is_empty()
    }

    /// Feeds one record's (unescaped) message; appends finished, classified events
    /// to `out` in input order.
    ///
    /// The driver's three-line report `NVRM: The NVIDIA GPU <pci>` / `NVRM: (PCI ID:
    /// …) installed in this system has` / `NVRM: fallen off the bus and is not
    /// responding to commands.` becomes one event for that GPU whose message starts
    /// with the head line; each GPU's report is its own event, and an XID 79 of the
    /// same GPU that follows joins that GPU's event (one event per GPU).
    pub fn push(&mut self, meta: RecordMeta, message: &str, out: &mut Vec<FaultEvent>) {
        self.push_to(meta, message, &mut Sink::Owned(out));
    }

    /// [`Scanner::push`] handing each finished event to `out` borrowed: from the
    /// record's own text where it can (an XID line emitted at once is never copied
    /// into owned strings), else from an event the scanner assembled, whose buffers
    /// it then reuses. For readers that write or count events and keep none.
    pub fn push_view(
        &mut self,
        meta: RecordMeta,
        message: &str,
        out: &mut dyn FnMut(&FaultEventRef<'_>),
    ) {
        self.push_to(meta, message, &mut Sink::View(out));
    }

    /// [`parse_line`](crate::parse_line) then [`Scanner::push_view`] of one saved-log
    /// line, in one step, for the line an XID storm is made of: the driver's XID line
    /// as the kernel's `dmesg` prints it (`[%5lu.%06lu] NVRM: Xid (…`, valid UTF-8,
    /// no NUL byte) while nothing is held. Returns `false`, having done nothing, for
    /// any other line or while an event is held: the caller then takes the general
    /// path. Events are exactly those of the general path (the saved-log reader's
    /// tests compare it with the plain reading).
    #[inline]
    pub fn push_kernel_xid_line(
        &mut self,
        line: &[u8],
        out: &mut dyn FnMut(&FaultEventRef<'_>),
    ) -> bool {
        if self.has_pending() {
            return false;
        }
        let Some((usec, message)) = crate::line::kernel_xid_line(line) else {
            return false;
        };
        let meta = RecordMeta {
            monotonic_usec: Some(usec),
            ..Default::default()
        };
        // As `push_to` with nothing held: a line that is no XID after all is dropped
        // with the prelude kept; an XID ends any prelude.
        let body = &message["NVRM: Xid (".len()..];
        // `parse_xid`'s two readings, with the usual one's value used in place
        // (through an `or_else`, or `parse_xid` returning it, it is moved once more:
        // a copy the processor stalls on, ~20 instructions a line).
        let x = match crate::message::parse_xid_usual(body) {
            Some(x) => x,
            None => match crate::message::parse_xid_general(body) {
                Some(x) => x,
                None => return true,
            },
        };
        self.prelude = None;
        self.start_xid(meta, &x, message, &mut Sink::View(out));
        true
    }

    fn push_to(&mut self, meta: RecordMeta, message: &str, out: &mut Sink<'_>) {
        if let Some(now) = meta.monotonic_usec
            && self.pending().is_some_and(|h| {
                h.started_usec
                    .is_some_and(|start| now.saturating_sub(start) > self.hold_window(h))
            })
        {
            self.emit_held(out);
        }
        let Some(msg) = parse_message(message) else {
            if self.has_pending() {
                self.emit_held(out);
            }
            return;
        };
        if let Message::NvrmOther { .. } = msg {
            if let Some(i) = find!(message, "Kernel Module")
                && contains!(message, "loading NVIDIA")
            {
                self.driver_version = message[i + 13..]
                    .split_whitespace()
                    .find(|w| {
                        w.split('.').count() >= 2
                            && w.split('.')
                                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .map(str::to_owned);
            }
            if let Some(i) = find!(message, "NVRM: The NVIDIA GPU ")
                && let Some(pci) = crate::pci::find_pci(&message[i..]).and_then(normalize_pci)
            {
                // The head of a new report: whatever was held before is complete.
                if self.held.is_some() {
                    self.emit_held(out);
                }
                self.prelude = Some(Prelude {
                    pci,
                    meta,
                    text: message.trim_start().to_owned(),
                    lines: 1,
                });
                return;
            }
            if let Some(p) = &mut self.prelude
                && p.lines < PRELUDE_MAX_LINES
            {
                p.text.push('\n');
                p.text.push_str(message.trim_start());
                p.lines += 1;
                return;
            }
        }
        if !matches!(msg, Message::FallenOffBus { .. }) {
            self.prelude = None;
        }
        if let Message::FallenOffBus { pci } = msg {
            self.fallen_off(meta, pci, message, out);
            return;
        }
        // While reports wait, every XID 79 joins them (its own GPU's report, or a
        // place of its own among them): a later report of its GPU is then its echo.
        if let Message::Xid(x) = &msg
            && x.code == 79
            && !self.fallen.is_empty()
        {
            self.start_xid(meta, x, message, out);
            return;
        }
        if !self.fallen.is_empty() {
            if let (Message::NvrmOther { .. }, Some(last)) = (&msg, self.fallen.last_mut()) {
                last.append(message);
                return;
            }
            self.emit_held(out);
        }
        if self.held.is_some() && self.attach(&meta, &msg, message) {
            if self.held.as_ref().is_some_and(|h| h.complete) {
                self.emit_held(out);
            }
            return;
        }
        if self.held.is_some() {
            self.emit_held(out);
        }
        self.start(meta, msg, message, out);
    }

    /// A `fallen off the bus` line: the last line of a three-line report, the
    /// driver's echo of an XID 79, or a report of its own.
    fn fallen_off(&mut self, meta: RecordMeta, pci: Option<&str>, raw: &str, out: &mut Sink<'_>) {
        let prelude = if pci.is_none() {
            self.prelude.take()
        } else {
            self.prelude = None;
            None
        };
        let pci = match (&prelude, pci) {
            (Some(p), _) => p.pci.clone(),
            (None, Some(p)) => norm(Some(p)),
            // A continuation without its head: part of the report being held.
            (None, None) => match self.fallen.last_mut() {
                Some(last) => {
                    last.append(raw);
                    return;
                }
                None => String::new(),
            },
        };
        if let Some(h) = self.fallen.iter_mut().find(|h| h.ev.pci_address == pci) {
            if let Some(p) = &prelude {
                h.append(&p.text);
            }
            h.append(raw);
            return;
        }
        if let Some((_, t)) = self.last_fallen.iter().find(|(p, _)| *p == pci)
            && match (t, meta.monotonic_usec) {
                (Some(t), Some(now)) => now.saturating_sub(*t) <= FALLEN_ECHO_USEC,
                _ => true,
            }
        {
            return;
        }
        if self.held.is_some() {
            self.emit_held(out);
        }
        if self.fallen.len() >= MAX_FALLEN_PENDING {
            let oldest = self.fallen.remove(0);
            self.emit_one(oldest, out);
        }
        let (meta, message) = match &prelude {
            Some(p) => (p.meta, format!("{}\n{}", p.text, raw.trim_start())),
            None => (meta, raw.to_owned()),
        };
        let mut ev = self.event(FaultKind::FallenOffBus, &meta, &message);
        ev.pci_address = pci.clone();
        ev.name = "GPU has fallen off the bus".to_owned();
        self.fallen
            .push(Held::new(HeldKind::FallenOff, ev, vec![pci]));
    }

    /// Emits the held event when its hold window ended at `now_monotonic_usec`.
    pub fn flush_expired(&mut self, now_monotonic_usec: u64, out: &mut Vec<FaultEvent>) {
        let out = &mut Sink::Owned(out);
        let expired = self.pending().is_some_and(|h| {
            h.started_usec
                .is_none_or(|s| now_monotonic_usec.saturating_sub(s) >= self.hold_window(h))
        });
        if expired {
            self.emit_held(out);
        }
    }

    /// The oldest event waiting for follow-up records.
    fn pending(&self) -> Option<&Held> {
        self.held.as_ref().or(self.fallen.first())
    }

    /// How long `h` waits for follow-up records (record time).
    fn hold_window(&self, h: &Held) -> u64 {
        if h.kind == HeldKind::Xid {
            self.hold_usec.min(XID_REPEAT_USEC)
        } else {
            self.hold_usec
        }
    }

    /// Emits everything held (end of input / shutdown).
    pub fn finish(&mut self, out: &mut Vec<FaultEvent>) {
        self.emit_held(&mut Sink::Owned(out));
    }

    /// [`Scanner::finish`] for a reader of borrowed events (see [`Scanner::push_view`]).
    pub fn finish_view(&mut self, out: &mut dyn FnMut(&FaultEventRef<'_>)) {
        self.emit_held(&mut Sink::View(out));
    }

    fn emit_held(&mut self, out: &mut Sink<'_>) {
        for held in std::mem::take(&mut self.fallen) {
            self.emit_one(held, out);
        }
        if let Some(held) = self.held.take() {
            self.emit_one(held, out);
        }
    }

    fn emit_one(&mut self, mut held: Held, out: &mut Sink<'_>) {
        if held.lines > 1 {
            attr(&mut held.ev, "lines", held.lines.to_string());
        }
        if !held.aer_errors.is_empty() {
            attr(&mut held.ev, "aer_errors", held.aer_errors.join(","));
        }
        if held.dropped_lines > 0 {
            let note = format!("\n[{} more lines not kept]", held.dropped_lines);
            held.ev.message.push_str(&note);
        }
        self.emit(held.ev, out);
    }

    fn emit(&mut self, mut ev: FaultEvent, out: &mut Sink<'_>) {
        if ev.gpu_uuid.is_empty()
            && !ev.pci_address.is_empty()
            && let Some(id) = self.identities.iter().find(|i| i.pci == ev.pci_address)
        {
            ev.gpu_uuid = id.uuid.clone();
            if let Some(s) = &id.serial {
                ev.attributes
                    .entry("gpu_serial".to_owned())
                    .or_insert_with(|| s.clone());
            }
        }
        self.policy.classify(&mut self.ctx, &mut ev);
        match out {
            Sink::Owned(v) => v.push(ev),
            Sink::View(f) => {
                f(&ev.view());
                self.recycle(ev);
            }
        }
    }

    fn hold(&mut self, kind: HeldKind, ev: FaultEvent, devices: Vec<String>) {
        self.held = Some(Held::new(kind, ev, devices));
    }

    /// Tries to attach `msg` to the held event; true when it belonged to it.
    fn attach(&mut self, meta: &RecordMeta, msg: &Message<'_>, raw: &str) -> bool {
        let Some(held) = self.held.as_mut() else {
            return false;
        };
        let belongs = match (held.kind, msg) {
            (HeldKind::Xid, Message::Xid(x)) => held.attach_xid(x, meta),
            (HeldKind::Sxid, Message::Sxid(s)) => {
                s.followup && s.code == held.ev.code && pci_matches(s.pci, &held.ev.pci_address)
            }
            (HeldKind::Aer, Message::AerDetail(d)) => held.attach_aer(d),
            (HeldKind::Gsp | HeldKind::DriverError, Message::NvrmOther { .. }) => true,
            (HeldKind::DriverError, Message::DriverError(d)) => held.attach_driver_error(d),
            (HeldKind::Mce, Message::Mce(m)) => held.attach_mce(m),
            _ => false,
        };
        if belongs {
            held.append(raw);
        }
        belongs
    }

    /// Starts the event `msg` opens: emitted at once, or held for the lines that
    /// belong to it. Lines that only describe (a GPU's identity and serial) are
    /// remembered; continuation lines without a report are dropped.
    fn start(&mut self, meta: RecordMeta, msg: Message<'_>, raw: &str, out: &mut Sink<'_>) {
        match msg {
            Message::Xid(x) => self.start_xid(meta, &x, raw, out),
            Message::Sxid(s) => self.start_sxid(&meta, &s, raw),
            Message::GpuIdentity(id) => self.note_identity(id.pci, id.uuid),
            Message::GpuSerial(serial) => {
                if let Some(i) = self.last_identity.take()
                    && let Some(id) = self.identities.get_mut(i)
                {
                    id.serial = Some(serial.to_owned());
                }
            }
            Message::AerSummary(s) => self.start_aer_summary(&meta, s, raw),
            Message::AerDetail(AerDetail::BusError {
                device,
                severity,
                error_type,
            }) => {
                let mut ev = self.event(FaultKind::PcieAer, &meta, raw);
                ev.pci_address = norm(device);
                attr(&mut ev, "aer_severity", severity.as_str());
                if let Some(t) = error_type {
                    attr(&mut ev, "aer_type", t);
                }
                ev.name = aer_name(severity.as_str());
                let devices = if ev.pci_address.is_empty() {
                    Vec::new()
                } else {
                    vec![ev.pci_address.clone()]
                };
                self.hold(HeldKind::Aer, ev, devices);
            }
            // Waiting fallen-off-the-bus reports are kept apart from `held` (see
            // `Scanner::fallen_off`); the other lines only continue a report.
            Message::FallenOffBus { .. } | Message::AerDetail(_) | Message::NvrmOther { .. } => {}
            Message::Nvlink(n) => {
                let mut ev = self.event(FaultKind::Nvlink, &meta, raw);
                ev.pci_address = norm(n.pci);
                if let Some(l) = n.link {
                    attr(&mut ev, "link", l.to_string());
                }
                if let Some(f) = n.fatal {
                    attr(&mut ev, "fatal", f.to_string());
                }
                ev.name = "NVLink error".to_owned();
                self.emit(ev, out);
            }
            Message::Ecc(e) => self.emit_memory(&meta, FaultKind::Ecc, "ECC error", e, raw, out),
            Message::PageRetirement(e) => {
                let name = "Dynamic page retirement";
                self.emit_memory(&meta, FaultKind::PageRetirement, name, e, raw, out);
            }
            Message::RowRemap { ecc, failure } => {
                let name = if failure {
                    "Row remapping failure"
                } else {
                    "Row remapping"
                };
                let mut ev = self.memory_event(&meta, FaultKind::RowRemap, name, ecc, raw);
                attr(&mut ev, "row_remap_failure", failure.to_string());
                self.emit(ev, out);
            }
            Message::Thermal(t) => self.emit_thermal(&meta, t, raw, out),
            Message::Mce(m) => {
                let Some(part) = m.part else {
                    return;
                };
                let mut ev = self.event(FaultKind::MachineCheck, &meta, raw);
                mce_details(&mut ev, &m);
                ev.name = "Machine check exception".to_owned();
                self.hold(HeldKind::Mce, ev, Vec::new());
                if let Some(h) = &mut self.held {
                    h.mce_parts = mce_bit(part);
                }
            }
            Message::Peermem { function } => {
                let mut ev = self.event(FaultKind::Peermem, &meta, raw);
                if let Some(f) = function {
                    attr(&mut ev, "function", f);
                }
                ev.name = "nvidia-peermem error".to_owned();
                self.emit(ev, out);
            }
            Message::DriverError(d) => self.start_driver_error(&meta, &d, raw),
            Message::Nic(n) => self.emit_nic(&meta, n, raw, out),
        }
    }

    /// A NIC line (`mlx5_core`): one event of its own, at the NIC's PCI function,
    /// with `nic_event` and what the line names (`netdev`; `module`,
    /// `module_status`, `module_error`; `health_detail`). Its name and action are
    /// the policy's (by `nic_event`, and `module_status` for module events).
    fn emit_nic(&mut self, meta: &RecordMeta, n: NicMsg<'_>, raw: &str, out: &mut Sink<'_>) {
        let mut ev = self.event(FaultKind::Nic, meta, raw);
        ev.pci_address = norm(n.pci);
        attr(&mut ev, "nic_event", n.event.as_str());
        match n.event {
            NicEvent::Link { netdev, .. } => {
                if !netdev.is_empty() {
                    attr(&mut ev, "netdev", netdev);
                }
            }
            NicEvent::Module {
                module,
                status,
                error,
            } => {
                attr(&mut ev, "module", module.to_string());
                attr(&mut ev, "module_status", module_status(status));
                if let Some(e) = error {
                    attr(&mut ev, "module_error", e);
                }
            }
            NicEvent::Health { detail } => attr(&mut ev, "health_detail", detail),
        }
        self.emit(ev, out);
    }

    /// An SXid line that no held report took. A head line starts a report; a
    /// follow-up line (`Severity …`, `Data {…}`, `SOE HALT data[…]`) whose head
    /// was seen — the same switch and code, within [`SXID_REPORT_USEC`] — belongs
    /// to that report and is dropped; without its head (a pasted excerpt, a head
    /// the ring overwrote) it is a report of its own: the switch said something
    /// went wrong, and saying nothing would lose it.
    fn start_sxid(&mut self, meta: &RecordMeta, s: &SxidMsg<'_>, raw: &str) {
        let switch = norm(Some(s.pci));
        let head_seen = self.last_sxid.iter().any(|(p, code, t)| {
            *p == switch
                && *code == s.code
                && match (t, meta.monotonic_usec) {
                    (Some(t), Some(now)) => now.saturating_sub(*t) <= SXID_REPORT_USEC,
                    _ => true,
                }
        });
        if s.followup && head_seen {
            return;
        }
        if !s.followup {
            note_sxid(&mut self.last_sxid, &switch, s.code, meta.monotonic_usec);
        }
        let mut ev = self.event(FaultKind::Sxid, meta, raw);
        ev.code = s.code;
        ev.pci_address = switch.clone();
        attr(&mut ev, "nvswitch", switch);
        if let Some(f) = s.fatal {
            attr(&mut ev, "fatal", f.to_string());
        }
        if let Some(l) = s.link {
            attr(&mut ev, "sxid_link", l.to_string());
        }
        if s.followup {
            attr(&mut ev, "sxid_head", "absent");
            ev.name = format!("SXid {} (report head not in the log)", s.code);
        } else {
            let name = s.detail.split_once(", ").map_or(s.detail, |x| x.1).trim();
            ev.name = name.trim_end_matches("(First)").trim_end().to_owned();
        }
        self.hold(HeldKind::Sxid, ev, Vec::new());
    }

    /// `NVRM: GPU at PCI:<pci>: <uuid>`: later events of that address carry the UUID
    /// (and the serial printed next, see [`Message::GpuSerial`]).
    fn note_identity(&mut self, pci: &str, uuid: &str) {
        let pci = norm(Some(pci));
        let idx = match self.identities.iter().position(|i| i.pci == pci) {
            Some(i) => {
                self.identities[i].uuid = uuid.to_owned();
                i
            }
            None => {
                if self.identities.len() >= MAX_IDENTITIES {
                    self.identities.remove(0);
                }
                self.identities.push(Identity {
                    pci,
                    uuid: uuid.to_owned(),
                    serial: None,
                });
                self.identities.len() - 1
            }
        };
        self.last_identity = Some(idx);
    }

    /// An AER summary (`AER: Corrected error received: <source>`): held for the
    /// detail lines of the devices it names.
    fn start_aer_summary(&mut self, meta: &RecordMeta, s: AerSummary<'_>, raw: &str) {
        let reporter = norm(Some(s.reporter));
        let mut ev = self.event(FaultKind::PcieAer, meta, raw);
        ev.pci_address = s.source.clone().unwrap_or_else(|| reporter.clone());
        attr(&mut ev, "aer_severity", s.severity.as_str());
        attr(&mut ev, "aer_reporter", reporter.clone());
        ev.name = aer_name(s.severity.as_str());
        let mut devices = vec![reporter];
        if let Some(src) = s.source
            && src != devices[0]
        {
            devices.push(src);
        }
        self.hold(HeldKind::Aer, ev, devices);
    }

    /// An ECC, page-retirement or row-remap event of one line.
    fn memory_event(
        &mut self,
        meta: &RecordMeta,
        kind: FaultKind,
        name: &str,
        e: EccMsg<'_>,
        raw: &str,
    ) -> FaultEvent {
        let mut ev = self.event(kind, meta, raw);
        ev.pci_address = norm(e.pci);
        if let Some(t) = e.ecc_type {
            attr(&mut ev, "ecc_type", t);
        }
        ev.name = name.to_owned();
        ev
    }

    fn emit_memory(
        &mut self,
        meta: &RecordMeta,
        kind: FaultKind,
        name: &str,
        e: EccMsg<'_>,
        raw: &str,
        out: &mut Sink<'_>,
    ) {
        let ev = self.memory_event(meta, kind, name, e, raw);
        self.emit(ev, out);
    }

    /// A thermal line: the GPU's when it names a PCI address or comes from the
    /// NVIDIA driver, else the host CPU's (the x86 thermal-throttle messages,
    /// `CPU3: Core temperature above threshold …`, with or without `mce: `).
    /// `thermal_sensor` says which (`gpu`, `cpu_core`, `cpu_package`, `cpu`); the
    /// policy's reason follows it.
    fn emit_thermal(
        &mut self,
        meta: &RecordMeta,
        t: ThermalMsg<'_>,
        raw: &str,
        out: &mut Sink<'_>,
    ) {
        let mut ev = self.event(FaultKind::Thermal, meta, raw);
        ev.pci_address = norm(t.pci);
        if let Some(c) = t.temperature_c {
            attr(&mut ev, "temperature_c", c.to_string());
        }
        let gpu = t.pci.is_some() || contains!(raw, "NVRM");
        let sensor = if gpu {
            "gpu"
        } else if contains!(raw, "Package temperature") {
            "cpu_package"
        } else if contains!(raw, "Core temperature") {
            "cpu_core"
        } else {
            "cpu"
        };
        attr(&mut ev, "thermal_sensor", sensor);
        if !gpu && let Some(cpu) = cpu_number(raw) {
            attr(&mut ev, "cpu", cpu.to_string());
        }
        ev.name = if gpu {
            "GPU thermal slowdown".to_owned()
        } else {
            "CPU temperature above threshold".to_owned()
        };
        self.emit(ev, out);
    }

    /// A driver error (`RmInitAdapter failed`, a failed probe): held for the
    /// driver's lines that explain it.
    fn start_driver_error(&mut self, meta: &RecordMeta, d: &DriverErrorMsg<'_>, raw: &str) {
        let mut ev = self.event(FaultKind::DriverError, meta, raw);
        ev.pci_address = norm(d.pci);
        attr(
            &mut ev,
            "driver_error",
            match d.code {
                Some(c) => format!("{} ({c})", d.error),
                None => d.error.to_owned(),
            },
        );
        ev.name = match d.error {
            "rm_init_adapter_failed" => "GPU initialisation failed (RmInitAdapter)",
            "probe_failed" => "NVIDIA driver probe failed",
            "no_devices_initialized" => "No NVIDIA GPU initialised",
            "gpu_lost" => "GPU lost",
            _ => "NVIDIA driver error",
        }
        .to_owned();
        self.hold(HeldKind::DriverError, ev, Vec::new());
    }

    /// An XID line. Its event is built borrowed, from the line, the identity table and
    /// the policy: a line that is its own event (nearly all) is decided and handed out
    /// without an owned copy; only a line that waits for more (a GSP dump, the other
    /// lines of one fault, a GPU's fallen-off report) becomes an owned event.
    fn start_xid(&mut self, meta: RecordMeta, x: &XidMsg<'_>, raw: &str, out: &mut Sink<'_>) {
        let interned = self.pci_name(x.pci);
        // An address edited before the log was pasted: reported as given when it still
        // names a bus and device, else unknown; the line is never dropped.
        let edited = match interned {
            Some(_) => None,
            None => Some(crate::pci::edited_pci(x.pci)),
        };
        let pci = match (interned, &edited) {
            (Some(i), _) => self.pci_names[i].1.as_str(),
            (None, Some(e)) => e.as_deref().unwrap_or(""),
            (None, None) => "",
        };
        let waits = matches!(x.code, 119 | 120)
            || (x.pid.is_none() && x.code_as_printed.is_none() && multi_line_xid(x.code))
            || (x.code == 79 && !self.fallen.is_empty());
        if x.code == 79 {
            note_fallen(&mut self.last_fallen, pci, meta.monotonic_usec);
        }
        let id = self
            .identities
            .iter()
            .find(|i| !pci.is_empty() && same_text(&i.pci, pci));
        let mut link = [0u8; 10];
        let mut attrs = [("", ""); 16];
        let mut n = 0;
        let mut add = |pair| insert_attr(&mut attrs, &mut n, pair);
        if let Some(e) = &edited {
            add(("pci_as_printed", x.pci));
            add((
                "pci_note",
                match e {
                    Some(_) => "device number above 0x1f: not a valid PCI address",
                    None => "address redacted: GPU unknown",
                },
            ));
        }
        xid_line_attrs(x, self.driver_version.as_deref(), &mut link, &mut add);
        if let Some(s) = id.and_then(|i| i.serial.as_deref()) {
            add(("gpu_serial", s));
        }
        let mut view = FaultEventRef {
            kind: FaultKind::Xid as i32,
            code: x.code,
            pci_address: pci,
            gpu_uuid: id.map_or("", |i| i.uuid.as_str()),
            pid: x.pid,
            process: x.process.unwrap_or(""),
            message: raw,
            kmsg_seq: meta.seq,
            monotonic_usec: meta.monotonic_usec,
            time_unix_nano: meta.time_unix_nano,
            facility: meta.facility.map(u32::from),
            level: meta.level.map(u32::from),
            count: 1,
            attributes: Attrs::list(&attrs[..n]),
            ..FaultEventRef::EMPTY
        };
        if !waits {
            let d = self.policy.decide_xid(&mut self.ctx, &view);
            // A context rule's attribute joins a copy of the list (most decisions
            // have none, and the list stays as built).
            let with_context;
            if let Some(c) = &d.context {
                let (mut all, mut m) = ([("", ""); 17], n);
                all[..n].copy_from_slice(&attrs[..n]);
                insert_attr(&mut all, &mut m, ("context", c));
                with_context = (all, m);
                view.attributes = Attrs::list(&with_context.0[..with_context.1]);
            }
            view.action = d.action as i32;
            view.severity = d.action.default_severity() as i32;
            view.policy_reason = &d.reason;
            view.name = &d.name;
            match out {
                Sink::Owned(v) => {
                    let mut owned = self.spare.pop().unwrap_or_default();
                    view.write_into(&mut owned);
                    v.push(owned);
                }
                Sink::View(f) => f(&view),
            }
            return;
        }
        // Classified when it is emitted (see `emit`).
        let mut ev = self.spare.pop().unwrap_or_default();
        view.write_into(&mut ev);
        self.hold_xid(ev, out);
    }

    /// Holds an XID event that waits for more lines: XID 119/120 for the GSP dump,
    /// an XID 79 among waiting fallen-off-the-bus reports, any other for the other
    /// lines of one fault.
    fn hold_xid(&mut self, mut ev: FaultEvent, out: &mut Sink<'_>) {
        if ev.code == 79 {
            // A waiting `fallen off the bus` report of the same GPU was the prelude of
            // this XID 79: one event, the XID's, with the report's lines first. It keeps
            // its place among the other GPUs' reports (input order).
            if let Some(h) = self
                .fallen
                .iter_mut()
                .find(|h| h.ev.pci_address == ev.pci_address)
            {
                ev.message = format!("{}\n{}", h.ev.message, ev.message);
                h.ev = ev;
                return;
            }
            if !self.fallen.is_empty() {
                if self.fallen.len() >= MAX_FALLEN_PENDING {
                    let oldest = self.fallen.remove(0);
                    self.emit_one(oldest, out);
                }
                let pci = ev.pci_address.clone();
                self.fallen
                    .push(Held::new(HeldKind::FallenOff, ev, vec![pci]));
                return;
            }
        }
        if matches!(ev.code, 119 | 120) {
            self.hold(HeldKind::Gsp, ev, Vec::new());
        } else {
            self.hold(HeldKind::Xid, ev, Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Borrowed events (an XID line decided straight from its text) equal the owned
    /// ones line for line: identity (UUID, serial attribute), channel, ECC type, a
    /// context rule's attribute, XID 79, and the held/assembled events in between.
    #[test]
    fn borrowed_events_equal_owned_ones() {
        let lines = [
            "NVRM: GPU at PCI:0000:3b:00: GPU-6b1a2c3d-0000-1111-2222-333344445555",
            "NVRM: GPU Board Serial Number: 1653723052734",
            "NVRM: Xid (PCI:0000:3b:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 0",
            "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE (0x1)",
            "NVRM: Xid (PCI:0000:3b:00): 63, pid=1, name=x, ECC page retirement",
            "NVRM: Xid (PCI:0000:3b:00): 45, pid=2, name=y, Ch 00000010",
            "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python, Ch 00000001",
            "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
            "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
            "NVRM: Xid (PCI:0000:3b:00): 94, pid=4142, name=python, Contained: SM (0x1)",
            "NVRM: Xid (PCI:...): 13, pid=1, name=x, edited",
            "mlx5_core 0000:1a:00.0 ens1f0np0: Link down",
            "mlx5_core 0000:5c:00.0: port_module:1103:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",
        ];
        let policy = Arc::new(Policy::default());
        let (mut owner, mut viewer) = (Scanner::new(Arc::clone(&policy)), Scanner::new(policy));
        let (mut owned, mut viewed) = (Vec::new(), Vec::new());
        let mut contexts = 0;
        for (i, l) in lines.iter().enumerate() {
            let meta = RecordMeta {
                seq: Some(i as u64),
                monotonic_usec: Some(1_000_000 + 100 * i as u64),
                facility: Some(0),
                level: Some(3),
                ..Default::default()
            };
            owner.push(meta, l, &mut owned);
            viewer.push_view(meta, l, &mut |ev| {
                contexts += usize::from(ev.attr("context").is_some());
                viewed.push(ev.to_event());
            });
            assert_eq!(viewed, owned, "{l}");
        }
        owner.finish(&mut owned);
        viewer.finish_view(&mut |ev| viewed.push(ev.to_event()));
        assert_eq!(viewed, owned);
        assert!(contexts >= 2, "{contexts}");
        let with = |k: &str| {
            owned
                .iter()
                .filter(|e| e.attributes.contains_key(k))
                .count()
        };
        assert!(with("gpu_serial") >= 5 && with("channel") >= 3 && with("ecc_type") >= 1);
    }

    /// The stamps and messages the one-step reading of the kernel's XID line must
    /// take or leave to the general path: the kernel's own widths and the shapes
    /// next to them (wider seconds, caller ids, `host kernel:` tags, `dmesg -x`
    /// prefixes, CRLF, NUL bytes, invalid UTF-8), and messages that hold events
    /// back (GSP dumps, XIDs waiting for their other lines, fallen-off reports)
    /// or end them (an AER summary, NIC lines).
    const STAMPS: &[&str] = &[
        "[ 1234.567890] ",
        "[12345.678901] ",
        "[    5.000001] ",
        "[1234567.000001] ",
        "[ 1234.56789] ",
        "[ 1234.567890] [ T291] ",
        "[ 1234.567890]  ",
        "[ 1234.567890] gpu-node kernel: ",
        "kern  :err   : [ 1234.567890] ",
        "<3>[ 1234.567890] ",
        "[ 12a4.567890] ",
        "",
    ];
    const MESSAGES: &[&str] = &[
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception",
        "NVRM: Xid (PCI:0000:86:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 0",
        "NVRM: Xid (PCI:0000:3b:00): 48, DBE (0x1)",
        "NVRM: Xid (PCI:0000:3b:00): 119, Timeout after 6s of waiting for RPC response",
        "NVRM: GPU at PCI:0000:3b:00: GPU-6b1a2c3d-0000-1111-2222-333344445555",
        "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: The NVIDIA GPU 0000:92:00.0",
        "NVRM: (PCI ID: 10de:2335) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
        "NVRM: Xid (PCI:0000:92:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:...): 13, pid=1, name=x, edited",
        "NVRM: Xid (PCI:0000:3b:00): -5, pid=1, name=x, negative",
        "NVRM: Xid (PCI:0000:3b:00) 13, no colon",
        "NVRM: Xid (garbage",
        "NVRM: Xid (PCI:0000:3b:00): 94, pid=4142, name=python, Contained: SM (0x1)\r",
        "NVRM: Xid (PCI:0000:3b:00): 43, pid=\u{0}1, name=x, Ch 00000008",
        "NVRM: Xid (PCI:0000:3b:00): 43, pid=1, name=caf\u{e9}, Ch 00000008",
        "NVRM: Xid(PCI:0000:3b:00): 43, no blank",
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x24:0x65:1426)",
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
        "mlx5_core 0000:1a:00.0 ens1f0np0: Link down",
        "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count",
    ];

    /// Feeds `lines` the reader's way (the one-step path first, else the general
    /// one) and the general way only; both scanners' events must be equal after
    /// every line. Returns how many lines took the one-step path.
    fn one_step_agrees(lines: &[Vec<u8>]) -> usize {
        let policy = Arc::new(Policy::default());
        let (mut fast, mut general) = (Scanner::new(Arc::clone(&policy)), Scanner::new(policy));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut taken = 0;
        for l in lines {
            let one_step = fast.push_kernel_xid_line(l, &mut |ev| a.push(ev.to_event()));
            if one_step {
                taken += 1;
            } else {
                let p = crate::parse_line(l);
                fast.push_view(p.meta(), &p.message, &mut |ev| a.push(ev.to_event()));
            }
            let p = crate::parse_line(l);
            general.push_view(p.meta(), &p.message, &mut |ev| b.push(ev.to_event()));
            assert_eq!(
                a,
                b,
                "{:?} (one step: {one_step})",
                String::from_utf8_lossy(l)
            );
        }
        fast.finish_view(&mut |ev| a.push(ev.to_event()));
        general.finish_view(&mut |ev| b.push(ev.to_event()));
        assert_eq!(a, b);
        taken
    }

    fn line(stamp: &str, message: &str, invalid_utf8: bool) -> Vec<u8> {
        let mut l = format!("{stamp}{message}").into_bytes();
        if invalid_utf8 {
            l.insert(l.len().min(40), 0xff);
        }
        l.push(b'\n');
        l
    }

    /// Every stamp with every message, in order (so that each message meets the
    /// state the ones before left), valid and invalid UTF-8.
    #[test]
    fn kernel_xid_lines_in_one_step_are_the_general_reading() {
        let mut lines = Vec::new();
        for bad in [false, true] {
            for stamp in STAMPS {
                for message in MESSAGES {
                    lines.push(line(stamp, message, bad));
                }
            }
        }
        let taken = one_step_agrees(&lines);
        // The kernel's widths of the XID lines not held back take the one step.
        assert!(taken >= 30, "{taken}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Any order of those lines: held events, preludes and waiting reports
        /// start and end anywhere.
        #[test]
        fn kernel_xid_lines_in_one_step_in_any_order(picks in proptest::collection::vec(
            (0..STAMPS.len(), 0..MESSAGES.len(), proptest::bool::weighted(0.05)),
            1..40,
        )) {
            let lines: Vec<Vec<u8>> = picks
                .iter()
                .map(|&(s, m, bad)| line(STAMPS[s], MESSAGES[m], bad))
                .collect();
            one_step_agrees(&lines);
        }
    }

    /// Events from a scanner whose reader recycles every event equal those of one
    /// whose reader keeps them, line for line.
    #[test]
    fn recycled_events_are_indistinguishable() {
        let lines = [
            "NVRM: Xid (PCI:0000:86:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 0",
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception",
            "NVRM: Xid (PCI:0000:3b:00): 48, DBE (0x1)",
            "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
            "NVRM: Xid (PCI:...): 13, pid=1, name=x, edited",
            "NVRM: Xid (PCI:0000:3b:00): 94, pid=4142, name=python, Contained: SM (0x1)",
            "mlx5_core 0000:63:00.1: Port module event: module 1, Cable unplugged",
        ];
        let policy = Arc::new(Policy::default());
        let (mut keep, mut reuse) = (Scanner::new(Arc::clone(&policy)), Scanner::new(policy));
        let (mut kept, mut out) = (Vec::new(), Vec::new());
        for round in 0..3u64 {
            for (i, l) in lines.iter().enumerate() {
                let meta = RecordMeta {
                    seq: Some(round * 10 + i as u64),
                    monotonic_usec: Some(1_000_000 * (round * 10 + i as u64)),
                    ..Default::default()
                };
                let before = kept.len();
                keep.push(meta, l, &mut kept);
                reuse.push(meta, l, &mut out);
                assert_eq!(out, kept[before..], "{l}");
                for ev in out.drain(..) {
                    reuse.recycle(ev);
                }
            }
        }
        let before = kept.len();
        keep.finish(&mut kept);
        reuse.finish(&mut out);
        assert_eq!(out, kept[before..]);
        assert!(kept.len() > 15, "{}", kept.len());
    }
}
