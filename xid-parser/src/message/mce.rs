//! Machine checks: the x86 MCE core, AMD's MCA decoder, EDAC and CPER/APEI lines.

use super::Message;
use super::text::leading_u32;

/// The part of a machine-check report a line is. A report (one event) holds each
/// part at most once, so a second line of the same part starts the next report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McePart {
    /// Opening line: `Machine check events logged`, AMD's `Corrected error, no action
    /// required.` / `Error Status: …`, CPER's `Hardware error from APEI …`, EDAC's
    /// `HANDLING MCE MEMORY ERROR`.
    Summary,
    /// The bank's status register: `CPU 0: Machine Check: 0 Bank 4: a600…`,
    /// `CPU:2 (15:2:0) MC2_STATUS[-|CE|…]: 0x98…`, EDAC's `Machine Check Event: …`.
    Status,
    /// AMD's per-bank decoding: `MC2 Error: VB Data ECC or parity error.`
    BankDecode,
    /// CPER's `event severity: fatal`.
    Severity,
    /// EDAC's `HANDLING MCE MEMORY ERROR` (follows the MCE core's summary).
    Heading,
    /// An EDAC memory-controller result: `EDAC MC1: 1 CE memory read error on …`.
    MemoryError,
    /// `Kernel panic - not syncing: Fatal machine check`.
    Panic,
}

/// A machine-check line (x86 MCE core, AMD MCA decoder, EDAC, CPER/APEI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MceMsg {
    /// `Bank 5`, `MC2_STATUS`, `MC2 Error`.
    pub bank: Option<u32>,
    /// The report part this line is; `None` for detail lines (`TSC`, `ADDR`,
    /// `PROCESSOR`, `cache level`, CPER section fields), which only belong to a
    /// report already started.
    pub part: Option<McePart>,
    /// `corrected`, `recoverable`, `uncorrected` or `fatal` when the line says (status
    /// register bits UC/PCC, `CE`/`UE`, the words printed).
    pub severity: Option<&'static str>,
}

/// Severity of an x86 MCi_STATUS value (hex, with or without `0x`): UC (bit 61)
/// uncorrected, PCC (bit 57) fatal, VAL (bit 63) without UC corrected (Intel SDM
/// vol. 3B 16.3.2.2, AMD APM vol. 2 9.3.2.4: the bit positions are shared).
fn status_severity(hex: &str) -> Option<&'static str> {
    let hex = hex.trim().trim_start_matches("0x");
    let end = hex
        .bytes()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(hex.len());
    let v = u64::from_str_radix(hex.get(..end.min(16))?, 16).ok()?;
    if v >> 63 == 0 {
        None
    } else if v >> 57 & 1 == 1 {
        Some("fatal")
    } else if v >> 61 & 1 == 1 {
        Some("uncorrected")
    } else {
        Some("corrected")
    }
}

/// `MC<n>` at the start of `s` → n.
fn mc_bank(s: &str) -> Option<u32> {
    leading_u32(s.strip_prefix("MC")?).map(|(n, _)| n)
}

/// A machine-check line: `Some(Message::Mce)` for every line of a report (the
/// parts that open one, and detail lines with no part), `None` for other lines.
pub(super) fn parse_mce(msg: &str) -> Option<Message<'_>> {
    if let Some(i) = find!(msg, "Kernel panic - not syncing")
        && (contains!(&msg[i..], "achine check") || contains!(&msg[i..], "achine Check"))
    {
        return Some(mce(None, Some(McePart::Panic), Some("fatal")));
    }
    // `EDAC <driver> MC<n>: …` at the start of the message or after a blank
    // (a saved line may keep a `kernel:` tag before it).
    let edac = find!(msg, "EDAC ")
        .filter(|&i| i == 0 || msg.as_bytes()[i - 1].is_ascii_whitespace())
        .map(|i| &msg[i + 5..]);
    if let Some(rest) = edac {
        return Some(parse_edac(rest));
    }
    let hw =
        find!(msg, "[Hardware Error]").map(|i| msg[i + 16..].trim_start_matches(':').trim_start());
    if let Some(m) = hw.and_then(parse_hardware_error) {
        return Some(m);
    }
    if contains!(msg, "Machine check events logged") {
        return Some(mce(None, Some(McePart::Summary), None));
    }
    if let Some(i) = find!(msg, "Machine Check") {
        let bank = find!(&msg[i..], "Bank ").and_then(|b| leading_u32(&msg[i + b + 5..]));
        let severity = bank.and_then(|(_, r)| status_severity(r.trim_start_matches(':')));
        return Some(mce(bank.map(|b| b.0), Some(McePart::Status), severity));
    }
    if hw.is_some() || contains!(msg, "mce:") {
        return Some(mce(None, None, None));
    }
    None
}

