//! Kernel messages → typed GPU/PCIe/host fault messages.
//!
//! [`parse_message`] borrows from the message and allocates nothing; the vast
//! majority of kernel lines are rejected by a memchr prefilter
//! ([`interesting`]) before any parsing.
//!
//! One module per message family, each with its types and parser: `xid` (the
//! driver's XID line), `sxid` (NVSwitch), `aer` (PCIe AER), `nvlink`, `ecc` (ECC,
//! page retirement, row remapping), `thermal`, `mce` (machine checks), `driver`
//! (identity, serial, driver errors, nvidia-peermem, other `NVRM:` lines), `nic`
//! (the `mlx5_core` NIC driver: port link, cable/module, firmware health and
//! command timeouts, slot power; the kernel's transmit watchdog);
//! `prefilter` and `text` are what they share.

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

mod aer;
mod driver;
mod ecc;
mod mce;
mod nic;
mod nvlink;
mod prefilter;
mod sxid;
mod text;
mod thermal;
mod xid;

pub use aer::{AerDetail, AerSeverity, AerSummary};
pub use driver::{DriverErrorMsg, GpuIdentity};
pub use ecc::EccMsg;
pub(crate) use ecc::ecc_type_of;
pub use mce::{MceMsg, McePart};
pub(crate) use nic::module_status;
pub use nic::{NicEvent, NicMsg};
pub use nvlink::NvlinkMsg;
pub(crate) use prefilter::interesting;
pub use sxid::SxidMsg;
pub(crate) use text::{find_byte, link_in};
pub use thermal::ThermalMsg;
pub use xid::{XidMsg, recovery_action_from_text};
pub(crate) use xid::{parse_nvlink5, parse_xid_general, parse_xid_usual};

use aer::parse_aer;
use driver::{parse_nvrm_other, parse_peermem, parse_probe_failure};
use mce::parse_mce;
use nic::parse_nic;
use nvlink::{nvlink_driver_body, parse_nvlink};
use sxid::parse_sxid;
use thermal::parse_thermal;
use xid::parse_xid;

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
    /// A NIC line of the `mlx5_core` driver (port link up/down, cable or
    /// transceiver module event, firmware health report or command timeout,
    /// PCIe slot power), or the kernel's transmit watchdog line of any driver.
    Nic(NicMsg<'a>),
    /// Any other NVRM line (context only: GSP RPC dumps, crash dump notes).
    NvrmOther {
        /// GPU named as `GPUn` (`NVRM: GPU0 RPC history`), when any.
        gpu_ordinal: Option<u32>,
    },
}

/// Parses one (unescaped) kernel message. Returns `None` for messages that are not
/// GPU / PCIe / NIC / host-hardware faults or their context.
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
    // NIC lines take only the driver's link, module, health, command timeout
    // and slot power lines, and the transmit watchdog's; the AER
    // detail lines the AER driver prints under a NIC's driver name
    // (`mlx5_core 0000:3b:00.0: PCIe Bus Error: …`) go on to `parse_aer`.
    if let Some(n) = parse_nic(msg) {
        return Some(Message::Nic(n));
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
        // A line of no report part only continues one. The x86 thermal-throttle
        // messages carry the same `mce: ` prefix (`pr_fmt` of
        // arch/x86/kernel/cpu/mce/therm_throt.c) and are thermal events.
        if let Message::Mce(MceMsg { part: None, .. }) = m
            && let Some(t) = parse_thermal(msg, None)
        {
            return Some(t);
        }
        return Some(m);
    }
    if let Some(m) = parse_peermem(msg) {
        return Some(m);
    }
    if let Some(m) = parse_thermal(msg, None) {
        return Some(m);
    }
    if let Some(m) = parse_probe_failure(msg) {
        return Some(m);
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
