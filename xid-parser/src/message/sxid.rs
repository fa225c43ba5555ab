//! NVSwitch SXid lines (`nvidia-nvswitchN: SXid (PCI:…): N, …`) and their
//! follow-ups.

use super::text::{leading_u32, link_in};

/// An NVSwitch `SXid` line: `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SxidMsg<'a> {
    /// NVSwitch PCI address as printed.
    pub pci: &'a str,
    /// The SXid code.
    pub code: u32,
    /// `Fatal` → true, `Non-fatal` → false; `None` when not printed.
    pub fatal: Option<bool>,
    /// `Link 32`.
    pub link: Option<u32>,
    /// True for the follow-up records (`Severity 1 Engine instance ...`, `Data {...}`)
    /// that only mean something after the first SXid line.
    pub followup: bool,
    /// The text after the code.
    pub detail: &'a str,
}

pub(super) fn parse_sxid(s: &str) -> Option<SxidMsg<'_>> {
    // Short slices: a byte loop costs less than memchr's call and set-up.
    let close = s.as_bytes()[..s.len().min(64)]
        .iter()
        .position(|&b| b == b')')?;
    let pci_tok = s[..close].split_whitespace().next()?;
    let pci_tok = pci_tok.strip_prefix("PCI:").unwrap_or(pci_tok);
    if !crate::pci::is_pci(pci_tok) {
        return None;
    }
    let rest = s[close + 1..].strip_prefix(':')?.trim_start();
    let (code, rest) = leading_u32(rest)?;
    let detail = rest.trim_start_matches(',').trim_start();
    // `SOE HALT data[0] = 0x...` lines follow `SOE HALTED` of the same SXid.
    // Padding varies (`Data     {0x    0037, ...}`): the word and the brace decide.
    let followup = detail
        .strip_prefix("Severity")
        .is_some_and(|r| r.starts_with(char::is_whitespace))
        || detail
            .strip_prefix("Data")
            .is_some_and(|r| r.trim_start().starts_with('{'))
        || detail.starts_with("SOE HALT data[");
    let first = detail.split(',').next().unwrap_or("").trim();
    let fatal = match first {
        f if f.eq_ignore_ascii_case("fatal") => Some(true),
        f if f.eq_ignore_ascii_case("non-fatal") || f.eq_ignore_ascii_case("nonfatal") => {
            Some(false)
        }
        _ => None,
    };
    Some(SxidMsg {
        pci: pci_tok,
        code,
        fatal,
        link: if followup { None } else { link_in(detail) },
        followup,
        detail,
    })
}
