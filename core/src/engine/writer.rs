//! The state-file writer thread (`gpuwatch-state`): [`run_engine`](super::run_engine)
//! hands it each settled snapshot and goes on handling inputs while the
//! snapshot is encoded, written, fsynced and renamed into place.
//!
//! A state write takes 0.5–5 ms on a healthy disk (two fsyncs) and can block
//! for as long as the storage does (a full or hung volume, a slow network
//! disk). On the engine thread that time delayed every event queued behind
//! it, and a hung disk stopped fault handling altogether. Here the engine
//! only builds the snapshot (an in-memory copy) and puts it in a one-slot
//! mailbox: a snapshot not yet started is replaced by a newer one (each is a
//! complete settled state, so the newest supersedes the older), and the
//! results come back to the engine, which reports and retries failures as
//! before. One thread writes, so snapshots reach the disk in order.

use crate::statefile::StateFileError;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The outcome of one write, for the engine.
pub(crate) type WriteDone = Result<(), StateFileError>;

struct Slot<T> {
    /// The next snapshot to write (not started yet).
    job: Option<(PathBuf, T)>,
    /// A snapshot is being written now.
    busy: bool,
    done: Vec<WriteDone>,
    closed: bool,
}

struct GuardedSlot<T> {
    slot: Mutex<Slot<T>>,
    changed: Condvar,
}

impl<T> GuardedSlot<T> {
    fn lock(&self) -> MutexGuard<'_, Slot<T>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Handle of the writer thread, which writes snapshots of type `T` (the
/// engine's: its state file) as JSON; dropping it lets the thread finish
/// what it holds and end (it is not joined: a hung disk must not hang the
/// caller).
pub(crate) struct StateWriter<T> {
    shared: Arc<GuardedSlot<T>>,
}

impl<T: Serialize + Send + 'static> StateWriter<T> {
    /// Starts the `gpuwatch-state` thread; fails only when the OS cannot
    /// start a thread (the engine then writes on its own thread).
    pub(super) fn spawn() -> std::io::Result<StateWriter<T>> {
        let shared = Arc::new(GuardedSlot {
            slot: Mutex::new(Slot {
                job: None,
                busy: false,
                done: Vec::new(),
                closed: false,
            }),
            changed: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("gpuwatch-state".into())
            .spawn(move || run(&worker))?;
        Ok(StateWriter { shared })
    }

    /// Queues `file` for writing to `path`, replacing a snapshot that has not
    /// been started.
    pub(super) fn submit(&self, path: PathBuf, file: T) {
        self.shared.lock().job = Some((path, file));
        self.shared.changed.notify_all();
    }

    /// Outcomes of the writes finished since the last call, in order.
    pub(super) fn take_done(&self) -> Vec<WriteDone> {
        std::mem::take(&mut self.shared.lock().done)
    }

    /// Waits until nothing is queued or being written, at most `timeout`;
    /// false when the writer is still busy then (a hung disk).
    pub(super) fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut slot = self.shared.lock();
        while slot.job.is_some() || slot.busy {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            slot = self
                .shared
                .changed
                .wait_timeout(slot, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl<T> Drop for StateWriter<T> {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

fn run<T: Serialize>(shared: &GuardedSlot<T>) {
    loop {
        let (path, file) = {
            let mut slot = shared.lock();
            loop {
                if let Some(job) = slot.job.take() {
                    slot.busy = true;
                    break job;
                }
                if slot.closed {
                    return;
                }
                slot = shared.changed.wait(slot).unwrap_or_else(|e| e.into_inner());
            }
        };
        let result = crate::statefile::write_json(&path, &file);
        drop(file);
        let mut slot = shared.lock();
        slot.busy = false;
        slot.done.push(result);
        drop(slot);
        shared.changed.notify_all();
    }
}
