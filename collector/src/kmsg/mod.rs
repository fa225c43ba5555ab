//! The kernel log source: reads `/dev/kmsg` (or a kmsg-format replay file) on
//! its own thread, turns records into classified fault events with
//! [`xid_parser::Scanner`] and hands them to the engine.
//!
//! * `/dev/kmsg` is opened non-blocking; each `read(2)` returns exactly one
//!   record. When the ring holds nothing new (`EAGAIN`) the thread waits in
//!   `poll(2)`: up to 10 ms while the scanner holds a multi-record event (its
//!   hold window then expires on time), otherwise until a record arrives or
//!   shutdown (the poll set holds the shutdown signal's wake descriptor),
//!   waking only for its liveness heartbeat every
//!   [`IDLE_HEARTBEAT`](crate::liveness::IDLE_HEARTBEAT).
//! * `EINVAL` from `read` means the buffer is smaller than the record: the
//!   buffer grows (up to 1 MiB) and the read is retried.
//! * `EPIPE` means the ring overwrote records we had not read; the kernel moves
//!   our position to the oldest record, the sequence-number gap is counted as
//!   lost (`gpuwatch_kmsg_records_lost_total`, warn log `Kernel log records
//!   were lost.` with `lost=`) and reading continues. Every other sequence gap
//!   is counted the same way.
//! * Only facility 0 (kern) records can raise faults unless
//!   `accept_user_facility` is set: anyone who can write `/dev/kmsg` must not be
//!   able to quarantine a node. Other records are still counted as read.
//! * Position: the reader never writes state. Whenever the delivered events
//!   are exactly those of the records read so far — the scanner holds no
//!   multi-record event and the [`FaultSender`](crate::pipeline::FaultSender)
//!   holds nothing for lack of room — it tells the engine `Input::KmsgProgress(boot_id, last_seq)`
//!   (when it goes idle, and at most every `cursor_interval_ms` while records
//!   keep coming). The engine writes that position in the same atomic write
//!   as the faults it accounted for, and only at such a settled point, so
//!   the state file always holds exactly the faults of the records up to its
//!   position: a `kill -9` at any moment, even during a write, neither loses
//!   a fault nor counts one twice. At a clean stop the reader delivers what
//!   it holds and reports its final position; what it could not deliver is
//!   read again at the next start.
//!   The position to resume after comes from the engine's loaded state
//!   ([`KmsgSourceArgs::resume`]).
//!   Same boot: records up to `last_seq` are skipped, so nothing is replayed
//!   twice after a clean stop and nothing is skipped. After a read error the
//!   input is reopened and records up to the last one read are skipped the
//!   same way. New boot (or no position): the whole
//!   ring is read from its oldest record, so faults logged before the agent
//!   started are seen. (A fresh open of `/dev/kmsg` is positioned at the
//!   oldest record in the ring — `SEEK_SET`; `SEEK_DATA` would start after the
//!   last `dmesg --clear`, hiding records an operator cleared from the console
//!   view, so it is not used.)
//! * Any other path is a replay: a regular file or FIFO of kmsg-format lines
//!   (`PRI,SEQ,TS,FLAGS;MSG\n`, dictionary lines starting with a space are
//!   skipped), read in large chunks. At end of file the source keeps waiting
//!   for more (like `tail -f`) unless `exit_at_eof` is set: inotify tells it
//!   when the file is written (without inotify it reads again every 250 ms).
//!   A replay has no position.
//! * End of file from a character device (a container runtime that mapped
//!   `/dev/null` over `/dev/kmsg`) is an error: reported (the kernel log input
//!   is down, verdict `unknown`) and retried after the jittered retry interval,
//!   never a busy loop.

use crate::boot;
use crate::input::InputContext;
use crate::liveness::Liveness;
use crate::pipeline::StopReason;
use crossbeam_channel::Sender;
use gpuwatch_core::Registry;
use gpuwatch_core::msg::KmsgPosition;
use reader::Reader;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod device;
mod position;
mod reader;
mod record;
mod replay;
#[cfg(test)]
mod tests;

/// Default kernel log device.
pub(crate) const KMSG_PATH: &str = "/dev/kmsg";
const MAX_BUFFER: usize = 1024 * 1024;

