//! The driver's XID line (`NVRM: Xid (PCI:…): N, pid=…, name=…, …`): the one-pass
//! reading of the usual shape, the general reading of every other, and the
//! details some codes carry (NVLink5 fields, the recovery action).

use super::text::{
    digits_u32, find_byte, find_comma_space, first_word, leading_u32, link_in, skip_ascii_ws,
    trim_end_bytes, trim_start, trim_start_bytes,
};
use gpuwatch_proto::RecoveryAction;

/// An NVRM `Xid` line: `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidMsg<'a> {
    /// PCI address as printed (`0000:3b:00`, not normalised). May be an address
    /// someone edited before pasting the log: redacted (`...`, `xxxx:xx:xx`) or with a
    /// device number above 0x1f; the line is still an XID.
    pub pci: &'a str,
    /// The XID code; 0 when the printed code does not fit (see `code_as_printed`).
    pub code: u32,
    /// The code as printed when it is not a plain number below 10⁹ (`-1`,
    /// `4294967296`, `1000000000`): such a code is unknown and is reported, not dropped.
    pub code_as_printed: Option<&'a str>,
    /// `pid=1234`; `None` for `pid='<unknown>'` or no pid.
    pub pid: Option<u32>,
    /// `name=python`; `None` for `name=<unknown>` or no name.
    pub process: Option<&'a str>,
    /// `Ch 00000010` / `Channel 0x10`: the channel id as printed.
    pub channel: Option<&'a str>,
    /// The free text after the code and the pid/name fields.
    pub detail: &'a str,
    /// `GPU-I:05` after the address (`(PCI:0000:3b:00 GPU-I:05)`): the MIG GPU
    /// instance the fault happened in, without the zero padding (`5`).
    pub gpu_instance: Option<&'a str>,
    /// `GPU-CI:01` after the address: the MIG compute instance (`1`).
    pub compute_instance: Option<&'a str>,
}

#[inline]
pub(super) fn parse_xid(s: &str) -> Option<XidMsg<'_>> {
    parse_xid_usual(s).or_else(|| parse_xid_general(s))
}

/// The XID line as the driver prints it, in one forward pass over the bytes:
/// `(PCI:dddd:bb:dd): N, pid=N, name=S, Ch HEX, detail` (each field optional, in any
/// order, ASCII blanks, a code below 10⁹). `None` for any other shape, which
/// [`parse_xid_general`] reads; where this gives `Some`, it is exactly what the
/// general reading gives (tested against it on generated lines and by the fuzzer).
#[inline]
pub(crate) fn parse_xid_usual(s: &str) -> Option<XidMsg<'_>> {
    let b = s.as_bytes();
    let (pci, code, mut i) = usual_address_and_code(b)?;
    // After a field: its commas, then blanks.
    let next = |mut i: usize, set: &[u8]| {
        while b.get(i).is_some_and(|c| set.contains(c)) {
            i += 1;
        }
        skip_ascii_ws(b, i)
    };
    let (mut pid, mut process, mut channel) = (None, None, None);
    loop {
        let rest = &b[i..];
        if rest.starts_with(b"pid=") {
            let end;
            (pid, end) = usual_pid(s, i + 4);
            i = next(end, b",")?;
        } else if rest.starts_with(b"name=") {
            let (name, end) = usual_name(s, i + 5);
            // A later `name=<unknown>` keeps a name already read.
            process = name.or(process);
            i = next(end, b",")?;
        } else if let Some(skip) = channel_prefix(rest) {
            let Some((c, end)) = usual_channel(s, i + skip) else {
                break;
            };
            channel = Some(c);
            i = next(end, b",.")?;
        } else {
            break;
        }
    }
    Some(XidMsg {
        pci: &s[pci.0..pci.1],
        code,
        code_as_printed: None,
        pid,
        process,
        channel,
        detail: &s[i..],
        gpu_instance: None,
        compute_instance: None,
    })
}

