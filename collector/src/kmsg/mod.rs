//! The kernel log source: reads `/dev/kmsg` (or a kmsg-format replay file) on
//! its own thread, turns records into classified fault events with
//! [`xid_parser::Scanner`] and hands them to the engine.
//!
//! * `/dev/kmsg` is opened non-blocking; each `read(2)` returns exactly one
//!   record. When the ring holds nothing new (`EAGAIN`) the thread waits in
//!   `poll(2)`: up to 10 ms while the scanner holds a multi-record event (its
//!   hold window then expires on time), otherwise until a record arrives or
//!   shutdown (the poll set holds the shutdown signal's wake descriptor),
//!   waking only for its liveness heartbeat every [`IDLE_HEARTBEAT`].
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
//!   multi-record event and the [`FaultSender`] holds nothing for lack of
//!   room — it tells the engine `Input::KmsgProgress(boot_id, last_seq)`
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
use crate::pipeline::{FaultSender, IDLE_HEARTBEAT, InOrder, Liveness, SendStatus, StopReason};
use crossbeam_channel::Sender;
use gpuwatch_core::msg::{Input, KmsgPosition, MonitorInput};
use gpuwatch_core::{Registry, Shutdown, WakeFd};
use gpuwatch_proto::{FaultEvent, Source};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use xid_parser::{RecordMeta, Scanner};

/// Default kernel log device.
pub const KMSG_PATH: &str = "/dev/kmsg";
/// A sequence gap larger than any ring can hold (the kernel caps the log
/// buffer at 2 GiB, and a record takes at least 32 bytes of it) is not a count
/// of lost records.
const MAX_PLAUSIBLE_GAP: u64 = (2u64 << 30) / 32;
const MIN_BUFFER: usize = 16 * 1024;
const MAX_BUFFER: usize = 1024 * 1024;
const REPLAY_CHUNK: usize = 256 * 1024;
/// Wait while the scanner holds a multi-record event (its window expires
/// on time).
const HOLD_WAIT: Duration = Duration::from_millis(10);
/// Wait while the sender holds events for lack of room in the engine channel.
const RETRY_WAIT: Duration = Duration::from_millis(5);
/// Longest wait when nothing wakes the reader: a followed replay file is
/// read again this often when inotify is unavailable, and without a wake
/// descriptor shutdown is noticed within this.
const FALLBACK_WAIT: Duration = Duration::from_millis(250);

/// Settings of the kernel log source (`[kmsg]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KmsgConfig {
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

impl KmsgConfig {
    /// Problems with the settings (empty when valid); keys relative to `[kmsg]`.
    pub fn validate(&self) -> Vec<String> {
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
        problems
    }
}

/// Errors of the kernel log source.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
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
pub struct KmsgSourceArgs {
    /// The `[kmsg]` section, flags applied.
    pub cfg: KmsgConfig,
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
    /// Liveness flags (`kmsg_alive`, `kmsg_caught_up`).
    pub liveness: Arc<Liveness>,
    /// Stops the source when triggered; wakes it at once when it waits.
    pub shutdown: Shutdown,
    /// Told when the source ends by itself (end of a replay with `exit_at_eof`).
    pub stop_tx: Option<Sender<StopReason>>,
}

/// Counts of one source run (returned when the thread ends).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KmsgSummary {
    /// Records processed (read and not skipped by the cursor).
    pub records: u64,
    /// Fault events handed to the engine.
    pub events: u64,
}

/// Starts [`run_source`] on a thread of its own (`gpuwatch-kmsg`).
pub fn spawn(
    args: KmsgSourceArgs,
    engine_tx: Sender<Input>,
) -> std::io::Result<std::thread::JoinHandle<KmsgSummary>> {
    std::thread::Builder::new()
        .name("gpuwatch-kmsg".into())
        .spawn(move || run_source(args, engine_tx))
}

/// The source loop (runs on the calling thread until shutdown, the engine
/// going away, or the end of a replay with `exit_at_eof`).
pub fn run_source(args: KmsgSourceArgs, engine_tx: Sender<Input>) -> KmsgSummary {
    let liveness = args.liveness.clone();
    let _alive = crate::pipeline::AliveGuard::set(&liveness.kmsg_alive);
    let stop_tx = args.stop_tx.clone();
    let mut src = Reader::new(args, engine_tx);
    let ended_by_eof = src.run();
    src.finish();
    if ended_by_eof && let Some(tx) = stop_tx {
        let _ = tx.send(StopReason::InputEnded);
    }
    src.summary
}

/// The engine side of the channel is gone.
#[derive(Debug)]
struct EngineGone;

/// Whether the reader goes on after a step (a batch of records, a wait).
enum Outcome {
    /// The engine is still there: read on.
    Continue,
    /// The engine is gone.
    EngineGone,
}

struct Reader {
    cfg: KmsgConfig,
    boot_id: String,
    registry: Arc<Registry>,
    liveness: Arc<Liveness>,
    shutdown: Shutdown,
    /// Readable once `shutdown` is triggered: in every `poll(2)` set, so a
    /// waiting reader stops at once. `None` when no pipe could be made
    /// (waits are then cut to [`FALLBACK_WAIT`]).
    wake: Option<WakeFd>,
    sender: FaultSender,
    scanner: Scanner,
    out: Vec<FaultEvent>,
    boot_time: u64,
    /// Last sequence number read (gap detection; on the device, records up to
    /// it are skipped: the saved cursor at start, everything read so far after
    /// a reopen).
    last_seq: Option<u64>,
    /// Every record up to this one was processed and the scanner holds none
    /// of their events (they were handed to the [`FaultSender`]).
    processed_seq: Option<u64>,
    /// Last position reported to the engine.
    reported_seq: Option<u64>,
    last_report: Instant,
    /// How long `finish` waits for room for held events.
    drain_timeout: Duration,
    summary: KmsgSummary,
    /// The input is a character device (a position, per-read records).
    device: bool,
    /// Delays between reopen attempts after a failed open or read.
    retry: gpuwatch_core::retry::Backoff,
    /// `sysconf(_SC_CLK_TCK)`, the unit of a process's start time.
    clock_ticks: u64,
}