/// Settings of the kernel log source (`[kmsg]`), as written in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct KmsgConfig {
    /// What to read: `/dev/kmsg`, or a regular file / FIFO of kmsg-format lines
    /// (replay). Default `/dev/kmsg`.
    pub path: PathBuf,
    /// Let records of facilities other than kern (0) raise faults. Off by
    /// default: userspace can write `/dev/kmsg`. Tests and the demo turn it on.
    pub accept_user_facility: bool,
    /// Stop the agent when a replay file ends (benchmarks). Default false.
    pub exit_at_eof: bool,
    /// Where the boot id is read (tests simulate a new boot with their own
    /// file). Default `/proc/sys/kernel/random/boot_id`.
    pub boot_id_path: PathBuf,
    /// Longest interval between two position reports to the engine while
    /// records keep arriving, milliseconds (the reader also reports whenever
    /// it goes idle). Default 1000.
    pub cursor_interval_ms: u64,
    /// Wait before reopening the input after it failed, seconds. Default 5.
    pub retry_interval_secs: u64,
    /// The host's `/proc`, where a line that names a pid is attributed to
    /// its pod (`<proc_root>/<pid>/cgroup`) the moment it is read. In the
    /// DaemonSet a read-only hostPath mount of the host's `/proc`. Only
    /// records read live from the device are attributed: a replayed file's
    /// pids name processes of another time. Default `/proc`.
    pub proc_root: PathBuf,
}

