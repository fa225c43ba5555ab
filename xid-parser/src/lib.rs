//! Pure, fast parser for Linux kernel log records and NVIDIA GPU fault messages.
//!
//! Layers, bottom up:
//!
//! - [`parse_kmsg_record`]: one `/dev/kmsg` record (`PRI,SEQ,TS_USEC,FLAGS;MESSAGE`
//!   plus ` KEY=VALUE` dictionary lines), borrowing from the read buffer.
//! - [`parse_line`]: one line of a saved log, its format detected per line (`dmesg`
//!   and its `-r/-T/-H/--time-format iso` variants, caller ids, `journalctl -k`,
//!   syslog/rsyslog, raw kmsg records). Never fails.
//! - [`parse_message`]: one kernel message → a typed [`Message`] (NVRM XID, NVSwitch
//!   SXid, PCIe AER, NVLink, ECC, row remap, thermal, machine check, driver errors,
//!   `mlx5_core` NIC link / cable module / health lines), or `None` for the vast
//!   majority of lines (memchr prefilter, no allocation).
//! - [`Scanner`]: assembles multi-record faults (GPU identity + XID 79, AER summary +
//!   details, SXid follow-ups, GSP RPC dumps after XID 119/120), then classifies each
//!   [`FaultEvent`](gpuwatch_proto::FaultEvent) with the [`Policy`]. Readers that keep
//!   no event take them borrowed ([`Scanner::push_view`],
//!   [`FaultEventRef`](gpuwatch_proto::FaultEventRef)): an XID line that is its own
//!   event is classified and handed out from its own text, without an allocation.
//! - [`saved_log`]: saved logs (plain, gzip, bug reports) read in blocks with one
//!   marker search per buffer, against [`saved_log::read_events_plain`], the plain
//!   per-line definition.
//!
//! ```
//! use std::sync::Arc;
//! use xid_parser::{parse_kmsg_record, Policy, RecordMeta, Scanner};
//!
//! let rec = parse_kmsg_record(
//!     b"3,1042,86400000000,-;NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n",
//! )
//! .unwrap();
//! assert_eq!((rec.facility, rec.level, rec.seq), (0, 3, 1042));
//!
//! let mut scanner = Scanner::new(Arc::new(Policy::default()));
//! let meta = RecordMeta { seq: Some(rec.seq), monotonic_usec: Some(rec.ts_usec), ..Default::default() };
//! let mut events = Vec::new();
//! assert!(Scanner::interesting(rec.message));
//! scanner.push(meta, &rec.message(), &mut events);
//! scanner.finish(&mut events);
//! assert_eq!(events.len(), 1);
//! assert_eq!(events[0].code, 79);
//! assert_eq!(events[0].pci_address, "0000:3b:00.0");
//! assert_eq!(events[0].pid, Some(1234));
//! ```
#![warn(unreachable_pub)]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod catalog;
#[cfg(test)]
mod generated_check;
mod line;
mod markers;
mod message;
mod nvlink5;
mod overrides;
mod pci;
mod policy;
mod record;
pub mod saved_log;
mod scanner;

pub use line::{LineFormat, LogLine, YearlessTime, parse_line};
pub use markers::{LINE_MARKERS, MarkerFinder};
pub use message::{
    AerDetail, AerSeverity, AerSummary, DriverErrorMsg, EccMsg, GpuIdentity, MceMsg, McePart,
    Message, NicEvent, NicMsg, NvlinkMsg, SxidMsg, ThermalMsg, XidMsg, parse_message,
    recovery_action_from_text,
};
pub use nvlink5::{
    Bits, Layout, Nvlink5Row, Resolution, decode as decode_nvlink5, layout_of_driver, nvlink5_rows,
};
pub use overrides::{CountWindow, OverrideProblem, PolicyOverrides, XidOverride};
pub use pci::{find_pci, normalize_pci};
pub use policy::{ContextWindow, Explanation, OtherAgents, Policy, PolicyEntry, PolicyError};
pub use record::{KmsgRecord, RecordError, parse_kmsg_record, unescape_kmsg};
pub use scanner::{DEFAULT_HOLD_USEC, RecordMeta, Scanner};

/// Checks for the fuzz targets: each fast path of the parser against the general
/// reading it stands in for. Not part of the API.
#[doc(hidden)]
pub mod fuzz_checks {
    /// True when the one-pass reading of an XID line body (the text after
    /// `NVRM: Xid (`) gives nothing or what the general reading gives.
    pub fn xid_readings_agree(body: &str) -> bool {
        use crate::message::{parse_xid_general, parse_xid_usual};
        parse_xid_usual(body).is_none_or(|usual| Some(usual) == parse_xid_general(body))
    }
}