impl Reader {
    fn new(args: KmsgSourceArgs, engine_tx: Sender<Input>) -> Reader {
        let device = is_device(&args.cfg.path);
        let resume_after = match args.resume.as_ref().filter(|_| device) {
            Some(p) if p.boot_id == args.boot_id => {
                tracing::info!(
                    last_seq = p.last_seq,
                    "Resuming the kernel log after the position in the health state."
                );
                Some(p.last_seq)
            }
            Some(p) => {
                tracing::info!(saved_boot = %p.boot_id, boot = %args.boot_id, "New boot: reading the whole kernel log ring.");
                None
            }
            None if device => {
                tracing::info!(
                    "No kernel log position in the health state: reading the whole ring."
                );
                None
            }
            None => None,
        };
        let args_retry_secs = args.cfg.retry_interval_secs;
        let wake = args
            .shutdown
            .wake_fd()
            .inspect_err(|e| {
                tracing::warn!(error = %e, "Cannot make the kernel-log reader's wake-up pipe; it looks for shutdown every 250 ms instead.");
            })
            .ok();
        Reader {
            sender: FaultSender::new(engine_tx, args.registry.clone()),
            scanner: Scanner::new(args.policy),
            clock_ticks: crate::attribution::clock_ticks_per_sec(),
            cfg: args.cfg,
            boot_id: args.boot_id,
            registry: args.registry,
            liveness: args.liveness,
            shutdown: args.shutdown,
            wake,
            out: Vec::new(),
            boot_time: boot::boot_time_unix_nanos(),
            last_seq: resume_after,
            processed_seq: resume_after,
            reported_seq: resume_after,
            last_report: Instant::now(),
            drain_timeout: Duration::from_secs(2),
            summary: KmsgSummary::default(),
            device,
            retry: gpuwatch_core::retry::Backoff::new(
                Duration::from_secs(args_retry_secs),
                Duration::from_secs(args_retry_secs.saturating_mul(8)),
            ),
        }
    }

    fn stopping(&self) -> bool {
        self.shutdown.is_triggered()
    }

    /// The input has been read to its current end once: faults logged before the
    /// agent started are known. Tells readiness and the engine (validation waits
    /// for it) the first time.
    fn mark_caught_up(&mut self) {
        if !self.liveness.kmsg_caught_up.swap(true, Ordering::Relaxed) {
            let _ = self.sender.send_control(Input::KmsgCaughtUp);
        }
    }

    /// Runs until shutdown / engine gone (false) or end of replay (true).
    fn run(&mut self) -> bool {
        loop {
            if self.stopping() {
                return false;
            }
            let file = match self.open() {
                Ok(f) => f,
                Err(e) => {
                    tracing::error!(error = %e, "Kernel log input is unavailable; retrying.");
                    if let SendStatus::Disconnected = self.report(false, e.to_string()) {
                        return false;
                    }
                    let delay = self.retry_delay();
                    self.sleep(delay);
                    continue;
                }
            };
            let reading = format!("reading {}", self.cfg.path.display());
            if let SendStatus::Disconnected = self.report(true, reading) {
                return false;
            }
            let result = if self.device {
                self.read_device(&file)
            } else {
                self.read_replay(&file)
            };
            match result {
                Ok(eof) => return eof,
                Err(e) => {
                    tracing::error!(error = %e, "Kernel log read failed; reopening.");
                    if let SendStatus::Disconnected = self.report(false, e.to_string()) {
                        return false;
                    }
                    let delay = self.retry_delay();
                    self.sleep(delay);
                }
            }
        }
    }

    /// Tells the engine (and readiness) whether the input can be read. Not
    /// readable counts as ready: the failure is reported (`kmsg_ok = false`,
    /// verdict `unknown`) instead of holding readiness back forever.
    fn report(&mut self, ok: bool, message: String) -> SendStatus {
        self.liveness.kmsg_unavailable.store(!ok, Ordering::Relaxed);
        self.sender.send_control(Input::MonitorStatus {
            input: MonitorInput::Kmsg,
            ok,
            message,
        })
    }

    /// The next retry delay: from the retry interval, doubling up to eight
    /// times it, jittered (a fleet whose nodes failed together does not retry
    /// in step); back to the interval after a successful read.
    fn retry_delay(&mut self) -> Duration {
        self.retry.next_delay()
    }

    /// Waits `d` before a retry; shutdown ends the wait at once.
    fn sleep(&self, d: Duration) {
        let deadline = Instant::now() + d;
        loop {
            // Waiting to retry is progress: the failure is reported, not stuck.
            self.heartbeat();
            let now = Instant::now();
            if now >= deadline
                || self
                    .shutdown
                    .wait_deadline(deadline.min(now + IDLE_HEARTBEAT))
            {
                return;
            }
        }
    }

    /// Waits until `fd` (when given) is readable, shutdown is triggered, or
    /// `timeout` passes, whichever comes first; then refreshes the boot time
    /// (the wall clock may have been stepped during a long wait).
    fn wait(&mut self, fd: Option<BorrowedFd<'_>>, timeout: Duration) {
        match (fd, &self.wake) {
            (None, _) => {
                self.shutdown.wait_timeout(timeout);
            }
            (Some(fd), Some(wake)) => {
                let mut fds = [
                    PollFd::new(fd, PollFlags::POLLIN),
                    PollFd::new(wake.as_fd(), PollFlags::POLLIN),
                ];
                // EINTR and other poll errors: the next read tells.
                let _ = poll(&mut fds, poll_timeout(timeout));
            }
            (Some(fd), None) => {
                let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
                let _ = poll(&mut fds, poll_timeout(timeout.min(FALLBACK_WAIT)));
            }
        }
        self.boot_time = boot::boot_time_unix_nanos();
    }