impl Default for KmsgConfig {
    fn default() -> Self {
        KmsgConfig {
            path: PathBuf::from(KMSG_PATH),
            accept_user_facility: false,
            exit_at_eof: false,
            boot_id_path: PathBuf::from(boot::BOOT_ID_PATH),
            cursor_interval_ms: 1000,
            retry_interval_secs: 5,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// `[kmsg]` resolved ([`KmsgConfig::resolve`]): what the source runs with,
/// its intervals as durations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgSettings {
    /// See [`KmsgConfig::path`].
    pub path: PathBuf,
    /// See [`KmsgConfig::accept_user_facility`].
    pub accept_user_facility: bool,
    /// See [`KmsgConfig::exit_at_eof`].
    pub exit_at_eof: bool,
    /// See [`KmsgConfig::boot_id_path`].
    pub boot_id_path: PathBuf,
    /// See [`KmsgConfig::cursor_interval_ms`].
    pub cursor_interval: Duration,
    /// See [`KmsgConfig::retry_interval_secs`].
    pub retry_interval: Duration,
    /// See [`KmsgConfig::proc_root`].
    pub proc_root: PathBuf,
}

impl Default for KmsgSettings {
    fn default() -> Self {
        KmsgConfig::default()
            .resolve()
            .expect("the default [kmsg] settings are valid")
    }
}

impl KmsgConfig {
    /// Checks the settings and types them in one pass: the resolved
    /// settings, or every problem (keys relative to `[kmsg]`).
    pub(crate) fn resolve(&self) -> Result<KmsgSettings, Vec<String>> {
        let mut problems = Vec::new();
        if self.path.as_os_str().is_empty() {
            problems.push("path: must not be empty".to_string());
        }
        if self.boot_id_path.as_os_str().is_empty() {
            problems.push("boot_id_path: must not be empty".to_string());
        }
        if self.proc_root.as_os_str().is_empty() {
            problems.push("proc_root: must not be empty".to_string());
        }
        if !(10..=3_600_000).contains(&self.cursor_interval_ms) {
            problems.push(format!(
                "cursor_interval_ms: must be between 10 and 3600000, got {}",
                self.cursor_interval_ms
            ));
        }
        if !(1..=3600).contains(&self.retry_interval_secs) {
            problems.push(format!(
                "retry_interval_secs: must be between 1 and 3600, got {}",
                self.retry_interval_secs
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(KmsgSettings {
            path: self.path.clone(),
            accept_user_facility: self.accept_user_facility,
            exit_at_eof: self.exit_at_eof,
            boot_id_path: self.boot_id_path.clone(),
            cursor_interval: Duration::from_millis(self.cursor_interval_ms),
            retry_interval: Duration::from_secs(self.retry_interval_secs),
            proc_root: self.proc_root.clone(),
        })
    }
}

/// Errors of the kernel log source.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KmsgError {
    /// The input could not be opened.
    #[error("cannot open kernel log {path}: {source}")]
    Open {
        /// The kernel log device or replay file (`kmsg.path`).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A character device returned end of file: not a kernel log (a container
    /// runtime may have mapped `/dev/null` there).
    #[error(
        "kernel log {path} returned end of file: it is not a kernel log device (is /dev/null mounted there?)"
    )]
    Eof {
        /// The kernel log device or replay file (`kmsg.path`).
        path: PathBuf,
    },
    /// Reading failed with an unexpected error.
    #[error("cannot read kernel log {path}: {source}")]
    Read {
        /// The kernel log device or replay file (`kmsg.path`).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What the source is started with ([`spawn`], [`run_source`]).
#[derive(Debug)]
pub(crate) struct KmsgSourceArgs {
    /// The `[kmsg]` section, flags applied, resolved.
    pub cfg: KmsgSettings,
    /// The position the engine's state accounts for (`Engine::kmsg_position`):
    /// in the same boot, records up to it are skipped. `None`: read the ring
    /// from its start.
    pub resume: Option<KmsgPosition>,
    /// This boot's id, stamped on each event; `resume` applies only when it
    /// names the same boot.
    pub boot_id: String,
    /// Classifies what the scanner finds (the built-in table with the
    /// `[policy]` overrides).
    pub policy: Arc<xid_parser::Policy>,
    /// Where the source counts records read, lost and malformed, and the
    /// events it coalesced or dropped.
    pub registry: Arc<Registry>,
    /// Where the reader reports that its thread runs and has its heartbeat
    /// held to a deadline (`/healthz`). Whether it can read and whether it
    /// read the ring to its end go to the engine as inputs.
    pub liveness: Arc<Liveness>,
    /// Told when the source ends by itself (end of a replay with `exit_at_eof`).
    pub stop_tx: Option<Sender<StopReason>>,
    /// The engine's emitted events coming back for reuse
    /// ([`gpuwatch_core::msg::spent_events`]); `None`: every event is new.
    pub spent: Option<gpuwatch_core::msg::SpentReceiver>,
}

/// Counts of one source run (returned when the thread ends).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KmsgSummary {
    /// Records processed (read and not skipped by the cursor).
    pub records: u64,
    /// Fault events handed to the engine.
    pub events: u64,
}

/// Starts [`run_source`] on a thread of its own (`gpuwatch-kmsg`).
pub(crate) fn spawn(
    args: KmsgSourceArgs,
    ctx: InputContext,
) -> std::io::Result<std::thread::JoinHandle<KmsgSummary>> {
    std::thread::Builder::new()
        .name("gpuwatch-kmsg".into())
        .spawn(move || run_source(args, ctx))
}

/// The source loop (runs on the calling thread until `ctx`'s shutdown, the
/// engine going away, or the end of a replay with `exit_at_eof`). Its
/// events go into `ctx`'s channel by the [`FaultSender`](crate::pipeline::FaultSender)'s
/// rules; its heartbeat is `ctx`'s, which `/healthz` holds to
/// [`PROGRESS_DEADLINE`](crate::liveness::PROGRESS_DEADLINE) from the
/// start of this call.
pub(crate) fn run_source(args: KmsgSourceArgs, ctx: InputContext) -> KmsgSummary {
    let liveness = args.liveness.clone();
    let _alive = liveness.kmsg_running();
    liveness.watch(ctx.watched(
        gpuwatch_core::msg::MonitorInput::Kmsg,
        crate::liveness::PROGRESS_DEADLINE,
    ));
    let stop_tx = args.stop_tx.clone();
    let mut src = Reader::new(args, ctx);
    let ended_by_eof = src.run();
    src.finish();
    if ended_by_eof && let Some(tx) = stop_tx {
        let _ = tx.send(StopReason::InputEnded);
    }
    src.summary
}

/// True when `path` is a character device: the reader then keeps a
/// position (reports [`Input::KmsgProgress`](gpuwatch_core::msg::Input::KmsgProgress)); a replay file or FIFO has none.
pub(crate) fn is_device(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(path == Path::new(KMSG_PATH))
}
