//! The reader: its state, the open / read / reopen loop, and the waits
//! between reads.

use super::{KmsgError, KmsgSettings, KmsgSourceArgs, KmsgSummary, is_device};
use crate::boot;
use crate::input::InputContext;
use crate::liveness::IDLE_HEARTBEAT;
use crate::pipeline::{FaultSender, SendStatus};
use gpuwatch_core::heartbeat::Progress;
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_core::{Registry, Shutdown, WakeFd};
use gpuwatch_proto::FaultEvent;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xid_parser::Scanner;

/// Wait while the scanner holds a multi-record event (its window expires
/// on time).
pub(super) const HOLD_WAIT: Duration = Duration::from_millis(10);
/// Wait while the sender holds events for lack of room in the engine channel.
const RETRY_WAIT: Duration = Duration::from_millis(5);
/// Longest wait when nothing wakes the reader: a followed replay file is
/// read again this often when inotify is unavailable, and without a wake
/// descriptor shutdown is noticed within this.
pub(super) const FALLBACK_WAIT: Duration = Duration::from_millis(250);

/// The engine side of the channel is gone.
#[derive(Debug)]
pub(super) struct EngineGone;

/// Whether the reader goes on after a step (a batch of records, a wait).
pub(super) enum ReadOn {
    /// The engine is still there: read on.
    Continue,
    /// The engine is gone.
    EngineGone,
}

pub(super) struct Reader {
    pub(super) cfg: KmsgSettings,
    pub(super) boot_id: String,
    pub(super) registry: Arc<Registry>,
    /// The reader told the engine it read its input to the end once
    /// ([`Input::KmsgCaughtUp`] goes out once).
    caught_up: bool,
    /// The reader's heartbeat (its context's), held to
    /// [`PROGRESS_DEADLINE`](crate::liveness::PROGRESS_DEADLINE) by `/healthz`.
    pub(super) progress: Arc<Progress>,
    pub(super) shutdown: Shutdown,
    /// Readable once `shutdown` is triggered: in every `poll(2)` set, so a
    /// waiting reader stops at once. `None` when no pipe could be made
    /// (waits are then cut to [`FALLBACK_WAIT`]).
    wake: Option<WakeFd>,
    pub(super) sender: FaultSender,
    pub(super) scanner: Scanner,
    pub(super) out: Vec<FaultEvent>,
    pub(super) boot_time: u64,
    /// Last sequence number read (gap detection; on the device, records up to
    /// it are skipped: the saved cursor at start, everything read so far after
    /// a reopen).
    pub(super) last_seq: Option<u64>,
    /// Every record up to this one was processed and the scanner holds none
    /// of their events (they were handed to the [`FaultSender`]).
    pub(super) processed_seq: Option<u64>,
    /// Last position reported to the engine.
    pub(super) reported_seq: Option<u64>,
    pub(super) last_report: Instant,
    /// How long `finish` waits for room for held events.
    pub(super) drain_timeout: Duration,
    pub(super) summary: KmsgSummary,
    /// The input is a character device (a position, per-read records).
    pub(super) device: bool,
    /// Delays between reopen attempts after a failed open or read.
    pub(super) retry: gpuwatch_core::retry::Backoff,
    /// `sysconf(_SC_CLK_TCK)`, the unit of a process's start time.
    pub(super) clock_ticks: u64,
    /// Events the engine emitted and handed back, for the scanner to refill.
    pub(super) spent: Option<gpuwatch_core::msg::SpentReceiver>,
}

impl Reader {
    pub(super) fn new(args: KmsgSourceArgs, ctx: InputContext) -> Reader {
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
        let retry_interval = args.cfg.retry_interval;
        let wake = ctx
            .shutdown()
            .wake_fd()
            .inspect_err(|e| {
                tracing::warn!(error = %e, "Cannot make the kernel-log reader's wake-up pipe; it looks for shutdown every 250 ms instead.");
            })
            .ok();
        Reader {
            sender: FaultSender::new(ctx.out().clone(), args.registry.clone()),
            scanner: Scanner::new(args.policy),
            clock_ticks: crate::attribution::clock_ticks_per_sec(),
            spent: args.spent,
            cfg: args.cfg,
            boot_id: args.boot_id,
            registry: args.registry,
            caught_up: false,
            progress: ctx.progress().clone(),
            shutdown: ctx.shutdown().clone(),
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
                retry_interval,
                retry_interval.saturating_mul(8),
            ),
        }
    }

    pub(super) fn stopping(&self) -> bool {
        self.shutdown.is_triggered()
    }

    /// The input has been read to its current end once: faults logged before the
    /// agent started are known. Tells the engine the first time: its monitor
    /// status is where readiness and validation read it.
    pub(super) fn mark_caught_up(&mut self) {
        if !std::mem::replace(&mut self.caught_up, true) {
            let _ = self.sender.send_control(Input::KmsgCaughtUp);
        }
    }

    /// Runs until shutdown / engine gone (false) or end of replay (true).
    pub(super) fn run(&mut self) -> bool {
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

    /// Tells the engine whether the input can be read; readiness reads it
    /// from the engine's monitor status. Not readable counts as ready: the
    /// failure is reported (the `kmsg` input down, verdict `unknown`) instead
    /// of holding readiness back forever.
    fn report(&mut self, ok: bool, message: String) -> SendStatus {
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
    pub(super) fn wait(&mut self, fd: Option<BorrowedFd<'_>>, timeout: Duration) {
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

    /// How long an idle wait may last: short while events are held,
    /// otherwise until the next heartbeat is due.
    pub(super) fn idle_wait(&self) -> Duration {
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
    pub(super) fn idle(&mut self, input: Option<BorrowedFd<'_>>) -> ReadOn {
        if let ReadOn::EngineGone = self.idle_work() {
            return ReadOn::EngineGone;
        }
        let wait = self.idle_wait();
        self.wait(input, wait);
        ReadOn::Continue
    }

    pub(super) fn heartbeat(&self) {
        self.progress.beat();
    }

    pub(super) fn idle_work(&mut self) -> ReadOn {
        self.heartbeat();
        if self.scanner.has_pending() {
            self.scanner
                .flush_expired(boot::monotonic_usec(), &mut self.out);
            if let ReadOn::EngineGone = self.deliver(Instant::now()) {
                return ReadOn::EngineGone;
            }
            if !self.scanner.has_pending() {
                self.processed_seq = self.last_seq;
            }
        }
        if self.sender.flush() == SendStatus::Disconnected {
            return ReadOn::EngineGone;
        }
        if self.report_position().is_err() {
            return ReadOn::EngineGone;
        }
        ReadOn::Continue
    }
}

fn poll_timeout(d: Duration) -> PollTimeout {
    PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX)
}