    fn open(&self) -> Result<File, KmsgError> {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&self.cfg.path)
            .map_err(|source| KmsgError::Open {
                path: self.cfg.path.clone(),
                source,
            })
    }

    /// One record per read. Returns Ok(false) at shutdown / engine gone.
    fn read_device(&mut self, file: &File) -> Result<bool, KmsgError> {
        let mut buf = vec![0u8; MIN_BUFFER];
        let mut reads_since_check = 0u32;
        // The first record read since the open ends a run of failures.
        let mut failing = true;
        let mut f = file;
        loop {
            match f.read(&mut buf) {
                Ok(0) => {
                    // /dev/kmsg never returns end of file (no record:
                    // EAGAIN); something else is at its path.
                    return Err(KmsgError::Eof {
                        path: self.cfg.path.clone(),
                    });
                }
                Ok(n) => {
                    if failing {
                        failing = false;
                        self.retry.reset();
                    }
                    let read_at = Instant::now();
                    if let Outcome::EngineGone = self.process(&buf[..n], Some(read_at)) {
                        return Ok(false);
                    }
                    reads_since_check += 1;
                    if reads_since_check >= 1024 {
                        reads_since_check = 0;
                        if self.stopping() {
                            return Ok(false);
                        }
                        self.heartbeat();
                        self.maybe_report_position();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.mark_caught_up();
                    if self.stopping() {
                        return Ok(false);
                    }
                    if let Outcome::EngineGone = self.idle(Some(file.as_fd())) {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                    // The ring overwrote unread records; the next read returns
                    // the oldest record and the sequence gap is counted there.
                    tracing::debug!("Kernel log ring overran the reader.");
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && buf.len() < MAX_BUFFER => {
                    let len = (buf.len() * 2).min(MAX_BUFFER);
                    tracing::debug!(
                        buffer = len,
                        "Kernel log record larger than the buffer; growing it."
                    );
                    buf.resize(len, 0);
                }
                Err(source) => {
                    return Err(KmsgError::Read {
                        path: self.cfg.path.clone(),
                        source,
                    });
                }
            }
        }
    }

    /// Kmsg-format lines from a file or FIFO. Ok(true) at end of input with
    /// `exit_at_eof`.
    fn read_replay(&mut self, file: &File) -> Result<bool, KmsgError> {
        let is_fifo = file
            .metadata()
            .map(|m| m.file_type().is_fifo())
            .unwrap_or(false);
        // Set up before the first read: a write after any read that found
        // the end leaves an event, so no write is ever missed.
        let growth = Growth::watch(&self.cfg.path);
        let mut buf = vec![0u8; REPLAY_CHUNK];
        let mut filled = 0usize;
        let mut seen_data = false;
        let mut f = file;
        loop {
            if self.stopping() {
                return Ok(false);
            }
            if filled == buf.len() {
                // A single line longer than the buffer: grow (bounded).
                if buf.len() >= MAX_BUFFER * 4 {
                    self.registry
                        .kmsg_records_malformed
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(bytes = filled, "Replay line too long; skipped.");
                    filled = 0;
                } else {
                    let len = buf.len() * 2;
                    buf.resize(len, 0);
                }
            }
            match f.read(&mut buf[filled..]) {
                Ok(0) => {
                    if is_fifo && !seen_data {
                        // No writer yet: not the end of the input.
                        if let Outcome::EngineGone = self.idle_replay(growth.as_ref()) {
                            return Ok(false);
                        }
                        continue;
                    }
                    // End of input: a last line without newline is complete
                    // now, when the input really ended (`exit_at_eof`, or the
                    // FIFO's writers closed it). A regular file that is still
                    // being written may end in the middle of a line: keep the
                    // part until the rest arrives.
                    if filled > 0 && (self.cfg.exit_at_eof || is_fifo) {
                        let line = buf[..filled].to_vec();
                        filled = 0;
                        if let Outcome::EngineGone = self.process_line(&line) {
                            return Ok(false);
                        }
                    }
                    self.mark_caught_up();
                    if self.cfg.exit_at_eof {
                        return Ok(true);
                    }
                    if let Outcome::EngineGone = self.idle_replay(growth.as_ref()) {
                        return Ok(false);
                    }
                }
                Ok(n) => {
                    seen_data = true;
                    filled += n;
                    let mut start = 0;
                    while let Some(pos) = memchr::memchr(b'\n', &buf[start..filled]) {
                        let end = start + pos;
                        if let Outcome::EngineGone = self.process_line_at(&buf, start, end) {
                            return Ok(false);
                        }
                        start = end + 1;
                    }
                    buf.copy_within(start..filled, 0);
                    filled -= start;
                    if self.sender.pending() > 0 && self.sender.flush() == SendStatus::Disconnected
                    {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // A FIFO with a writer attached: read to its current end.
                    self.mark_caught_up();
                    if let Outcome::EngineGone = self.idle(Some(file.as_fd())) {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(KmsgError::Read {
                        path: self.cfg.path.clone(),
                        source,
                    });
                }
            }
        }
    }

    fn process_line_at(&mut self, buf: &[u8], start: usize, end: usize) -> Outcome {
        let line = &buf[start..end];
        // Dictionary continuation lines and blank lines carry no record.
        if line.is_empty() || line[0] == b' ' {
            return Outcome::Continue;
        }
        // `process` wants the line without its newline; the caller's buffer is
        // borrowed immutably while `self` is borrowed mutably, which is fine
        // because `buf` is not part of `self`.
        self.process(line, READ_AT_PER_RECORD)
    }

    fn process_line(&mut self, line: &[u8]) -> Outcome {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        if line.is_empty() || line[0] == b' ' {
            return Outcome::Continue;
        }
        self.process(line, READ_AT_PER_RECORD)
    }

    /// How long an idle wait may last: short while events are held,
    /// otherwise until the next heartbeat is due.
    fn idle_wait(&self) -> Duration {
        if self.sender.pending() > 0 {
            RETRY_WAIT
        } else if self.scanner.has_pending() {
            HOLD_WAIT
        } else {
            IDLE_HEARTBEAT
        }
    }

    /// Idle work, then a wait for input on `input` (a pollable descriptor),
    /// for shutdown, or for the next thing due.
    fn idle(&mut self, input: Option<BorrowedFd<'_>>) -> Outcome {
        if let Outcome::EngineGone = self.idle_work() {
            return Outcome::EngineGone;
        }
        let wait = self.idle_wait();
        self.wait(input, wait);
        Outcome::Continue
    }

    /// Idle work for a replay at its end (a file or a FIFO without writer,
    /// which `poll(2)` cannot wait on): waits for `growth` to report a write,
    /// or without it [`FALLBACK_WAIT`] before reading again.
    fn idle_replay(&mut self, growth: Option<&Growth>) -> Outcome {
        let Some(growth) = growth else {
            if let Outcome::EngineGone = self.idle_work() {
                return Outcome::EngineGone;
            }
            let wait = self.idle_wait().min(FALLBACK_WAIT);
            self.wait(None, wait);
            return Outcome::Continue;
        };
        let outcome = self.idle(Some(growth.inotify.as_fd()));
        // Events from before the next read are consumed now: a write after
        // it leaves a fresh one.
        growth.drain();
        outcome
    }

    fn heartbeat(&self) {
        self.liveness.kmsg_heartbeat_unix_secs.store(
            gpuwatch_core::clock::unix_nanos(std::time::SystemTime::now()) / 1_000_000_000,
            Ordering::Relaxed,
        );
    }

    fn idle_work(&mut self) -> Outcome {
        self.heartbeat();
        if self.scanner.has_pending() {
            self.scanner
                .flush_expired(boot::monotonic_usec(), &mut self.out);
            if let Outcome::EngineGone = self.deliver(Instant::now()) {
                return Outcome::EngineGone;
            }
            if !self.scanner.has_pending() {
                self.processed_seq = self.last_seq;
            }
        }
        if self.sender.flush() == SendStatus::Disconnected {
            return Outcome::EngineGone;
        }
        if self.report_position().is_err() {
            return Outcome::EngineGone;
        }
        Outcome::Continue
    }

    /// One record (without trailing newline for replays; a full `/dev/kmsg`
    /// record with dictionary lines for the device).
    fn process(&mut self, record: &[u8], read_at: Option<Instant>) -> Outcome {
        let rec = match xid_parser::parse_kmsg_record(record) {
            Ok(r) => r,
            Err(e) => {
                self.registry
                    .kmsg_records_malformed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "Malformed kernel log record skipped.");
                return Outcome::Continue;
            }
        };
        let seq = rec.seq;
        // Device sequence numbers only grow within a boot: anything up to the
        // last record read was processed before (the saved cursor at start; a
        // reopen after a read error starts at the oldest record again).
        if self.device && self.last_seq.is_some_and(|done| seq <= done) {
            return Outcome::Continue;
        }
        self.registry
            .kmsg_records_read
            .fetch_add(1, Ordering::Relaxed);
        self.summary.records += 1;
        if let Some(last) = self.last_seq
            && seq > last.saturating_add(1)
        {
            let lost = seq - last - 1;
            if lost > MAX_PLAUSIBLE_GAP {
                // No ring holds that many records: a corrupt or edited
                // sequence number, not lost records.
                tracing::warn!(
                    after_seq = last,
                    next_seq = seq,
                    "Kernel log sequence number jumped implausibly far; not counted as lost records."
                );
            } else {
                self.registry
                    .kmsg_records_lost
                    .fetch_add(lost, Ordering::Relaxed);
                tracing::warn!(
                    lost,
                    after_seq = last,
                    next_seq = seq,
                    "Kernel log records were lost."
                );
            }
        }
        self.last_seq = Some(seq);
        let accepted = rec.facility == 0 || self.cfg.accept_user_facility;
        let pending = self.scanner.has_pending();
        // One prefilter pass on the raw, still escaped message bytes (a `\xNN`
        // escape could hide a marker, so a backslash passes too); only records
        // that pass are unescaped. The scanner checks the unescaped text again.
        let interesting = accepted && Scanner::interesting_line(rec.message);
        if interesting || (accepted && pending) {
            let meta = RecordMeta {
                seq: Some(seq),
                monotonic_usec: Some(rec.ts_usec),
                time_unix_nano: Some(boot::wall_time_unix_nanos(self.boot_time, rec.ts_usec)),
                facility: Some(rec.facility),
                level: Some(rec.level),
            };
            if interesting {
                let message = rec.message();
                self.scanner.push(meta, &message, &mut self.out);
            } else {
                // Not a fault line: it only ends the held event. The scanner
                // treats every message failing the prefilter alike, so the
                // unescaped text is not needed.
                self.scanner.push(meta, "", &mut self.out);
            }
            let read_at = read_at.unwrap_or_else(Instant::now);
            if let Outcome::EngineGone = self.deliver(read_at) {
                return Outcome::EngineGone;
            }
        } else if pending {
            self.scanner.flush_expired(rec.ts_usec, &mut self.out);
            if let Outcome::EngineGone = self.deliver(Instant::now()) {
                return Outcome::EngineGone;
            }
        }
        if !self.scanner.has_pending() {
            self.processed_seq = Some(seq);
        }
        Outcome::Continue
    }

    fn deliver(&mut self, read_at: Instant) -> Outcome {
        for mut ev in self.out.drain(..) {
            ev.set_source(Source::Kmsg);
            if ev.boot_id.is_empty() {
                ev.boot_id.clone_from(&self.boot_id);
            }
            ev.count = ev.count.max(1);
            if self.device && ev.pid.is_some() {
                crate::attribution::annotate(&mut ev, &self.cfg.proc_root, self.clock_ticks);
            }
            self.summary.events += 1;
            if self.sender.send(ev, read_at) == SendStatus::Disconnected {
                return Outcome::EngineGone;
            }
        }
        Outcome::Continue
    }

    fn maybe_report_position(&mut self) {
        if self.last_report.elapsed() >= Duration::from_millis(self.cfg.cursor_interval_ms) {
            // A gone engine is noticed by the next send.
            let _ = self.report_position();
        }
    }

    /// The exact position, when there is one: every record read so far had
    /// its events handed to the engine channel and nothing is held (by the
    /// scanner or the sender). `None` otherwise, or for a replay.
    fn exact_position(&self) -> Option<u64> {
        if !self.device || self.scanner.has_pending() || self.sender.pending() > 0 {
            return None;
        }
        self.last_seq
    }

    /// Tells the engine the exact position when it moved. Err when the engine
    /// is gone.
    fn report_position(&mut self) -> Result<(), EngineGone> {
        self.last_report = Instant::now();
        let Some(seq) = self.exact_position() else {
            return Ok(());
        };
        if self.reported_seq.is_some_and(|r| r >= seq) {
            return Ok(());
        }
        let progress = Input::KmsgProgress(KmsgPosition {
            boot_id: self.boot_id.clone(),
            last_seq: seq,
        });
        match self.sender.try_send_in_order(progress) {
            InOrder::Sent => self.reported_seq = Some(seq),
            InOrder::Deferred => {}
            InOrder::Disconnected => return Err(EngineGone),
        }
        Ok(())
    }

    /// End of the source: emit what the scanner holds, deliver, and report
    /// the final position when everything was delivered. Events the bounded
    /// drain could not deliver are not covered by any reported position, so
    /// the next start reads their records again.
    fn finish(&mut self) {
        self.scanner.finish(&mut self.out);
        let _ = self.deliver(Instant::now());
        let undelivered = self.sender.drain(self.drain_timeout);
        if self.sender.is_disconnected() || undelivered.is_some() {
            return;
        }
        if let Some(seq) = self.exact_position()
            && self.reported_seq.is_none_or(|r| seq > r)
        {
            let progress = Input::KmsgProgress(KmsgPosition {
                boot_id: self.boot_id.clone(),
                last_seq: seq,
            });
            if self
                .sender
                .send_in_order_timeout(progress, self.drain_timeout)
            {
                self.reported_seq = Some(seq);
            }
        }
    }
}

const READ_AT_PER_RECORD: Option<Instant> = None;

fn poll_timeout(d: Duration) -> PollTimeout {
    PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX)
}

/// Writes to a followed replay input (inotify `IN_MODIFY`): a reader at the
/// end of a file waits on this instead of reading again and again.
#[derive(Debug)]
struct Growth {
    inotify: Inotify,
}

impl Growth {
    /// A watch on `path`; `None` (logged) when inotify is unavailable.
    fn watch(path: &Path) -> Option<Growth> {
        let watched =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).and_then(|inotify| {
                inotify.add_watch(path, AddWatchFlags::IN_MODIFY)?;
                Ok(inotify)
            });
        match watched {
            Ok(inotify) => Some(Growth { inotify }),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "Cannot watch the replay input with inotify; reading it again every 250 ms.");
                None
            }
        }
    }

    /// Consumes the events queued so far.
    fn drain(&self) {
        while self
            .inotify
            .read_events()
            .is_ok_and(|events| !events.is_empty())
        {}
    }
}

