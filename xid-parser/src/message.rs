//! Kernel messages → typed GPU/PCIe/host fault messages.
//!
//! [`parse_message`] borrows from the message and allocates nothing; the vast
//! majority of kernel lines are rejected by a memchr prefilter
//! ([`interesting`]) before any parsing.

use gpuwatch_proto::RecoveryAction;

/// Position of the literal `$needle` in the `&str` `$haystack`.
///
/// Each call site owns a `memmem::Finder` built on first use (a `static`), so a
/// search costs only the search: building a searcher (pair selection, SIMD set-up)
/// per call used to be most of the parser's time on fault lines.
macro_rules! find {
    ($haystack:expr, $needle:literal) => {{
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new($needle));
        FINDER.find(str::as_bytes($haystack))
    }};
}

/// True when the `&str` `$haystack` contains the literal `$needle` (see [`find!`]).
macro_rules! contains {
    ($haystack:expr, $needle:literal) => {
        find!($haystack, $needle).is_some()
    };
}

pub(crate) use {contains, find};

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
}

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

/// `NVRM: GPU at PCI:0000:3b:00: GPU-6b1a...` (printed before a GPU's first XID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuIdentity<'a> {
    /// PCI address as printed.
    pub pci: &'a str,
    /// `GPU-...` UUID.
    pub uuid: &'a str,
}

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

/// An NVLink error outside the XID path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlinkMsg<'a> {
    /// A PCI address named in the line.
    pub pci: Option<&'a str>,
    /// `link 3`.
    pub link: Option<u32>,
    /// Fatal / non-fatal when stated.
    pub fatal: Option<bool>,
}

/// ECC, page retirement or row remapping message outside the XID path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EccMsg<'a> {
    /// A PCI address named in the line.
    pub pci: Option<&'a str>,
    /// `sbe`, `dbe`, `corrected`, `uncorrected`, when stated.
    pub ecc_type: Option<&'static str>,
}

/// Thermal message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThermalMsg<'a> {
    /// A PCI address named in the line (GPU thermal), `None` for CPU thermal.
    pub pci: Option<&'a str>,
    /// Temperature in °C when printed.
    pub temperature_c: Option<u32>,
}

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

