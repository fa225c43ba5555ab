//! An event held for the records that may still belong to it, and how
//! each kind of follow-up line attaches to it.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeldKind {
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
pub(super) struct Held {
    pub(super) kind: HeldKind,
    pub(super) ev: FaultEvent,
    pub(super) started_usec: Option<u64>,
    /// Devices whose AER detail lines belong to this event (normalised).
    devices: Vec<String>,
    pub(super) aer_errors: Vec<String>,
    pub(super) dropped_lines: u32,
    /// AER: the source named by the summary printed its own detail lines.
    source_detail: bool,
    /// Machine check: the report parts seen (bit per [`McePart`]).
    pub(super) mce_parts: u8,
    /// XID: kernel lines of this one occurrence.
    pub(super) lines: u32,
    /// XID: the line naming the process arrived; nothing more belongs to it.
    pub(super) complete: bool,
}

impl Held {
    pub(super) fn new(kind: HeldKind, ev: FaultEvent, devices: Vec<String>) -> Held {
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

    pub(super) fn append(&mut self, msg: &str) {
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
    pub(super) fn attach_xid(&mut self, x: &XidMsg<'_>, meta: &RecordMeta) -> bool {
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
    pub(super) fn attach_aer(&mut self, d: &AerDetail<'_>) -> bool {
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
    pub(super) fn attach_driver_error(&mut self, d: &DriverErrorMsg<'_>) -> bool {
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
    pub(super) fn attach_mce(&mut self, m: &MceMsg) -> bool {
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