/// The usual line's address (`dddd:bb:dd` or `dddd:bb:dd.f`, closed by `):`) and
/// code (one to nine digits, then a comma, blanks or dots, or the end): the
/// address's bounds, the code, and where the fields start.
#[inline]
fn usual_address_and_code(b: &[u8]) -> Option<((usize, usize), u32, usize)> {
    // None of the address's bytes is a `)` or a blank, so the `)` after it is the
    // first one and the address the general path's first word.
    let from = if b.starts_with(b"PCI:") { 4 } else { 0 };
    let close = match b.get(from + 10) {
        Some(b')') => from + 10,
        Some(b'.') if b.get(from + 12) == Some(&b')') => from + 12,
        _ => return None,
    };
    if !crate::pci::is_usual_pci(&b[from..close]) || b.get(close + 1) != Some(&b':') {
        return None;
    }
    let mut i = skip_ascii_ws(b, close + 2)?;
    let (code, end) = digits_u32(b, i)?;
    i = end;
    match b.get(i) {
        None => {}
        Some(b',') => i = skip_ascii_ws(b, i + 1)?,
        Some(b' ' | b'.') => {
            while matches!(b.get(i), Some(b' ' | b'.')) {
                i += 1;
            }
        }
        Some(_) => return None,
    }
    Some(((from, close), code, i))
}

/// The value of `pid=` starting at `p`, and where it ends: digits up to the comma
/// (or the end) are the number; anything else is read as the general path reads
/// it.
#[inline]
fn usual_pid(s: &str, p: usize) -> (Option<u32>, usize) {
    let b = s.as_bytes();
    match digits_u32(b, p) {
        Some((n, end)) if matches!(b.get(end), None | Some(b',')) => (Some(n), end),
        _ => {
            let end = find_byte(b, p, b',').unwrap_or(b.len());
            (s[p..end].trim().parse::<u32>().ok(), end)
        }
    }
}

/// The value of `name=` starting at `p` (up to the first `, `; `None` for none or
/// `<unknown>`), and where it ends.
#[inline]
fn usual_name(s: &str, p: usize) -> (Option<&str>, usize) {
    let b = s.as_bytes();
    let mut end = p;
    let end = loop {
        match find_byte(b, end, b',') {
            Some(c) if b.get(c + 1) == Some(&b' ') => break c,
            Some(c) => end = c + 1,
            None => break b.len(),
        }
    };
    let name = trim_end_bytes(&s[p..end], b",");
    // `str::trim` only where a blank (or a non-ASCII character) ends the name.
    let plain = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_graphic());
    let nb = name.as_bytes();
    let name = if plain(nb.first()) && plain(nb.last()) {
        name
    } else {
        name.trim()
    };
    let known = !name.is_empty() && name != "<unknown>";
    (known.then_some(name), end)
}

/// The channel id starting at `p` (hex digits and `x`) and where it ends; `None`
/// when there is none.
#[inline]
fn usual_channel(s: &str, p: usize) -> Option<(&str, usize)> {
    let b = s.as_bytes();
    let mut end = p;
    while b
        .get(end)
        .is_some_and(|&c| crate::pci::HEX_VALUE[usize::from(c)] < 16 || c == b'x')
    {
        end += 1;
    }
    (end > p).then(|| (&s[p..end], end))
}

/// Length of the channel field's name at the start of `rest` (`Ch `, `Channel ID `,
/// `Channel `, or R570+'s `channel `).
#[inline]
fn channel_prefix(rest: &[u8]) -> Option<usize> {
    match rest {
        [b'C', b'h', b' ', ..] => Some(3),
        [b'C', b'h', b'a', b'n', b'n', b'e', b'l', b' ', tail @ ..] => {
            Some(if tail.starts_with(b"ID ") { 11 } else { 8 })
        }
        [b'c', b'h', b'a', b'n', b'n', b'e', b'l', b' ', ..] => Some(8),
        _ => None,
    }
}