fn mce(
    bank: Option<u32>,
    part: Option<McePart>,
    severity: Option<&'static str>,
) -> Message<'static> {
    Message::Mce(MceMsg {
        bank,
        part,
        severity,
    })
}

/// The text after `EDAC `: the MCE heading, a bank's status, a memory
/// controller's result, or a detail line.
fn parse_edac(rest: &str) -> Message<'static> {
    if contains!(rest, "HANDLING MCE MEMORY ERROR") {
        return mce(None, Some(McePart::Heading), None);
    }
    if contains!(rest, "Machine Check Event") {
        let bank = find!(rest, "Bank ").and_then(|b| leading_u32(&rest[b + 5..]));
        let severity = bank.and_then(|(_, r)| status_severity(r.trim_start_matches(':')));
        return mce(bank.map(|b| b.0), Some(McePart::Status), severity);
    }
    // `EDAC MC1: 262 CE memory read error on …`, `EDAC MC0: 1 UE …`.
    if let Some(colon) = rest.find(": ")
        && mc_bank(&rest[..colon]).is_some()
        && let Some((_, after)) = leading_u32(&rest[colon + 2..])
    {
        let severity = if after.starts_with(" CE ") {
            Some("corrected")
        } else if after.starts_with(" UE ") {
            Some("uncorrected")
        } else {
            None
        };
        if severity.is_some() {
            return mce(None, Some(McePart::MemoryError), severity);
        }
    }
    mce(None, None, None)
}

/// The text after `[Hardware Error]:` when it opens a report part: CPER's summary
/// and severity, AMD's decoder summary, a bank's status register or its decoding.
/// `None` for a detail line.
fn parse_hardware_error(body: &str) -> Option<Message<'static>> {
    if body.starts_with("Hardware error from APEI") {
        return Some(mce(None, Some(McePart::Summary), None));
    }
    if let Some(sev) = body.strip_prefix("event severity:") {
        let severity = match sev.trim() {
            "corrected" | "info" => Some("corrected"),
            "recoverable" => Some("recoverable"),
            "fatal" => Some("fatal"),
            _ => None,
        };
        return Some(mce(None, Some(McePart::Severity), severity));
    }
    // AMD decoder: `Corrected error, no action required.`, `Uncorrected, software
    // containable error.`, `System Fatal error.`, older `Error Status: …`.
    let status_text = body.strip_prefix("Error Status:").map(str::trim_start);
    let summary = status_text.unwrap_or(body);
    if summary.starts_with("Corrected error") {
        return Some(mce(None, Some(McePart::Summary), Some("corrected")));
    }
    if summary.starts_with("Uncorrected") {
        return Some(mce(None, Some(McePart::Summary), Some("uncorrected")));
    }
    if summary.starts_with("System Fatal error") {
        return Some(mce(None, Some(McePart::Summary), Some("fatal")));
    }
    if status_text.is_some() {
        return Some(mce(None, Some(McePart::Summary), None));
    }
    // `CPU:2 (15:2:0) MC2_STATUS[-|CE|MiscV|-|-|-|-|CECC]: 0x98444000010c0176`.
    if let Some(i) = find!(body, "_STATUS[") {
        let head = &body[..i];
        let bank = head.rfind("MC").and_then(|m| mc_bank(&head[m..]));
        let severity = body[i..]
            .find("]: ")
            .and_then(|c| status_severity(&body[i + c + 3..]));
        return Some(mce(bank, Some(McePart::Status), severity));
    }
    // `MC2 Error: VB Data ECC or parity error.`, `MC4 Error (node 2): …`.
    if let Some(bank) = mc_bank(body)
        && let Some(sp) = body.find(' ')
        && body[sp + 1..].starts_with("Error")
    {
        return Some(mce(Some(bank), Some(McePart::BankDecode), None));
    }
    None
}