/// A kernel message that matters to gpuwatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// NVRM XID line.
    Xid(XidMsg<'a>),
    /// NVSwitch SXid line (first line or follow-up).
    Sxid(SxidMsg<'a>),
    /// GPU identity (context only).
    GpuIdentity(GpuIdentity<'a>),
    /// `NVRM: GPU Board Serial Number: ...` (context only).
    GpuSerial(&'a str),
    /// `GPU has fallen off the bus` without an XID.
    FallenOffBus {
        /// PCI address named in the line.
        pci: Option<&'a str>,
    },
    /// AER summary from the reporting port.
    AerSummary(AerSummary<'a>),
    /// AER detail line of a device.
    AerDetail(AerDetail<'a>),
    /// NVLink error.
    Nvlink(NvlinkMsg<'a>),
    /// ECC error message.
    Ecc(EccMsg<'a>),
    /// Dynamic page retirement message.
    PageRetirement(EccMsg<'a>),
    /// Row remapper message; `failure` for failed remaps.
    RowRemap {
        /// ECC details.
        ecc: EccMsg<'a>,
        /// The remap failed.
        failure: bool,
    },
    /// Thermal slowdown / threshold message.
    Thermal(ThermalMsg<'a>),
    /// Machine check.
    Mce(MceMsg),
    /// An `nvidia-peermem` (GPUDirect RDMA peer memory) module error.
    Peermem {
        /// The function named by the line (`nv_get_p2p_free_callback`), when printed.
        function: Option<&'a str>,
    },
    /// NVRM driver error.
    DriverError(DriverErrorMsg<'a>),
    /// Any other NVRM line (context only: GSP RPC dumps, crash dump notes).
    NvrmOther {
        /// GPU named as `GPUn` (`NVRM: GPU0 RPC history`), when any.
        gpu_ordinal: Option<u32>,
    },
}

/// Prefilter: false ⇒ [`parse_message`] returns `None`. True when the message has one
/// of the markers of a message kind: `NVRM`/`NVLink`/`NVLINK` (also `nV…`), `Xid`/`SXid`,
/// `AER`, `nvidia-`/`nvidia:`/`nvidia ` (a driver's prefix: not `nvidia_modprobe` in
/// every AppArmor profile-load line), `nvlink`/`nvswitch`, `[Hardware Error]`, an AER detail `[` (after
/// four spaces or `device `), `PCIe Bus Error`, `Machine Check`/`Machine check`/
/// `machine check`, `temperature`, `mce:`, `EDAC `.
///
/// One pass, no allocation: every marker contains one of a few byte pairs (`NV`, `nV`,
/// `nv`, `Xi`, `AE`, `[H`, ` [`, `PC`, `Ma`, `mp`, `mc`, `ma`, `ED`). Pairs are tested 16
/// positions at a time with plain comparisons (which the compiler vectorises) into a
/// bit mask; only the positions set in it are checked for the full marker.
pub fn interesting(msg: &[u8]) -> bool {
    if msg.len() < 2 {
        return false;
    }
    let Some(last) = msg.len().checked_sub(W + 1) else {
        // Shorter than one chunk: zero-padded (no marker pair contains a NUL byte).
        let mut pad = [0u8; W + 1];
        pad[..msg.len()].copy_from_slice(msg);
        return chunk_has_marker(msg, 0, &pad, 0);
    };
    let mut i = 0;
    loop {
        // The last chunk overlaps the one before; `skip` masks the positions done.
        let (start, skip) = if i <= last { (i, 0) } else { (last, i - last) };
        let Some(c) = msg[start..].first_chunk::<{ W + 1 }>() else {
            return false;
        };
        if chunk_has_marker(msg, start, c, skip) {
            return true;
        }
        i += W;
        if start == last || i + 1 >= msg.len() {
            return false;
        }
    }
}

/// Positions tested per chunk by [`interesting`].
const W: usize = 16;

/// True when one of the pair positions `start + skip .. start + W` of `msg` (whose
/// bytes `c` holds, plus one) starts a marker.
#[inline(always)]
fn chunk_has_marker(msg: &[u8], start: usize, c: &[u8; W + 1], skip: usize) -> bool {
    // One byte per position, 1 where a pair starts: plain byte compares over
    // fixed-size arrays, which the compiler turns into 16-lane vector compares.
    let mut m = [0u8; W];
    for k in 0..W {
        m[k] = u8::from(marker_pair(c[k], c[k + 1]));
    }
    let mut hits = u128::from_le_bytes(m) >> (8 * skip);
    while hits != 0 {
        let k = skip + hits.trailing_zeros() as usize / 8;
        if marker_at(msg, start + k) {
            return true;
        }
        hits &= hits - 1;
    }
    false
}

/// True when `a b` is a byte pair that every occurrence of some marker contains
/// (a superset: `Nv` passes too; [`marker_at`] decides).
#[inline(always)]
fn marker_pair(a: u8, b: u8) -> bool {
    ((a | 0x20 == b'n') & (b | 0x20 == b'v'))
        | ((a == b'X') & (b == b'i'))
        | ((a == b'A') & (b == b'E'))
        | ((a == b'[') & (b == b'H'))
        | ((a == b' ') & (b == b'['))
        | ((a == b'P') & (b == b'C'))
        | ((a == b'M') & (b == b'a'))
        | ((a == b'm') & ((b == b'p') | (b == b'c') | (b == b'a')))
        | ((a == b'E') & (b == b'D'))
}

/// Full marker check for the pair starting at `i` (see [`marker_pair`]).
#[inline(always)]
fn marker_at(msg: &[u8], i: usize) -> bool {
    let at = |i: usize, pat: &[u8]| msg.get(i..i + pat.len()) == Some(pat);
    // The pair's second byte anchors the markers whose pair starts one byte early.
    let j = if matches!(msg[i], b'N' | b'n' | b' ') {
        i + 1
    } else {
        i
    };
    match msg[j] {
        b'V' => {
            j > 0
                && matches!(msg[j - 1], b'N' | b'n')
                && (at(j + 1, b"RM") || at(j + 1, b"Link") || at(j + 1, b"LINK"))
        }
        b'X' => at(j + 1, b"id"),
        b'A' => at(j + 1, b"ER"),
        b'[' => {
            at(j, b"[Hardware Error]")
                || (j >= 4 && &msg[j - 4..j] == b"    ")
                || (j >= 7 && &msg[j - 7..j] == b"device ")
        }
        b'P' => at(j, b"PCIe Bus Error"),
        b'M' => at(j, b"Machine Check") || at(j, b"Machine check"),
        b'v' => {
            j > 0
                && msg[j - 1] == b'n'
                && ((at(j + 1, b"idia") && matches!(msg.get(j + 5), Some(b'-' | b':' | b' ')))
                    || at(j + 1, b"link")
                    || at(j + 1, b"switch"))
        }
        b'm' => at(j, b"mce:") || at(j, b"machine check") || (j >= 2 && at(j - 2, b"temperature")),
        b'E' => at(j, b"EDAC "),
        _ => false,
    }
}

fn leading_u32(s: &str) -> Option<(u32, &str)> {
    digits_u32(s.as_bytes(), 0).map(|(n, end)| (n, &s[end..]))
}

/// `Link 32`, `link 3`, `Link 00` → number.
pub(crate) fn link_in(s: &str) -> Option<u32> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(off) = memchr::memchr2(b'L', b'l', &b[from..]) {
        let i = from + off;
        from = i + 1;
        if b.get(i + 1..i + 4) == Some(b"ink") && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            let rest = s[i + 4..].trim_start_matches([' ', '#']);
            if let Some((n, _)) = leading_u32(rest) {
                return Some(n);
            }
        }
    }
    None
}

/// Parses one (unescaped) kernel message. Returns `None` for messages that are not
/// GPU / PCIe / host-hardware faults or their context.
///
/// ```
/// use xid_parser::{parse_message, Message};
/// let Some(Message::Xid(x)) = parse_message("NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception") else { panic!() };
/// assert_eq!((x.pci, x.code, x.pid, x.process), ("0000:3b:00", 13, None, None));
/// assert_eq!(parse_message("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"), Some(Message::NvrmOther { gpu_ordinal: None }));
/// assert_eq!(parse_message("usb 1-1: new high-speed USB device"), None);
/// ```
pub fn parse_message(msg: &str) -> Option<Message<'_>> {
    // The driver's XID line as it prints it, every line of an XID storm: no search.
    // (An NVSwitch `SXid (` line never starts with the GPU driver's `NVRM: Xid (`.)
    if let Some(x) = msg.strip_prefix("NVRM: Xid (") {
        return parse_xid(x).map(Message::Xid);
    }
    if !interesting(msg.as_bytes()) {
        return None;
    }
    if let Some(i) = find!(msg, "SXid (") {
        return parse_sxid(&msg[i + 6..]).map(Message::Sxid);
    }
    if let Some(i) = find!(msg, "NVRM") {
        let rest = msg[i + 4..].strip_prefix(':').map(str::trim_start);
        if let Some(rest) = rest {
            if let Some(x) = rest.strip_prefix("Xid (") {
                return parse_xid(x).map(Message::Xid);
            }
            return Some(parse_nvrm_other(rest));
        }
    }
    if let Some(m) = parse_aer(msg) {
        return Some(m);
    }
    if (contains!(msg, "mce:")
        || contains!(msg, "[Hardware Error]")
        || contains!(msg, "Machine Check")
        || contains!(msg, "Machine check")
        || contains!(msg, "machine check")
        || contains!(msg, "EDAC "))
        && let Some(m) = parse_mce(msg)
    {
        return Some(m);
    }
    if let Some(m) = parse_peermem(msg) {
        return Some(m);
    }
    if let Some(m) = parse_thermal(msg, None) {
        return Some(m);
    }
    // `nvidia: probe of 0000:3b:00.0 failed with error -1`, `nvidia-nvlink: ...`.
    if let Some(i) = find!(msg, "probe of ")
        && contains!(&msg[..i], "nvidia")
        && let Some(j) = find!(&msg[i..], "failed with error ")
    {
        let code = msg[i + j + 18..].split_whitespace().next();
        return Some(Message::DriverError(DriverErrorMsg {
            pci: crate::pci::find_pci(msg),
            error: "probe_failed",
            code,
        }));
    }
    // NVLink lines outside NVRM count only from the NVLink core and NVSwitch drivers:
    // `nvidia-fs: failed to register nvlink peer` is not an NVLink fault.
    if let Some(body) = nvlink_driver_body(msg)
        && (contains!(body, "nvlink")
            || contains!(body, "NVLink")
            || contains!(body, "NVLINK")
            || contains!(body, "Nvlink")
            || contains!(msg, "nvidia-nvlink:"))
    {
        return parse_nvlink(body);
    }
    None
}

/// The text after an `nvidia-nvlink:` or `nvidia-nvswitchN:` driver prefix, when the
/// message is printed by one of those drivers (the prefix starts the message or follows
/// a blank, as in `kernel: nvidia-nvlink: ...`).
fn nvlink_driver_body(msg: &str) -> Option<&str> {
    let i = find!(msg, "nvidia-nv")?;
    if i > 0 && msg.as_bytes()[i - 1] != b' ' {
        return None;
    }
    let rest = &msg[i + 9..];
    let rest = if let Some(r) = rest.strip_prefix("link:") {
        r
    } else {
        let r = rest.strip_prefix("switch")?;
        r.trim_start_matches(|c: char| c.is_ascii_digit())
            .strip_prefix(':')?
    };
    Some(rest.trim_start())
}

#[inline]
fn parse_xid(s: &str) -> Option<XidMsg<'_>> {
    parse_xid_usual(s).or_else(|| parse_xid_general(s))
}

/// Index of the first byte at or after `i` that is not ASCII whitespace, or `None`
/// when that byte is not ASCII (Unicode whitespace may follow: the general path
/// decides).
#[inline]
fn skip_ascii_ws(b: &[u8], mut i: usize) -> Option<usize> {
    // Nearly always one blank, then the next field.
    let graphic = |c: Option<&u8>| c.is_some_and(|&c| c > b' ' && c < 0x80);
    if b.get(i) == Some(&b' ') && graphic(b.get(i + 1)) {
        return Some(i + 1);
    }
    while let Some(&c) = b.get(i) {
        if !is_ascii_ws(c) {
            return (c < 0x80).then_some(i);
        }
        i += 1;
    }
    Some(i)
}

/// The XID line as the driver prints it, in one forward pass over the bytes:
/// `(PCI:dddd:bb:dd): N, pid=N, name=S, Ch HEX, detail` (each field optional, in any
/// order, ASCII blanks, a code below 10⁹). `None` for any other shape, which
/// [`parse_xid_general`] reads; where this gives `Some`, it is exactly what the
/// general reading gives (tested against it on generated lines and by the fuzzer).
#[inline]
pub(crate) fn parse_xid_usual(s: &str) -> Option<XidMsg<'_>> {
    let b = s.as_bytes();
    // The address in the driver's own form, `dddd:bb:dd` or `dddd:bb:dd.f`, closed by
    // `)`: none of its bytes is a `)` or a blank, so that `)` is the first one and the
    // address the general path's first word.
    let from = if b.starts_with(b"PCI:") { 4 } else { 0 };
    let close = match b.get(from + 10) {
        Some(b')') => from + 10,
        Some(b'.') if b.get(from + 12) == Some(&b')') => from + 12,
        _ => return None,
    };
    if !crate::pci::is_usual_pci(&b[from..close]) || b.get(close + 1) != Some(&b':') {
        return None;
    }
    // The code: one to nine digits.
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
            let p = i + 4;
            // Digits up to the comma (or the end): the number; anything else is read
            // as the general path reads it.
            let end = match digits_u32(b, p) {
                Some((n, end)) if matches!(b.get(end), None | Some(b',')) => {
                    pid = Some(n);
                    end
                }
                _ => {
                    let end = find_byte(b, p, b',').unwrap_or(b.len());
                    pid = s[p..end].trim().parse::<u32>().ok();
                    end
                }
            };
            i = next(end, b",")?;
        } else if rest.starts_with(b"name=") {
            let p = i + 5;
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
            if !name.is_empty() && name != "<unknown>" {
                process = Some(name);
            }
            i = next(end, b",")?;
        } else if let Some(skip) = channel_prefix(rest) {
            let p = i + skip;
            let mut end = p;
            while b
                .get(end)
                .is_some_and(|&c| crate::pci::HEX_VALUE[usize::from(c)] < 16 || c == b'x')
            {
                end += 1;
            }
            if end == p {
                break;
            }
            channel = Some(&s[p..end]);
            i = next(end, b",.")?;
        } else {
            break;
        }
    }
    Some(XidMsg {
        pci: &s[from..close],
        code,
        code_as_printed: None,
        pid,
        process,
        channel,
        detail: &s[i..],
    })
}

/// One to nine ASCII digits at `b[i..]`: their value and the index after them
/// (`None` for none or more than nine).
#[inline]
fn digits_u32(b: &[u8], mut i: usize) -> Option<(u32, usize)> {
    let from = i;
    let mut n = 0u32;
    while let Some(&c) = b.get(i) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        if i - from == 9 {
            return None;
        }
        n = n * 10 + u32::from(d);
        i += 1;
    }
    (i > from).then_some((n, i))
}

/// Index of the first `needle` at or after `from`: eight bytes at a time (a word
/// compare instead of a call into memchr, whose set-up costs more than the few
/// bytes a field of an XID line has).
#[inline]
pub(crate) fn find_byte(b: &[u8], from: usize, needle: u8) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while let Some(w) = b.get(i..).and_then(|r| r.first_chunk::<8>()) {
        let x = u64::from_le_bytes(*w) ^ (LO * u64::from(needle));
        // A zero byte of `x` (a byte equal to `needle`) sets its top bit here; the
        // lowest such bit is exact (borrows only run upwards from it).
        let found = x.wrapping_sub(LO) & !x & HI;
        if found != 0 {
            return Some(i + (found.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    b.get(i..)?.iter().position(|&c| c == needle).map(|p| i + p)
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
    })
}

/// Whitespace as `char::is_whitespace` sees it, ASCII part.
fn is_ascii_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}

/// `s.trim_start()`: a byte loop over ASCII whitespace, `str::trim_start` only when
/// a non-ASCII character follows (it may be Unicode whitespace).
fn trim_start(s: &str) -> &str {
    match skip_ascii_ws(s.as_bytes(), 0) {
        Some(i) => &s[i..],
        None => s.trim_start(),
    }
}

/// `s.trim_start_matches(set)` for a set of ASCII characters (bytes of other
/// characters never equal an ASCII byte, so bytes are exact).
fn trim_start_bytes<'a>(s: &'a str, set: &[u8]) -> &'a str {
    let i = s.bytes().position(|c| !set.contains(&c)).unwrap_or(s.len());
    &s[i..]
}