/// The XID line in any shape the parser accepts: blanks of any kind, a first word
/// before other text in the parentheses, edited addresses, out-of-range codes.
pub(crate) fn parse_xid_general(s: &str) -> Option<XidMsg<'_>> {
    // Short slices: a byte loop costs less than memchr's call and set-up.
    let close = s.as_bytes()[..s.len().min(64)]
        .iter()
        .position(|&b| b == b')')?;
    let pci_tok = first_word(&s[..close]).unwrap_or("");
    let (gpu_instance, compute_instance) = mig_instances(&s[..close]);
    let pci_tok = pci_tok.strip_prefix("PCI:").unwrap_or(pci_tok);
    if !(crate::pci::is_pci(pci_tok) || crate::pci::is_edited_pci(pci_tok)) {
        return None;
    }
    let rest = trim_start(s[close + 1..].strip_prefix(':')?);
    let (code, code_as_printed, mut rest) = match leading_u32(rest) {
        Some((code, rest)) => (code, None, rest),
        None => {
            // A negative code or one of ten or more digits: an unknown code, kept as printed.
            let digits_from = usize::from(rest.starts_with('-'));
            let end = rest[digits_from..]
                .bytes()
                .position(|b| !b.is_ascii_digit())
                .map_or(rest.len(), |e| e + digits_from);
            if end == digits_from || end > 40 {
                return None;
            }
            let printed = &rest[..end];
            let code = printed.parse::<u32>().unwrap_or(0);
            (code, Some(printed), &rest[end..])
        }
    };
    match rest.as_bytes().first() {
        None => {}
        Some(b',') => rest = trim_start(&rest[1..]),
        Some(b' ' | b'.') => rest = trim_start_bytes(rest, b". "),
        Some(_) => return None,
    }
    let mut pid = None;
    let mut process = None;
    let mut channel = None;
    loop {
        if let Some(p) = rest.strip_prefix("pid=") {
            let end = p.bytes().position(|b| b == b',').unwrap_or(p.len());
            pid = match leading_u32(&p[..end]) {
                Some((n, "")) => Some(n),
                _ => p[..end].trim().parse::<u32>().ok(),
            };
            rest = trim_start(trim_start_bytes(&p[end..], b","));
        } else if let Some(p) = rest.strip_prefix("name=") {
            let end = find_comma_space(p).unwrap_or(p.len());
            let name = trim_end_bytes(&p[..end], b",").trim();
            if !name.is_empty() && name != "<unknown>" {
                process = Some(name);
            }
            rest = trim_start(trim_start_bytes(&p[end..], b","));
        } else if let Some(p) = rest
            .strip_prefix("Ch ")
            .or_else(|| rest.strip_prefix("Channel ID "))
            .or_else(|| rest.strip_prefix("Channel "))
            // R570+ prints `channel 0x0b00000a`.
            .or_else(|| rest.strip_prefix("channel "))
        {
            let end = p
                .bytes()
                .position(|c| !(c.is_ascii_hexdigit() || c == b'x'))
                .unwrap_or(p.len());
            if end == 0 {
                break;
            }
            channel = Some(&p[..end]);
            rest = trim_start(trim_start_bytes(&p[end..], b",."));
        } else {
            break;
        }
    }
    Some(XidMsg {
        pci: pci_tok,
        code,
        code_as_printed,
        pid,
        process,
        channel,
        detail: rest,
        gpu_instance,
        compute_instance,
    })
}

/// The MIG instances a MIG-mode XID names after its address, inside the
/// parentheses (`PCI:0000:3b:00 GPU-I:05 GPU-CI:01`): the numbers of
/// `GPU-I:` and `GPU-CI:` without the driver's zero padding (`5`, `1`), the
/// form `nvidia-smi` and NVML's instance ids use, so that they join.
fn mig_instances(paren: &str) -> (Option<&str>, Option<&str>) {
    fn digits<'a>(w: &'a str, prefix: &str) -> Option<&'a str> {
        let d = w
            .strip_prefix(prefix)
            .filter(|d| !d.is_empty() && d.len() <= 4 && d.bytes().all(|b| b.is_ascii_digit()))?;
        let unpadded = d.trim_start_matches('0');
        Some(if unpadded.is_empty() { "0" } else { unpadded })
    }
    let (mut gi, mut ci) = (None, None);
    for w in paren.split_ascii_whitespace().skip(1) {
        let w = w.trim_end_matches(',');
        gi = gi.or_else(|| digits(w, "GPU-I:"));
        ci = ci.or_else(|| digits(w, "GPU-CI:"));
    }
    (gi, ci)
}

