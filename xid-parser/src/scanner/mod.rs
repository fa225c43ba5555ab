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
//! - NIC lines (`mlx5_core`: link up/down, port module events, health reports,
//!   firmware command timeouts, slot power; the transmit watchdog of any driver)
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

mod held;
mod start;
#[cfg(test)]
mod tests;

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
struct KnownGpu {
    pci: String,
    uuid: String,
    serial: Option<String>,
}

use held::{Held, HeldKind};

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
    identities: Vec<KnownGpu>,
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

/// Events kept for reuse by [`Scanner::recycle`]: a burst's worth (the
/// agent's kernel-log reader gets its events back from the engine only
/// after they were emitted, often once the burst was read).
const MAX_SPARE_EVENTS: usize = 64;

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
}