/// True when `path` is a character device: the reader then keeps a
/// position (reports [`Input::KmsgProgress`]); a replay file or FIFO has none.
pub fn is_device(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(path == Path::new(KMSG_PATH))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{Receiver, bounded};
    use gpuwatch_proto::FaultKind;

    fn args(path: &Path, accept_user: bool, registry: Arc<Registry>) -> KmsgSourceArgs {
        KmsgSourceArgs {
            cfg: KmsgConfig {
                path: path.to_path_buf(),
                accept_user_facility: accept_user,
                exit_at_eof: true,
                ..KmsgConfig::default()
            },
            resume: None,
            boot_id: "boot-1".into(),
            policy: Arc::new(xid_parser::Policy::default()),
            registry,
            liveness: Liveness::new(),
            shutdown: Shutdown::new(),
            stop_tx: None,
        }
    }

    fn faults(rx: &Receiver<Input>) -> Vec<FaultEvent> {
        rx.try_iter()
            .filter_map(|i| match i {
                Input::Fault { event, .. } => Some(event),
                _ => None,
            })
            .collect()
    }

    const XID_KERN: &str = "4,10,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";

    #[test]
    fn replay_file_turns_kern_records_into_events_and_counts_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("replay.kmsg");
        let text = [
            "6,7,4000000,-;eth0: link up",
            " SUBSYSTEM=net",
            "this is not a kmsg record",
            XID_KERN,
            // Facility user (PRI 12 = 1*8+4): ignored without accept_user_facility.
            "12,11,5000100,-;NVRM: Xid (PCI:0000:5e:00): 79, pid=1, name=x, GPU has fallen off the bus.",
            // Gap: 12..=14 never arrived.
            "6,15,6000000,-;usb 1-1: new device",
            // Last line without a newline is complete at EOF.
            "4,16,7000000,-;NVRM: Xid (PCI:0000:86:00): 13, pid=9, name=app, Graphics SM Warp Exception",
        ]
        .join("\n");
        std::fs::write(&p, text).unwrap();
        let reg = Registry::new();
        let (tx, rx) = bounded(64);
        let a = args(&p, false, reg.clone());
        let liveness = a.liveness.clone();
        let summary = run_source(a, tx);
        assert!(liveness.kmsg_caught_up.load(Ordering::Relaxed));
        assert!(
            !liveness.kmsg_alive.load(Ordering::Relaxed),
            "cleared at exit"
        );
        let evs = faults(&rx);
        let got: Vec<(String, u32)> = evs
            .iter()
            .map(|e| (e.pci_address.clone(), e.code))
            .collect();
        assert_eq!(
            got,
            vec![
                ("0000:3b:00.0".to_string(), 79),
                ("0000:86:00.0".to_string(), 13)
            ]
        );
        let ev = &evs[0];
        assert_eq!(ev.kind(), FaultKind::Xid);
        assert_eq!(ev.source(), Source::Kmsg);
        assert_eq!(ev.boot_id, "boot-1");
        assert_eq!(ev.kmsg_seq, Some(10));
        assert_eq!(ev.monotonic_usec, Some(5_000_000));
        let want = boot::wall_time_unix_nanos(boot::boot_time_unix_nanos(), 5_000_000);
        let got = ev.time_unix_nano.expect("wall time set");
        assert!(got.abs_diff(want) < 1_000_000_000, "{got} vs {want}");
        assert_eq!(summary.records, 5);
        assert_eq!(reg.kmsg_records_read.load(Ordering::Relaxed), 5);
        assert_eq!(reg.kmsg_records_malformed.load(Ordering::Relaxed), 1);
        // 8, 9 between 7 and 10; 12, 13, 14 between 11 and 15.
        assert_eq!(reg.kmsg_records_lost.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn user_facility_raises_faults_only_when_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("replay.kmsg");
        std::fs::write(
            &p,
            "12,1,100,-;NVRM: Xid (PCI:0000:5e:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
        )
        .unwrap();
        for (accept, want) in [(false, 0), (true, 1)] {
            let (tx, rx) = bounded(8);
            run_source(args(&p, accept, Registry::new()), tx);
            assert_eq!(faults(&rx).len(), want, "accept_user_facility={accept}");
        }
    }

    #[test]
    fn fifo_is_read_until_the_writer_closes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kmsg.fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let (tx, rx) = bounded(64);
        let a = args(&p, false, Registry::new());
        let reader = std::thread::spawn(move || run_source(a, tx));
        // Opening for write blocks until the reader has opened the FIFO.
        let mut w = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        use std::io::Write;
        for i in 0..100u32 {
            writeln!(w, "6,{i},{i},-;filler line {i}").unwrap();
        }
        writeln!(w, "{XID_KERN}").unwrap();
        drop(w);
        let summary = reader.join().unwrap();
        assert_eq!(summary.records, 101);
        assert_eq!(faults(&rx).len(), 1);
    }

    /// A followed regular file (no `exit_at_eof`) that ends in the middle of
    /// a line: the part is kept until the rest is appended, not processed as
    /// a record of its own (which cut the message and made the rest malformed).
    #[test]
    fn a_followed_file_ending_mid_line_waits_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("growing.kmsg");
        let (head, tail) = XID_KERN.split_at(XID_KERN.find("GPU has").unwrap());
        std::fs::write(&p, format!("6,9,4000000,-;eth0: link up\n{head}")).unwrap();
        let reg = Registry::new();
        let mut a = args(&p, false, reg.clone());
        a.cfg.exit_at_eof = false;
        let (liveness, shutdown) = (a.liveness.clone(), a.shutdown.clone());
        let (tx, rx) = bounded(8);
        let h = std::thread::spawn(move || run_source(a, tx));
        // Caught up = the reader hit the end of the file once.
        let t0 = Instant::now();
        while !liveness.kmsg_caught_up.load(Ordering::Relaxed) {
            assert!(t0.elapsed() < Duration::from_secs(10), "never caught up");
            std::thread::yield_now();
        }
        assert_eq!(reg.kmsg_records_read.load(Ordering::Relaxed), 1);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        use std::io::Write;
        writeln!(f, "{tail}").unwrap();
        drop(f);
        let event = loop {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Input::Fault { event, .. }) => break event,
                Ok(_) => {}
                Err(e) => panic!("no fault event: {e}"),
            }
        };
        shutdown.trigger();
        h.join().unwrap();
        assert_eq!((event.code, event.kmsg_seq), (79, Some(10)));
        assert!(
            event.message.ends_with("GPU has fallen off the bus."),
            "{}",
            event.message
        );
        assert_eq!(reg.kmsg_records_read.load(Ordering::Relaxed), 2);
        assert_eq!(reg.kmsg_records_malformed.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn full_engine_channel_coalesces_instead_of_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("storm.kmsg");
        let mut text = String::new();
        for i in 0..50 {
            text.push_str(&format!(
                "4,{i},{},-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=app, MMU Fault: ENGINE GRAPHICS\n",
                i * 1000
            ));
        }
        std::fs::write(&p, text).unwrap();
        let reg = Registry::new();
        // Room for one event; nobody drains until the source ends.
        let (tx, rx) = bounded(1);
        let drain_rx = rx.clone();
        let handle = std::thread::spawn({
            let a = args(&p, false, reg.clone());
            move || run_source(a, tx)
        });
        // The source must finish by itself (it never blocks on the channel)
        // apart from the final bounded drain, which this receiver serves.
        let mut got = Vec::new();
        while let Ok(i) = drain_rx.recv_timeout(Duration::from_secs(10)) {
            got.push(i);
        }
        handle.join().unwrap();
        let total: u32 = got
            .iter()
            .filter_map(|i| match i {
                Input::Fault { event, .. } => Some(event.count.max(1)),
                _ => None,
            })
            .sum();
        assert_eq!(total, 50, "every occurrence accounted for");
        assert_eq!(
            reg.events(
                gpuwatch_core::Stage::Parser,
                gpuwatch_core::Outcome::Dropped
            ),
            0
        );
    }

    /// A reader that treats its input as the kernel device, without opening
    /// anything: records are fed to `process`.
    fn device_reader(tx: Sender<Input>, registry: Arc<Registry>) -> Reader {
        let a = args(Path::new("/nonexistent/kmsg"), true, registry);
        let mut r = Reader::new(a, tx);
        r.device = true;
        r.drain_timeout = Duration::from_millis(10);
        r
    }

    fn record(seq: u64, fault: bool) -> String {
        if fault {
            format!(
                "4,{seq},{},-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
                seq * 1000
            )
        } else {
            format!("6,{seq},{},-;usb 1-1: new device {seq}\n", seq * 1000)
        }
    }

    /// What reached the engine channel: `Some(seq)` per fault event (its
    /// `kmsg_seq`), `None` per position report with its sequence number.
    fn drained(rx: &Receiver<Input>) -> Vec<(char, u64)> {
        rx.try_iter()
            .filter_map(|i| match i {
                Input::Fault { event, .. } => Some(('F', event.kmsg_seq.unwrap_or(0))),
                Input::KmsgProgress(p) => Some(('P', p.last_seq)),
                _ => None,
            })
            .collect()
    }

    /// The position travels in the channel after the events of the records
    /// it covers, and only when nothing is held: the engine's state then
    /// holds exactly the faults of the records up to it.
    #[test]
    fn position_follows_the_events_it_covers() {
        let (tx, rx) = bounded(64);
        let mut r = device_reader(tx, Registry::new());
        for seq in 1..=3 {
            r.process(record(seq, false).as_bytes(), None);
        }
        r.report_position().unwrap();
        assert_eq!(drained(&rx), vec![('P', 3)], "no fault: the position moves");
        for seq in 4..=8 {
            r.process(record(seq, seq == 5 || seq == 7).as_bytes(), None);
        }
        r.report_position().unwrap();
        assert_eq!(drained(&rx), vec![('F', 5), ('F', 7), ('P', 8)]);
        r.report_position().unwrap();
        assert_eq!(drained(&rx), vec![], "unchanged: not reported again");
    }

    /// A fault held for room in the engine channel keeps the position from
    /// being reported until it is delivered.
    #[test]
    fn no_position_while_an_event_is_held_for_room() {
        let (tx, rx) = bounded(1);
        tx.send(Input::Tick).unwrap(); // the engine channel is full
        let mut r = device_reader(tx, Registry::new());
        for seq in 1..=5 {
            let rec = record(seq, seq == 3);
            assert!(matches!(r.process(rec.as_bytes(), None), Outcome::Continue));
        }
        assert_eq!(r.sender.pending(), 1, "the fault of seq 3 is held");
        assert_eq!(r.exact_position(), None);
        assert!(matches!(rx.try_recv(), Ok(Input::Tick)));
        assert_eq!(r.sender.flush(), SendStatus::Accepted);
        assert_eq!(r.exact_position(), Some(5));
        r.report_position().unwrap();
        // Room for one at a time: the fault went with the flush, the
        // position waits for the next report.
        assert_eq!(drained(&rx), vec![('F', 3)]);
        r.report_position().unwrap();
        assert_eq!(drained(&rx), vec![('P', 5)]);
    }

    /// At shutdown the final position is reported only when every event was
    /// delivered; otherwise the records are read again at the next start.
    #[test]
    fn finish_reports_the_position_only_after_delivering_everything() {
        let reg = Registry::new();
        let (tx, rx) = bounded(1);
        tx.send(Input::Tick).unwrap(); // full; nobody drains
        let mut r = device_reader(tx, reg.clone());
        for seq in 10..=14 {
            r.process(record(seq, seq == 12).as_bytes(), None);
        }
        r.finish();
        assert!(matches!(rx.try_recv(), Ok(Input::Tick)));
        assert_eq!(drained(&rx), vec![], "nothing delivered, no position");
        assert_eq!(
            reg.events(
                gpuwatch_core::Stage::Parser,
                gpuwatch_core::Outcome::Dropped
            ),
            1
        );

        let (tx, rx2) = bounded(8);
        let mut r = device_reader(tx, Registry::new());
        for seq in 10..=14 {
            r.process(record(seq, seq == 12).as_bytes(), None);
        }
        r.finish();
        assert_eq!(drained(&rx2), vec![('F', 12), ('P', 14)]);
    }

    #[test]
    fn an_implausible_sequence_jump_is_not_counted_as_lost_records() {
        let reg = Registry::new();
        let (tx, _rx) = bounded(8);
        let mut r = device_reader(tx, reg.clone());
        r.process(record(1, false).as_bytes(), None);
        r.process(record(5, false).as_bytes(), None);
        assert_eq!(reg.kmsg_records_lost.load(Ordering::Relaxed), 3);
        r.process(record(u64::MAX / 1000, false).as_bytes(), None);
        assert_eq!(reg.kmsg_records_lost.load(Ordering::Relaxed), 3);
    }

    /// A replay (file or FIFO) has no position: nothing to resume after.
    #[test]
    fn a_replay_reports_no_position() {
        let (tx, rx) = bounded(8);
        let mut r = device_reader(tx, Registry::new());
        r.device = false;
        r.process(record(1, true).as_bytes(), None);
        r.report_position().unwrap();
        r.finish();
        assert_eq!(drained(&rx), vec![('F', 1)]);
    }

    /// The engine's position is where a device reader of the same boot
    /// resumes; another boot's position is ignored.
    #[test]
    fn resumes_after_the_position_of_the_same_boot_only() {
        let mk = |boot: &str| {
            let (tx, _rx) = bounded::<Input>(8);
            let mut a = args(Path::new("/dev/kmsg"), true, Registry::new());
            a.resume = Some(KmsgPosition {
                boot_id: boot.into(),
                last_seq: 41,
            });
            Reader::new(a, tx).last_seq
        };
        assert_eq!(mk("boot-1"), Some(41));
        assert_eq!(mk("another-boot"), None);
    }

    /// After a reopen the device starts at the oldest record again; records
    /// already read must be skipped, not only those before the startup
    /// position.
    #[test]
    fn reopen_after_a_read_error_skips_records_already_read() {
        let (tx, rx) = bounded(64);
        let mut r = device_reader(tx, Registry::new());
        for seq in 1..=3 {
            r.process(record(seq, seq == 2).as_bytes(), None);
        }
        // The reopened device replays the ring from its oldest record.
        for seq in 1..=4 {
            r.process(record(seq, seq == 2 || seq == 4).as_bytes(), None);
        }
        assert_eq!(r.summary.records, 4, "each record processed once");
        let seqs: Vec<Option<u64>> = faults(&rx).iter().map(|e| e.kmsg_seq).collect();
        assert_eq!(seqs, vec![Some(2), Some(4)]);
    }

    #[test]
    fn a_marker_hidden_by_an_escape_still_reaches_the_scanner() {
        // `\x4e` is `N`, `\x58` is `X`: escaped, the record has no fault marker.
        let line = r"4,1,100,-;\x4eVRM: \x58id (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.";
        assert!(!Scanner::interesting(line.as_bytes()));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("escaped.kmsg");
        std::fs::write(&p, format!("{line}\n")).unwrap();
        let (tx, rx) = bounded(8);
        run_source(args(&p, false, Registry::new()), tx);
        let evs = faults(&rx);
        assert_eq!(evs.len(), 1, "{evs:?}");
        assert_eq!(evs[0].code, 79);
    }

    #[test]
    fn unreadable_input_is_reported_and_counts_as_ready() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(&dir.path().join("missing"), false, Registry::new());
        a.cfg.retry_interval_secs = 1;
        let liveness = a.liveness.clone();
        let shutdown = a.shutdown.clone();
        let (tx, rx) = bounded(8);
        let h = std::thread::spawn(move || run_source(a, tx));
        let status = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a monitor status");
        assert!(
            matches!(&status, Input::MonitorStatus { input: MonitorInput::Kmsg, ok: false, message } if message.contains("missing")),
            "{status:?}"
        );
        assert!(liveness.kmsg_unavailable.load(Ordering::Relaxed));
        assert!(!liveness.kmsg_caught_up.load(Ordering::Relaxed));
        liveness.engine_alive.store(true, Ordering::Relaxed);
        liveness.state_loaded.store(true, Ordering::Relaxed);
        assert!(
            liveness.ready(),
            "ready: the failure is reported, not hidden"
        );

        // The input appears: it is read, and readiness waits for the pass.
        let tmp = dir.path().join("tmp");
        std::fs::write(&tmp, format!("{XID_KERN}\n")).unwrap();
        std::fs::rename(&tmp, dir.path().join("missing")).unwrap();
        let mut saw_ok = false;
        while let Ok(i) = rx.recv_timeout(Duration::from_secs(10)) {
            match i {
                Input::MonitorStatus { ok: true, .. } => saw_ok = true,
                Input::Fault { .. } => break,
                _ => {}
            }
        }
        assert!(saw_ok);
        assert!(!liveness.kmsg_unavailable.load(Ordering::Relaxed));
        shutdown.trigger();
        h.join().unwrap();
        drop(rx);
    }

    /// Waits (at most 10 s) until the reader has read its input to the end
    /// once and gone idle.
    fn wait_caught_up(liveness: &Liveness) {
        let t0 = Instant::now();
        while !liveness.kmsg_caught_up.load(Ordering::Relaxed) {
            assert!(t0.elapsed() < Duration::from_secs(10), "never caught up");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Triggers `shutdown` and asserts the reader thread ends within a
    /// second (its idle wait is 30 s; the retry wait below is a minute).
    fn stops_at_once(shutdown: &Shutdown, h: std::thread::JoinHandle<KmsgSummary>) {
        // Let the reader settle into its wait.
        std::thread::sleep(Duration::from_millis(200));
        assert!(!h.is_finished(), "the reader ended by itself");
        shutdown.trigger();
        gpuwatch_core::join_by(h, Instant::now() + Duration::from_secs(1))
            .expect("the reader kept waiting after shutdown")
            .unwrap();
    }

    /// Idle at the end of a followed file (waiting for it to be written):
    /// shutdown ends the wait at once, and the idle reader has kept its
    /// liveness heartbeat.
    #[test]
    fn an_idle_reader_of_a_followed_file_stops_at_once_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("idle.kmsg");
        std::fs::write(&p, "6,1,100,-;eth0: link up\n").unwrap();
        let mut a = args(&p, false, Registry::new());
        a.cfg.exit_at_eof = false;
        let (liveness, shutdown) = (a.liveness.clone(), a.shutdown.clone());
        let (tx, _rx) = bounded(8);
        let h = std::thread::spawn(move || run_source(a, tx));
        wait_caught_up(&liveness);
        stops_at_once(&shutdown, h);
        assert!(liveness.kmsg_heartbeat_unix_secs.load(Ordering::Relaxed) > 0);
    }

    /// Idle in `poll(2)` on an input with nothing to read (a FIFO with a
    /// writer attached, polled like `/dev/kmsg`): shutdown wakes the poll.
    #[test]
    fn an_idle_reader_in_poll_stops_at_once_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kmsg.fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let mut a = args(&p, false, Registry::new());
        a.cfg.exit_at_eof = false;
        let (liveness, shutdown) = (a.liveness.clone(), a.shutdown.clone());
        let (tx, _rx) = bounded(8);
        let h = std::thread::spawn(move || run_source(a, tx));
        let mut w = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        use std::io::Write;
        writeln!(w, "6,1,100,-;eth0: link up").unwrap();
        wait_caught_up(&liveness);
        stops_at_once(&shutdown, h);
        drop(w);
    }

    /// Waiting a minute to retry an input that cannot be opened: shutdown
    /// ends the wait at once.
    #[test]
    fn a_reader_waiting_to_retry_stops_at_once_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(&dir.path().join("missing"), false, Registry::new());
        a.cfg.retry_interval_secs = 60;
        let shutdown = a.shutdown.clone();
        let (tx, rx) = bounded(8);
        let h = std::thread::spawn(move || run_source(a, tx));
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(10)),
            Ok(Input::MonitorStatus { ok: false, .. })
        ));
        stops_at_once(&shutdown, h);
    }

    /// A followed input is read as soon as it is written, file or FIFO
    /// without a writer yet: the reader waits for the write (inotify), not
    /// for a timer (it would wait 30 s for its heartbeat).
    #[test]
    fn a_followed_input_is_read_as_soon_as_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("followed.kmsg");
        std::fs::write(&file, "").unwrap();
        let fifo = dir.path().join("followed.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for p in [file, fifo] {
            let mut a = args(&p, false, Registry::new());
            a.cfg.exit_at_eof = false;
            let (liveness, shutdown) = (a.liveness.clone(), a.shutdown.clone());
            let (tx, rx) = bounded(8);
            let h = std::thread::spawn(move || run_source(a, tx));
            if p.ends_with("followed.kmsg") {
                wait_caught_up(&liveness);
            }
            // Let the reader settle into its wait.
            std::thread::sleep(Duration::from_millis(200));
            let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
            use std::io::Write;
            writeln!(f, "{XID_KERN}").unwrap();
            let t0 = Instant::now();
            let got = loop {
                match rx.recv_timeout(Duration::from_secs(20)) {
                    Ok(Input::Fault { event, .. }) => break event.code,
                    Ok(_) => {}
                    Err(e) => panic!("{}: no fault event: {e}", p.display()),
                }
            };
            assert_eq!(got, 79);
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{}: read {:?} after the write",
                p.display(),
                t0.elapsed()
            );
            shutdown.trigger();
            h.join().unwrap();
            drop(f);
        }
    }

    /// Idle, the reader wakes only for its heartbeat, often enough that a
    /// late wake-up never makes `/healthz` call it stuck; held events keep
    /// the short waits.
    #[test]
    fn idle_waits_are_bounded_by_the_heartbeat() {
        use crate::pipeline::PROGRESS_DEADLINE_SECS;
        assert!(IDLE_HEARTBEAT * 2 < Duration::from_secs(PROGRESS_DEADLINE_SECS));
        let (tx, _rx) = bounded(1);
        let mut r = device_reader(tx, Registry::new());
        assert_eq!(r.idle_wait(), IDLE_HEARTBEAT);
        // A GSP RPC timeout is held for the history dump that follows it: its
        // window must expire on time.
        let line = "4,1,100,-;NVRM: Xid (PCI:0000:3b:00): 119, pid=1, name=x, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).";
        let _ = r.process(line.as_bytes(), None);
        assert!(r.scanner.has_pending());
        assert_eq!(r.idle_wait(), HOLD_WAIT);
    }

    #[test]
    fn config_validation_names_keys() {
        let bad = KmsgConfig {
            path: PathBuf::new(),
            cursor_interval_ms: 0,
            retry_interval_secs: 0,
            ..KmsgConfig::default()
        };
        let p = bad.validate();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("path:"));
        assert!(KmsgConfig::default().validate().is_empty());
    }
}