/// Recovery action named by XID 154 text (`... to 0x2 (Node Reboot Required)`); the
/// text in parentheses wins, the hex value (NVML numbering) is the fallback.
///
/// ```
/// use gpuwatch_proto::RecoveryAction;
/// use xid_parser::recovery_action_from_text;
/// assert_eq!(
///     recovery_action_from_text("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
///     Some(RecoveryAction::NodeReboot)
/// );
/// ```
pub fn recovery_action_from_text(detail: &str) -> Option<RecoveryAction> {
    let i = find!(detail, " to ")?;
    let target = detail[i + 4..].trim();
    if let Some(open) = target.find('(') {
        let inner = &target[open + 1..];
        let name = &inner[..inner.find(')').unwrap_or(inner.len())];
        let n = name.to_ascii_lowercase();
        let by_name = if n == "none" {
            Some(RecoveryAction::None)
        } else if n.contains("drain and reset") || n.contains("drain & reset") {
            Some(RecoveryAction::DrainAndReset)
        } else if n.contains("drain p2p") {
            Some(RecoveryAction::DrainP2p)
        } else if n.contains("gpu reset") {
            Some(RecoveryAction::GpuReset)
        } else if n.contains("node reboot") {
            Some(RecoveryAction::NodeReboot)
        } else if n.contains("os reboot") || n.contains("system reboot") {
            Some(RecoveryAction::SystemReboot)
        } else if n.contains("pf flr") || n.contains("flr") {
            Some(RecoveryAction::PfFlr)
        } else if n.contains("imex") {
            Some(RecoveryAction::RecoverImexDomain)
        } else if n.contains("bus reset") {
            Some(RecoveryAction::BusReset)
        } else {
            None
        };
        if by_name.is_some() {
            return by_name;
        }
    }
    let hex = target.split_whitespace().next()?;
    let v = u64::from_str_radix(hex.strip_prefix("0x")?, 16).ok()?;
    RecoveryAction::from_nvml(v)
}

/// NVLink5 XID (144–150) detail: `<sub-component> <Fatal|Nonfatal> <XC..> <i0|i1> Link <n> (<intrInfo> <errorStatus> ...)`.
pub(crate) struct Nvlink5<'a> {
    pub sub_component: &'a str,
    pub fatal: Option<bool>,
    pub link: Option<u32>,
    pub intr_info: Option<&'a str>,
    pub error_status: Option<&'a str>,
}