/// `s.trim_end_matches(set)` for a set of ASCII characters.
fn trim_end_bytes<'a>(s: &'a str, set: &[u8]) -> &'a str {
    let end = s
        .bytes()
        .rposition(|c| !set.contains(&c))
        .map_or(0, |i| i + 1);
    &s[..end]
}

/// `s.find(", ")`.
fn find_comma_space(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (1..b.len())
        .find(|&i| b[i] == b' ' && b[i - 1] == b',')
        .map(|i| i - 1)
}

/// `s.split_whitespace().next()`, without the iterator for the usual all-ASCII token.
fn first_word(s: &str) -> Option<&str> {
    if !s.is_empty() && s.bytes().all(|c| c.is_ascii_graphic()) {
        Some(s)
    } else {
        s.split_whitespace().next()
    }
}

fn parse_sxid(s: &str) -> Option<SxidMsg<'_>> {
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

/// `rest` is the text after `NVRM:`.
fn parse_nvrm_other(rest: &str) -> Message<'_> {
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

/// ECC error type named in free text, by precedence: `dbe` (`DBE`, `double bit`,
/// `double-bit`), `sbe` (`SBE`, `single bit`, `single-bit`), `uncorrected`
/// (`ncorrectable`, `ncorrected`), `corrected` (`orrectable`, `orrected`).
///
/// Every marker contains `BE`, `bit` or `orrect`, and the bytes around each hit tell
/// which one it is: one SIMD search for the three (no two of them can overlap, so
/// its non-overlapping hits are all of them), or two passes where the CPU has no
/// packed searcher.
pub(crate) fn ecc_type_of(s: &str) -> Option<&'static str> {
    use aho_corasick::packed;
    use std::sync::LazyLock;
    static CORES: LazyLock<Option<packed::Searcher>> = LazyLock::new(|| {
        packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(["BE", "bit", "orrect"])
            .build()
    });
    let Some(cores) = CORES.as_ref() else {
        return ecc_type_two_passes(s);
    };
    let b = s.as_bytes();
    let before = |i: usize, n: usize| i.checked_sub(n).map(|start| &b[start..i]);
    let (mut sbe, mut uncorrected, mut corrected) = (false, false, false);
    for m in cores.find_iter(b) {
        let i = m.start();
        match m.pattern().as_usize() {
            0 => match before(i, 1) {
                Some(b"D") => return Some("dbe"),
                Some(b"S") => sbe = true,
                _ => {}
            },
            1 => match before(i, 7) {
                Some(b"double " | b"double-") => return Some("dbe"),
                Some(b"single " | b"single-") => sbe = true,
                _ => {}
            },
            _ => {
                let after = &b[i + 6..];
                if after.starts_with(b"able") || after.starts_with(b"ed") {
                    if before(i, 2) == Some(b"nc") {
                        uncorrected = true;
                    } else {
                        corrected = true;
                    }
                }
            }
        }
    }
    if sbe {
        Some("sbe")
    } else if uncorrected {
        Some("uncorrected")
    } else {
        corrected.then_some("corrected")
    }
}

