//! PCIe AER: the reporting port's summary and the devices' detail lines.

use super::Message;

/// Severity of a PCIe AER error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AerSeverity {
    /// Corrected / Correctable.
    Corrected,
    /// Uncorrected (Non-Fatal).
    UncorrectedNonFatal,
    /// Uncorrected (Fatal).
    UncorrectedFatal,
}

impl AerSeverity {
    /// Attribute value: `corrected`, `uncorrected_nonfatal`, `uncorrected_fatal`.
    pub fn as_str(self) -> &'static str {
        match self {
            AerSeverity::Corrected => "corrected",
            AerSeverity::UncorrectedNonFatal => "uncorrected_nonfatal",
            AerSeverity::UncorrectedFatal => "uncorrected_fatal",
        }
    }

    fn from_text(s: &str) -> Option<AerSeverity> {
        if contains!(s, "Non-Fatal")
            || contains!(s, "Nonfatal")
            || contains!(s, "NonFatal")
            || contains!(s, "non-fatal")
        {
            Some(AerSeverity::UncorrectedNonFatal)
        } else if contains!(s, "Fatal") || contains!(s, "fatal") {
            Some(AerSeverity::UncorrectedFatal)
        } else if contains!(s, "Correct") {
            Some(AerSeverity::Corrected)
        } else if contains!(s, "Uncorrect") {
            Some(AerSeverity::UncorrectedNonFatal)
        } else {
            None
        }
    }
}

/// AER summary printed by the reporting port:
/// `pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AerSummary<'a> {
    /// The port that reported (the device printing the line).
    pub reporter: &'a str,
    /// Severity.
    pub severity: AerSeverity,
    /// `Multiple ... error received`.
    pub multiple: bool,
    /// The source device, when printed as an address (`received: 0000:01:00.0`,
    /// `received from 0000:01:00.0`) or decoded from the old `id=0018` form.
    pub source: Option<String>,
}

/// One AER detail record of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AerDetail<'a> {
    /// `PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)`.
    BusError {
        /// Device printing the line; `None` when the line was printed (or saved)
        /// without the `pcieport <bdf>:` prefix.
        device: Option<&'a str>,
        /// Severity.
        severity: AerSeverity,
        /// `type=...` value.
        error_type: Option<&'a str>,
    },
    /// `device [10de:2330] error status/mask=00000001/0000e000`.
    Status {
        /// Device printing the line.
        device: Option<&'a str>,
        /// Status word as printed.
        status: &'a str,
    },
    /// `   [ 0] RxErr                  (First)`: one error bit.
    Bit {
        /// Device printing the line.
        device: Option<&'a str>,
        /// Error name (`RxErr`, `CmpltTO`, ...).
        name: &'a str,
    },
    /// Any other AER line of a device (TLP header, recovery result, ...).
    Other {
        /// Device printing the line.
        device: Option<&'a str>,
    },
}

/// The device a `driver 0000:3b:00.0: ...` line is printed for, and the text after it.
fn device_prefix(msg: &str) -> Option<(&str, &str)> {
    // Copied logs often keep a leading blank before `pcieport ...`.
    let msg = msg.trim_start();
    let sp = msg.find(' ')?;
    let rest = &msg[sp + 1..];
    let colon = rest.find(": ")?;
    let dev = &rest[..colon];
    if !crate::pci::is_pci(dev) || !dev.contains('.') {
        return None;
    }
    Some((dev, &rest[colon + 2..]))
}

pub(super) fn parse_aer(msg: &str) -> Option<Message<'_>> {
    let (device, body) = match device_prefix(msg) {
        Some((d, b)) => (Some(d), b),
        None => (None, msg),
    };
    let (aer_prefixed, body) = match body.strip_prefix("AER: ") {
        Some(b) => (true, b),
        None => (false, body),
    };
    // Summary: `[Multiple ]Corrected error received: 0000:01:00.0` and the 6.x form
    // `Correctable error message received from 0000:01:00.0`.
    if let Some(i) = find!(body, "error received")
        .or_else(|| find!(body, "error message received"))
        .filter(|_| aer_prefixed || device.is_some())
    {
        let head = &body[..i];
        let severity = AerSeverity::from_text(head)?;
        let reporter = device?;
        let tail = &body[i..];
        let tail = tail
            .split_once("received from ")
            .or_else(|| tail.split_once("received: "))
            .map(|(_, t)| t.trim())
            .unwrap_or("");
        let source = if let Some(id) = tail.strip_prefix("id=") {
            crate::pci::pci_from_requester_id(id.get(..4).unwrap_or(id), reporter)
        } else {
            tail.split_whitespace()
                .next()
                .and_then(crate::pci::normalize_pci)
        };
        return Some(Message::AerSummary(AerSummary {
            reporter,
            severity,
            multiple: head.trim_start().starts_with("Multiple"),
            source,
        }));
    }
    let bus_error = body.strip_prefix("PCIe Bus Error: ").or_else(|| {
        // Without a device prefix the line may keep other prefixes (`kernel: `).
        device
            .is_none()
            .then(|| find!(body, "PCIe Bus Error: ").map(|i| &body[i + 16..]))
            .flatten()
    });
    if let Some(p) = bus_error {
        let sev = p
            .strip_prefix("severity=")
            .map(|s| s.split(", type=").next().unwrap_or(s))?;
        let severity = AerSeverity::from_text(sev)?;
        let error_type = find!(p, "type=").map(|i| {
            let t = &p[i + 5..];
            t.split(',').next().unwrap_or(t).trim()
        });
        return Some(Message::AerDetail(AerDetail::BusError {
            device,
            severity,
            error_type,
        }));
    }
    let trimmed = body.trim_start();
    if let Some(d) = trimmed.strip_prefix("device [")
        && let Some(i) = find!(d, "error status/mask=")
    {
        let status = d[i + 18..].split('/').next().unwrap_or("").trim();
        return Some(Message::AerDetail(AerDetail::Status { device, status }));
    }
    // `    [ 0] RxErr`; kernels 4.19-5.x print `AER: [ 0] RxErr` (one blank).
    if (body.starts_with("   [") || (aer_prefixed && body.starts_with('[')))
        && (aer_prefixed || device.is_some())
        && let Some(close) = trimmed.find(']')
        && trimmed[1..close].trim().parse::<u32>().is_ok()
    {
        let after = trimmed[close + 1..].trim();
        let name = after.strip_suffix("(First)").unwrap_or(after).trim_end();
        if !name.is_empty() {
            return Some(Message::AerDetail(AerDetail::Bit { device, name }));
        }
    }
    if aer_prefixed {
        return Some(Message::AerDetail(AerDetail::Other { device }));
    }
    None
}