pub(crate) fn parse_nvlink5(detail: &str) -> Option<Nvlink5<'_>> {
    let mut words = detail.split_whitespace();
    let sub_component = words.next()?;
    let sev = words.next()?;
    let fatal = if sev.eq_ignore_ascii_case("fatal") {
        Some(true)
    } else if sev.eq_ignore_ascii_case("nonfatal") || sev.eq_ignore_ascii_case("non-fatal") {
        Some(false)
    } else {
        None
    };
    let (intr_info, error_status) = match detail.find('(') {
        Some(o) => {
            let inner = &detail[o + 1..];
            let inner = &inner[..inner.find(')').unwrap_or(inner.len())];
            let mut hex = inner.split([' ', ',']).filter(|w| w.starts_with("0x"));
            (hex.next(), hex.next())
        }
        None => (None, None),
    };
    Some(Nvlink5 {
        sub_component,
        fatal,
        link: link_in(detail),
        intr_info,
        error_status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, interesting, parse_message};

    #[test]
    fn a_line_starting_as_the_driver_prints_an_xid_is_an_xid() {
        let Some(Message::Xid(x)) = parse_message(
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=12, name=python, text quoting SXid (PCI:0000:05:00.0): 1",
        ) else {
            panic!("not an XID");
        };
        assert_eq!((x.code, x.pid, x.process), (13, Some(12), Some("python")));
        // Not as printed (a prefix, extra blanks): the general path, same result.
        for m in [
            "kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=12, name=python, Graphics",
            "NVRM:  Xid (PCI:0000:3b:00): 13, pid=12, name=python, Graphics",
        ] {
            assert!(
                matches!(
                    parse_message(m),
                    Some(Message::Xid(XidMsg {
                        code: 13,
                        pid: Some(12),
                        ..
                    }))
                ),
                "{m}"
            );
        }
        assert!(interesting(b"NVRM: Xid ("));
    }

    #[test]
    fn a_mig_xid_keeps_its_instances() {
        let Some(Message::Xid(x)) = parse_message(
            "NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=7101, name=python, Ch 00000008, Contained ECC error",
        ) else {
            panic!("not an XID");
        };
        assert_eq!((x.pci, x.code, x.pid), ("0000:3b:00", 94, Some(7101)));
        assert_eq!((x.gpu_instance, x.compute_instance), (Some("5"), None));
        let Some(Message::Xid(x)) =
            parse_message("NVRM: Xid (PCI:0000:3b:00 GPU-I:07 GPU-CI:01): 43, pid=9, name=a.out")
        else {
            panic!("not an XID");
        };
        assert_eq!((x.gpu_instance, x.compute_instance), (Some("7"), Some("1")));
        let Some(Message::Xid(x)) = parse_message("NVRM: Xid (PCI:0000:3b:00): 13, pid=1") else {
            panic!("not an XID");
        };
        assert_eq!((x.gpu_instance, x.compute_instance), (None, None));
    }

    #[test]
    fn xid_field_forms() {
        let Some(Message::Xid(x)) = parse_message(
            "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python3, Ch 00000010, intr 10000000. MMU Fault",
        ) else {
            panic!("not an xid")
        };
        assert_eq!(x.code, 31);
        assert_eq!(x.pid, Some(1234));
        assert_eq!(x.process, Some("python3"));
        assert_eq!(x.channel, Some("00000010"));
        assert!(x.detail.starts_with("intr 10000000"));
        let Some(Message::Xid(x)) = parse_message("NVRM: Xid (0000:01:00): 13, 0003 00000000")
        else {
            panic!()
        };
        assert_eq!((x.pci, x.code, x.pid), ("0000:01:00", 13, None));
        assert!(parse_message("NVRM: Xid (PCI:0000:3b:00): ").is_none());
        assert!(parse_message("NVRM: Xid (PCI:zz): 79, x").is_none());
        assert!(parse_message("NVRM: Xid (PCI:0000:3b:00): -x").is_none());
        // Edited addresses and out-of-range codes are still XIDs.
        for (line, pci, code, printed) in [
            (
                "NVRM: Xid (PCI:...): 79, GPU has fallen off the bus.",
                "...",
                79,
                None,
            ),
            ("NVRM: Xid (PCI:0000:xx:00): 13, x", "0000:xx:00", 13, None),
            ("NVRM: Xid (PCI:0000:3b:2a): 13, x", "0000:3b:2a", 13, None),
            (
                "NVRM: Xid (PCI:0000:3b:00): -5, x",
                "0000:3b:00",
                0,
                Some("-5"),
            ),
            (
                "NVRM: Xid (PCI:0000:3b:00): 1000000000, x",
                "0000:3b:00",
                1_000_000_000,
                Some("1000000000"),
            ),
            (
                "NVRM: Xid (PCI:0000:3b:00): 99999999999",
                "0000:3b:00",
                0,
                Some("99999999999"),
            ),
        ] {
            let Some(Message::Xid(x)) = parse_message(line) else {
                panic!("not an xid: {line}")
            };
            assert_eq!(
                (x.pci, x.code, x.code_as_printed),
                (pci, code, printed),
                "{line}"
            );
        }
        assert!(parse_message("NVRM: Xid (PCI:0000:3b:00): 79x").is_none());
    }

    #[test]
    fn recovery_actions() {
        for (t, want) in [
            (
                "from 0x0 (None) to 0x1 (GPU Reset Required)",
                RecoveryAction::GpuReset,
            ),
            (
                "from 0x0 (None) to 0x3 (Drain P2P)",
                RecoveryAction::DrainP2p,
            ),
            (
                "from 0x0 (None) to 0x4 (Drain and Reset)",
                RecoveryAction::DrainAndReset,
            ),
            (
                "from 0x2 (Node Reboot Required) to 0x0 (None)",
                RecoveryAction::None,
            ),
            (
                "from 0x0 (None) to 0x7 (OS Reboot)",
                RecoveryAction::SystemReboot,
            ),
            ("from 0x0 (None) to 0x9 (PF FLR)", RecoveryAction::PfFlr),
            ("from 0x0 to 0x2", RecoveryAction::NodeReboot),
        ] {
            assert_eq!(recovery_action_from_text(t), Some(want), "{t}");
        }
        assert_eq!(recovery_action_from_text("to 0x55 (Weird)"), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// The one-pass reading of the usual XID line gives what the general one
        /// gives wherever it gives anything, on lines made of the fields' forms and
        /// near misses of each (blanks of other kinds, edited addresses, long codes,
        /// fields without values, commas without blanks).
        #[test]
        fn usual_xid_reading_is_the_general_one(parts in proptest::collection::vec(
            proptest::sample::select(&[
                "PCI:", "0000:3b:00", "0000:3B:00.1", "0000:3b:2a", "3b:00", "...", "zz",
                ")", ":", ": ", " ", "  ", "\t", "\u{a0}", "\u{2003}", ",", ", ", ".", ". ",
                "13", "79", "-5", "123456789", "1234567890", "0",
                "pid=", "1234", "'<unknown>'", " 12 ", "+7", "99999999999",
                "name=", "python", "<unknown>", "pt_main_thread", "é", "a b",
                "Ch ", "Channel ", "Channel ID ", "channel ", "00000008", "0x0b00000a", "x",
                "intr 00000000", "Graphics SM Warp Exception", "(GPC 7, TPC 7)",
            ][..]),
            0..16,
        )) {
            let body = parts.concat();
            if let Some(usual) = parse_xid_usual(&body) {
                proptest::prop_assert_eq!(Some(usual), parse_xid_general(&body), "{:?}", body);
            }
        }

        /// The same on the driver's own shape with one field of it replaced.
        #[test]
        fn usual_xid_reading_on_driver_shapes(
            pci in proptest::sample::select(&["PCI:0000:3b:00", "0000:86:00", "PCI:0000:07:00.0", "PCI:0000:3b:20", "PCI:..."][..]),
            after_close in proptest::sample::select(&[": ", ":", ":  ", ": \t", " : ", ":\u{a0}"][..]),
            code in proptest::sample::select(&["13", "79", "154", "999999999", "1000000000", "-1", "", "7x"][..]),
            sep in proptest::sample::select(&[", ", ",", " ", ". ", "", ",\u{a0}", ":"][..]),
            fields in proptest::collection::vec(proptest::sample::select(&[
                "pid=1234, ", "pid='<unknown>', ", "pid=, ", "pid=12345678901, ", "pid= 7 , ",
                "name=python, ", "name=<unknown>, ", "name=, ", "name=a,b, ", "name=pt main, ",
                "name=é, ", "Ch 00000008, ", "Channel ID 0x10. ", "channel 0x0b00000a, ",
                "Ch , ", "Ch 00000008,, ", "pid=1,,  ",
            ][..]), 0..4),
            detail in proptest::sample::select(&["", "Graphics Exception", "GPU has fallen off the bus.", "MMU Fault: ENGINE GRAPHICS", "\u{a0}x"][..]),
        ) {
            let body = format!("{pci}){after_close}{code}{sep}{}{detail}", fields.concat());
            if let Some(usual) = parse_xid_usual(&body) {
                proptest::prop_assert_eq!(Some(usual), parse_xid_general(&body), "{:?}", body);
            }
        }
    }

    #[test]
    fn the_usual_xid_reading_covers_the_driver_lines() {
        for body in [
            "PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
            "PCI:0000:86:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault",
            "PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "PCI:0000:cb:00): 43, pid=29012, name=python3, Ch 00000008",
            "PCI:0000:07:00): 94, pid=4142, name=python, Contained: SM (0x1). RST: No, D-RST: No",
            "PCI:0000:3b:00): 119, Timeout after 6s of waiting for RPC response from GPU0 GSP!",
            "0000:01:00): 13, 0003 00000000",
        ] {
            let usual = parse_xid_usual(body);
            assert!(usual.is_some(), "{body}");
            assert_eq!(usual, parse_xid_general(body), "{body}");
        }
    }
}
