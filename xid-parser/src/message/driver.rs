//! NVIDIA driver lines other than XIDs: the GPU's identity and serial number,
//! driver errors and probe failures, nvidia-peermem errors, and the dispatch of
//! every other `NVRM:` line.

use super::Message;
use super::ecc::{EccMsg, ecc_type_of};
use super::nvlink::parse_nvlink;
use super::text::leading_u32;
use super::thermal::parse_thermal;

/// `NVRM: GPU at PCI:0000:3b:00: GPU-6b1a...` (printed before a GPU's first XID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuIdentity<'a> {
    /// PCI address as printed.
    pub pci: &'a str,
    /// `GPU-...` UUID.
    pub uuid: &'a str,
}

/// Other NVRM driver errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverErrorMsg<'a> {
    /// A PCI address named in the line.
    pub pci: Option<&'a str>,
    /// Short stable identifier (`rm_init_adapter_failed`, `probe_failed`, ...).
    pub error: &'static str,
    /// Error code as printed (`0x26:0x65:1462`, `-1`), when any.
    pub code: Option<&'a str>,
}

/// `rest` is the text after `NVRM:`.
pub(super) fn parse_nvrm_other(rest: &str) -> Message<'_> {
    // `GPU at PCI:0000:3b:00: GPU-...` identity.
    if let Some(r) = rest
        .strip_prefix("GPU at PCI:")
        .or_else(|| rest.strip_prefix("GPU at "))
        && let Some(colon) = r.find(": ")
        && crate::pci::is_pci(&r[..colon])
    {
        let uuid = r[colon + 2..].trim();
        if uuid.starts_with("GPU-") && !uuid.contains(' ') {
            return Message::GpuIdentity(GpuIdentity {
                pci: &r[..colon],
                uuid,
            });
        }
    }
    if let Some(serial) = rest.strip_prefix("GPU Board Serial Number:") {
        let serial = serial.trim();
        if !serial.is_empty() {
            return Message::GpuSerial(serial);
        }
    }
    let pci = crate::pci::find_pci(rest);
    if contains!(rest, "fallen off the bus") {
        return Message::FallenOffBus { pci };
    }
    if let Some(m) = parse_driver_error(rest, pci) {
        return m;
    }
    if contains!(rest, "Row Remapper")
        || contains!(rest, "row remap")
        || contains!(rest, "Row remap")
    {
        let failure = contains!(rest, "fail") || contains!(rest, "Fail");
        return Message::RowRemap {
            ecc: EccMsg {
                pci,
                ecc_type: None,
            },
            failure,
        };
    }
    if contains!(rest, "Dynamic Page Retirement") || contains!(rest, "page retire") {
        return Message::PageRetirement(EccMsg {
            pci,
            ecc_type: ecc_type_of(rest),
        });
    }
    if (contains!(rest, "ECC")
        || contains!(rest, "double bit error")
        || contains!(rest, "single bit error"))
        && (contains!(rest, "error") || contains!(rest, "Error"))
        && !contains!(rest, "ECC mode")
    {
        return Message::Ecc(EccMsg {
            pci,
            ecc_type: ecc_type_of(rest),
        });
    }
    if let Some(m) = parse_thermal(rest, pci) {
        return m;
    }
    if (contains!(rest, "NVLink") || contains!(rest, "nvlink"))
        && let Some(m) = parse_nvlink(rest)
    {
        return m;
    }
    let gpu_ordinal = rest
        .strip_prefix("GPU")
        .and_then(leading_u32)
        .map(|(n, _)| n);
    Message::NvrmOther { gpu_ordinal }
}

fn parse_driver_error<'a>(rest: &'a str, pci: Option<&'a str>) -> Option<Message<'a>> {
    let (error, at) = if let Some(i) = find!(rest, "RmInitAdapter failed") {
        ("rm_init_adapter_failed", i)
    } else if let Some(i) = find!(rest, "rm_init_adapter failed") {
        ("rm_init_adapter_failed", i)
    } else if let Some(i) = find!(rest, "probe routine failed") {
        ("probe_failed", i)
    } else if let Some(i) = find!(rest, "None of the NVIDIA devices were initialized") {
        ("no_devices_initialized", i)
    } else if let Some(i) = find!(rest, "failed to allocate") {
        ("allocation_failed", i)
    } else if let Some(i) = find!(rest, "GPU is lost") {
        ("gpu_lost", i)
    } else if let Some(i) = find!(rest, "RmInitAdapter") {
        ("rm_init_adapter_failed", i)
    } else {
        return None;
    };
    // Code in parentheses after the match: `(0x26:0x65:1462)`.
    let tail = &rest[at..];
    let code = tail.find('(').and_then(|o| {
        let inner = &tail[o + 1..];
        let c = inner.find(')')?;
        let code = &inner[..c];
        code.starts_with("0x").then_some(code)
    });
    Some(Message::DriverError(DriverErrorMsg { pci, error, code }))
}

/// `nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, …`:
/// the module prints its name, the function and line, then `ERROR`.
pub(super) fn parse_peermem(msg: &str) -> Option<Message<'_>> {
    let i = find!(msg, "nvidia-peermem")?;
    if i > 0 && !msg.as_bytes()[i - 1].is_ascii_whitespace() {
        return None;
    }
    let rest = msg[i + 14..].trim_start_matches(':').trim_start();
    let e = find!(rest, "ERROR")?;
    let function = rest[..e]
        .split_whitespace()
        .next()
        .map(|f| f.split(':').next().unwrap_or(f))
        .filter(|f| !f.is_empty());
    Some(Message::Peermem { function })
}

/// `nvidia: probe of 0000:3b:00.0 failed with error -1` (`nvidia-nvlink: …` too): a
/// driver that failed to bind a device.
pub(super) fn parse_probe_failure(msg: &str) -> Option<Message<'_>> {
    let i = find!(msg, "probe of ")?;
    if !contains!(&msg[..i], "nvidia") {
        return None;
    }
    let j = find!(&msg[i..], "failed with error ")?;
    let code = msg[i + j + 18..].split_whitespace().next();
    Some(Message::DriverError(DriverErrorMsg {
        pci: crate::pci::find_pci(msg),
        error: "probe_failed",
        code,
    }))
}