/// [`ecc_type_of`] without the packed searcher: the markers' rare first letters
/// `B`/`b` found together, then `orrect`.
fn ecc_type_two_passes(s: &str) -> Option<&'static str> {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    static ORRECT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("orrect"));
    let b = s.as_bytes();
    let before = |i: usize, n: usize| i.checked_sub(n).map(|start| &b[start..i]);
    // `BE` and `bit` start with a `B` or `b`, rare in a driver's text: one pass for both.
    let mut sbe = false;
    for i in memchr::memchr2_iter(b'B', b'b', b) {
        if b[i..].starts_with(b"BE") {
            match before(i, 1) {
                Some(b"D") => return Some("dbe"),
                Some(b"S") => sbe = true,
                _ => {}
            }
        } else if b[i..].starts_with(b"bit") {
            match before(i, 7) {
                Some(b"double " | b"double-") => return Some("dbe"),
                Some(b"single " | b"single-") => sbe = true,
                _ => {}
            }
        }
    }
    if sbe {
        return Some("sbe");
    }
    let mut corrected = false;
    let mut at = 0;
    while let Some(i) = b.get(at..).and_then(|h| ORRECT.find(h)).map(|i| at + i) {
        at = i + 1;
        let after = &b[i + 6..];
        if after.starts_with(b"able") || after.starts_with(b"ed") {
            if before(i, 2) == Some(b"nc") {
                return Some("uncorrected");
            }
            corrected = true;
        }
    }
    corrected.then_some("corrected")
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

fn parse_thermal<'a>(msg: &'a str, pci: Option<&'a str>) -> Option<Message<'a>> {
    let temp =
        contains!(msg, "temperature") || contains!(msg, "thermal") || contains!(msg, "Thermal");
    if !temp {
        return None;
    }
    let alarm = contains!(msg, "above threshold")
        || contains!(msg, "slowdown")
        || contains!(msg, "Slowdown")
        || contains!(msg, "shutdown")
        || contains!(msg, "throttl")
        || contains!(msg, "exceed")
        || contains!(msg, "critical");
    if !alarm || contains!(msg, "normal") {
        return None;
    }
    // `... temperature 92C` / `92 C`.
    let temperature_c = msg.split_whitespace().find_map(|w| {
        let w = w.trim_end_matches([',', '.', ')']);
        let n = w.strip_suffix('C').or_else(|| w.strip_suffix("°C"))?;
        n.parse::<u32>().ok().filter(|t| *t < 200)
    });
    Some(Message::Thermal(ThermalMsg { pci, temperature_c }))
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

fn parse_mce(msg: &str) -> Option<Message<'_>> {
    let mce = |bank, part, severity| {
        Some(Message::Mce(MceMsg {
            bank,
            part,
            severity,
        }))
    };
    if let Some(i) = find!(msg, "Kernel panic - not syncing")
        && (contains!(&msg[i..], "achine check") || contains!(&msg[i..], "achine Check"))
    {
        return mce(None, Some(McePart::Panic), Some("fatal"));
    }
    // `EDAC <driver> MC<n>: …` at the start of the message or after a blank
    // (a saved line may keep a `kernel:` tag before it).
    let edac = find!(msg, "EDAC ")
        .filter(|&i| i == 0 || msg.as_bytes()[i - 1].is_ascii_whitespace())
        .map(|i| &msg[i + 5..]);
    if let Some(rest) = edac {
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
        return mce(None, None, None);
    }
    let hw =
        find!(msg, "[Hardware Error]").map(|i| msg[i + 16..].trim_start_matches(':').trim_start());
    if let Some(body) = hw {
        if body.starts_with("Hardware error from APEI") {
            return mce(None, Some(McePart::Summary), None);
        }
        if let Some(sev) = body.strip_prefix("event severity:") {
            let severity = match sev.trim() {
                "corrected" | "info" => Some("corrected"),
                "recoverable" => Some("recoverable"),
                "fatal" => Some("fatal"),
                _ => None,
            };
            return mce(None, Some(McePart::Severity), severity);
        }
        // AMD decoder: `Corrected error, no action required.`, `Uncorrected, software
        // containable error.`, `System Fatal error.`, older `Error Status: …`.
        let status_text = body.strip_prefix("Error Status:").map(str::trim_start);
        let summary = status_text.unwrap_or(body);
        if summary.starts_with("Corrected error") {
            return mce(None, Some(McePart::Summary), Some("corrected"));
        }
        if summary.starts_with("Uncorrected") {
            return mce(None, Some(McePart::Summary), Some("uncorrected"));
        }
        if summary.starts_with("System Fatal error") {
            return mce(None, Some(McePart::Summary), Some("fatal"));
        }
        if status_text.is_some() {
            return mce(None, Some(McePart::Summary), None);
        }
        // `CPU:2 (15:2:0) MC2_STATUS[-|CE|MiscV|-|-|-|-|CECC]: 0x98444000010c0176`.
        if let Some(i) = find!(body, "_STATUS[") {
            let head = &body[..i];
            let bank = head.rfind("MC").and_then(|m| mc_bank(&head[m..]));
            let severity = body[i..]
                .find("]: ")
                .and_then(|c| status_severity(&body[i + c + 3..]));
            return mce(bank, Some(McePart::Status), severity);
        }
        // `MC2 Error: VB Data ECC or parity error.`, `MC4 Error (node 2): …`.
        if let Some(bank) = mc_bank(body)
            && let Some(sp) = body.find(' ')
            && body[sp + 1..].starts_with("Error")
        {
            return mce(Some(bank), Some(McePart::BankDecode), None);
        }
    }
    if contains!(msg, "Machine check events logged") {
        return mce(None, Some(McePart::Summary), None);
    }
    if let Some(i) = find!(msg, "Machine Check") {
        let bank = find!(&msg[i..], "Bank ").and_then(|b| leading_u32(&msg[i + b + 5..]));
        let severity = bank.and_then(|(_, r)| status_severity(r.trim_start_matches(':')));
        return mce(bank.map(|b| b.0), Some(McePart::Status), severity);
    }
    if hw.is_some() || contains!(msg, "mce:") {
        return mce(None, None, None);
    }
    None
}

/// `nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, …`:
/// the module prints its name, the function and line, then `ERROR`.
fn parse_peermem(msg: &str) -> Option<Message<'_>> {
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

/// An NVLink error in the text of an NVIDIA driver line (`NVRM:` or an NVLink/NVSwitch
/// driver prefix, already checked by the caller). Only real error phrasing counts:
/// `fatal`, `error`, `fail`, `link down`/`is down` — not progress notes such as
/// `link training in progress` — and never a driver assertion (`nvAssertFailedNoLog:
/// Assertion failed: ... @ kernel_nvlink.c:...`), which reports a driver check, not a link.
fn parse_nvlink(msg: &str) -> Option<Message<'_>> {
    let assertion = contains!(msg, "Assertion failed")
        || contains!(msg, "nvAssert")
        || contains!(msg, "Check failed")
        || contains!(msg, "nvCheck");
    if assertion || contains!(msg, "is being initialized") {
        return None;
    }
    let err = contains!(msg, "rror")
        || contains!(msg, "ERROR")
        || contains!(msg, "fatal")
        || contains!(msg, "Fatal")
        || contains!(msg, "FATAL")
        || contains!(msg, "fail")
        || contains!(msg, "Fail")
        || contains!(msg, "link down")
        || contains!(msg, "Link down")
        || contains!(msg, "is down");
    if !err {
        return None;
    }
    let fatal = if contains!(msg, "non-fatal")
        || contains!(msg, "Non-fatal")
        || contains!(msg, "Nonfatal")
        || contains!(msg, "nonfatal")
    {
        Some(false)
    } else if contains!(msg, "fatal") || contains!(msg, "Fatal") || contains!(msg, "FATAL") {
        Some(true)
    } else {
        None
    };
    Some(Message::Nvlink(NvlinkMsg {
        pci: crate::pci::find_pci(msg),
        link: link_in(msg),
        fatal,
    }))
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

fn parse_aer(msg: &str) -> Option<Message<'_>> {
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

    /// The twelve-search definition `ecc_type_of` replaced (one search per marker).
    fn ecc_type_reference(s: &str) -> Option<&'static str> {
        let has = |n: &str| s.contains(n);
        if has("DBE") || has("double bit") || has("double-bit") {
            Some("dbe")
        } else if has("SBE") || has("single bit") || has("single-bit") {
            Some("sbe")
        } else if has("ncorrectable") || has("ncorrected") {
            Some("uncorrected")
        } else if has("orrectable") || has("orrected") {
            Some("corrected")
        } else {
            None
        }
    }

    #[test]
    fn ecc_type_shapes() {
        for (text, want) in [
            ("Contained: SM (0x1). RST: No, D-RST: No", None),
            ("DBE (0x1) at 0x123", Some("dbe")),
            (
                "uncorrectable single-bit and double-bit errors",
                Some("dbe"),
            ),
            ("SBE count exceeded; Uncorrected", Some("sbe")),
            ("single bit error", Some("sbe")),
            ("Uncorrectable ECC error", Some("uncorrected")),
            ("Corrected then uncorrected", Some("uncorrected")),
            ("corrected error", Some("corrected")),
            ("Correctable", Some("corrected")),
            ("orrect only, BE, bit, xSBEy", Some("sbe")),
            ("incorrect", None),
            ("BEBE", None),
            ("", None),
        ] {
            assert_eq!(ecc_type_of(text), want, "{text}");
            assert_eq!(ecc_type_two_passes(text), want, "two passes: {text}");
            assert_eq!(ecc_type_reference(text), want, "reference: {text}");
        }
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
    fn find_byte_finds_the_first_one() {
        for len in 0..40 {
            for a in 0..=len {
                for b in a..=len {
                    let mut h = vec![b'x'; len];
                    // A byte just above the needle can look like one to the word test.
                    for (at, c) in [(a, b','), (b, b'-')] {
                        if at < len {
                            h[at] = c;
                        }
                    }
                    for from in 0..=len {
                        let want = h[from..].iter().position(|&c| c == b',').map(|p| from + p);
                        assert_eq!(find_byte(&h, from, b','), want, "{len} {a} {b} {from}");
                    }
                }
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

    /// Each marker and near miss at every offset of a filler text, at its end and
    /// followed by more text.
    #[test]
    fn ecc_type_at_every_offset_is_the_reference() {
        for marker in [
            "DBE",
            "SBE",
            "xBE",
            "double-bit",
            "single bit",
            "doublebit",
            "Uncorrectable",
            "uncorrected",
            "Corrected",
            "orrectable",
            "orrect",
            "Bit",
            "bi",
            "rr",
        ] {
            for at in 0..90 {
                for len in [at + marker.len(), at + marker.len() + 1, 100, 129] {
                    let mut text = "Graphics Exception: ESR 0x5041b0=0x1 ".repeat(4);
                    text.truncate(at);
                    text.push_str(marker);
                    while text.len() < len {
                        text.push('x');
                    }
                    let want = ecc_type_reference(&text);
                    assert_eq!(ecc_type_of(&text), want, "{text:?}");
                    assert_eq!(ecc_type_two_passes(&text), want, "two passes: {text:?}");
                }
            }
        }
    }

    proptest::proptest! {
        /// The one-search reading and the two-pass fallback agree with the
        /// one-search-per-marker definition on text made of marker fragments, near
        /// misses and noise.
        #[test]
        fn ecc_type_matches_reference(parts in proptest::collection::vec(
            proptest::sample::select(&[
                "DBE", "SBE", "BE", "D", "S", "double", "single", " ", "-", "bit", "bits",
                "nc", "n", "c", "orrect", "able", "ed", "U", "Un", "ncorrect", "Correct",
                "error", "x", "é", "(0x1)", "B", "b", "bi", "BEE", "Bbit",
            ][..]),
            0..24,
        )) {
            let text = parts.concat();
            let want = ecc_type_reference(&text);
            proptest::prop_assert_eq!(ecc_type_of(&text), want, "{}", text);
            proptest::prop_assert_eq!(ecc_type_two_passes(&text), want, "two passes: {}", text);
        }
    }

    #[test]
    fn prefilter_rejects_ordinary_lines() {
        for l in [
            "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
            "EXT4-fs (sda1): mounted filesystem with ordered data mode",
            "systemd[1]: Started Journal Service.",
        ] {
            assert!(!interesting(l.as_bytes()), "{l}");
        }
    }

    /// NVLink faults come only from NVIDIA driver lines with real
    /// error phrasing.
    #[test]
    fn nvlink_lines_are_anchored_to_driver_prefixes() {
        fn nvlink(l: &str) -> Option<NvlinkMsg<'_>> {
            match parse_message(l) {
                Some(Message::Nvlink(n)) => Some(n),
                _ => None,
            }
        }
        assert_eq!(
            nvlink("nvidia-nvswitch3: NVLink link 12 training failed").map(|n| (n.link, n.fatal)),
            Some((Some(12), None))
        );
        assert_eq!(
            nvlink("kernel: nvidia-nvlink: IBMNPU: Link 2 training failed").map(|n| n.link),
            Some(Some(2))
        );
        assert_eq!(
            nvlink("NVRM: NVLink: fatal error detected on link 3").map(|n| n.fatal),
            Some(Some(true))
        );
        assert_eq!(
            nvlink("NVRM: NVLink: non-fatal error on link 5").map(|n| n.fatal),
            Some(Some(false))
        );
        for l in [
            "nvidia-fs: failed to register nvlink peer",
            "xnvidia-nvlink: link 2 failed",
            "nvidia-nvswitch: switch is fine",
            "nvidia-nvswitch0: nothing to do with links, failed",
            "nvidia-nvlink: link training in progress",
            "NVRM: nvAssertFailedNoLog: Assertion failed: 0 @ kernel_nvlink.c:12",
            "NVRM: nvCheckOkFailedNoLog: Check failed: x returned from knvlinkFoo(pGpu) @ a.c:1",
            "app: Fatal: nvlink test aborted",
        ] {
            assert!(nvlink(l).is_none(), "{l}");
        }
        assert_eq!(nvlink_driver_body("nvidia-nvswitch12:  x"), Some("x"));
        assert_eq!(nvlink_driver_body("nvidia-nvlink:y"), Some("y"));
        assert_eq!(nvlink_driver_body("nvidia-nvswitchX: y"), None);
        assert_eq!(nvlink_driver_body("nvidia-nv"), None);
    }
}
