//! The stop signal of the agent's threads, one that a waiting thread can
//! sleep on.
//!
//! A thread that waits (for its next poll, for input, for a retry) sleeps
//! until its next real deadline and is woken the moment the signal is
//! triggered: no thread wakes up periodically only to look at a flag, and
//! stopping is not delayed by any sleep in progress.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::convert::Infallible;
use std::fmt;
use std::io::{PipeReader, PipeWriter};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A one-way stop signal; clones share it. Once triggered it stays triggered.
///
/// Five ways to wait on it:
/// - [`Shutdown::wait_timeout`] / [`Shutdown::wait_deadline`]: a sleep that
///   ends early when the signal is triggered;
/// - [`Shutdown::triggered`]: a future that completes when the signal is
///   triggered, for async tasks (`tokio::select!` with their other inputs);
/// - [`Shutdown::receiver`]: a channel that never carries a message and is
///   disconnected when the signal is triggered, to wait in
///   `crossbeam_channel::select!` together with other channels;
/// - [`Shutdown::wake_fd`]: a file descriptor that becomes readable when the
///   signal is triggered, to wait in `poll(2)` together with other
///   descriptors;
/// - [`Shutdown::on_trigger`]: a function run when the signal is triggered,
///   to wake a thread blocked elsewhere (a `Condvar` wait).
#[derive(Clone)]
pub struct Shutdown {
    inner: Arc<ShutdownState>,
}

struct ShutdownState {
    triggered: AtomicBool,
    /// The only sender of `rx`; taken and dropped by [`Shutdown::trigger`],
    /// which disconnects every receiver.
    tx: Mutex<Option<Sender<Infallible>>>,
    rx: Receiver<Infallible>,
    /// Run once, by `trigger` (or at once when registered after it).
    hooks: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
    /// `true` from the trigger on: what [`Shutdown::triggered`] waits on. A
    /// watch, not a hook per wait: a task that polls `triggered` in a loop
    /// leaves nothing behind between triggers.
    async_flag: tokio::sync::watch::Sender<bool>,
}

impl fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shutdown")
            .field("triggered", &self.is_triggered())
            .finish_non_exhaustive()
    }
}

impl Default for Shutdown {
    fn default() -> Shutdown {
        Shutdown::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shutdown {
    /// A signal not triggered yet.
    pub fn new() -> Shutdown {
        let (tx, rx) = crossbeam_channel::bounded(0);
        Shutdown {
            inner: Arc::new(ShutdownState {
                triggered: AtomicBool::new(false),
                tx: Mutex::new(Some(tx)),
                rx,
                hooks: Mutex::new(Vec::new()),
                async_flag: tokio::sync::watch::Sender::new(false),
            }),
        }
    }

    /// Triggers the signal: every waiter wakes now, every function registered
    /// with [`Shutdown::on_trigger`] runs (on this thread). Triggering again
    /// does nothing.
    pub fn trigger(&self) {
        self.inner.triggered.store(true, Ordering::SeqCst);
        drop(lock(&self.inner.tx).take());
        self.inner.async_flag.send_replace(true);
        // Taken under the lock, run outside it: a hook may register another.
        let hooks = std::mem::take(&mut *lock(&self.inner.hooks));
        for hook in hooks {
            hook();
        }
    }

    /// Whether the signal was triggered.
    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.load(Ordering::SeqCst)
    }

    /// Sleeps for `timeout`, or less when the signal is triggered meanwhile.
    /// Returns whether it was triggered.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        if self.is_triggered() {
            return true;
        }
        match self.inner.rx.recv_timeout(timeout) {
            Ok(never) => match never {},
            Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => self.is_triggered(),
        }
    }

    /// Sleeps until `deadline`, or less when the signal is triggered
    /// meanwhile. Returns whether it was triggered.
    pub fn wait_deadline(&self, deadline: Instant) -> bool {
        self.wait_timeout(deadline.saturating_duration_since(Instant::now()))
    }

    /// Completes when the signal is triggered (at once when it already
    /// was); for async tasks, to wait in `tokio::select!` together with
    /// their other inputs. Needs no particular runtime, and dropping the
    /// future (the `select!` took another branch) leaves nothing behind.
    pub async fn triggered(&self) {
        let mut flag = self.inner.async_flag.subscribe();
        // `Err` only when the sender is gone, and `self` holds it.
        let _ = flag.wait_for(|triggered| *triggered).await;
    }

    /// A receiver that never yields a message and is disconnected once the
    /// signal is triggered: `recv(shutdown.receiver())` in a
    /// `crossbeam_channel::select!` is ready exactly from the trigger on.
    pub fn receiver(&self) -> &Receiver<Infallible> {
        &self.inner.rx
    }

    /// The read end of a fresh pipe whose write end is closed when the signal
    /// is triggered: from then on `poll(2)` reports it readable (end of file,
    /// `POLLHUP`). Dropping it closes both ends, triggered or not.
    pub fn wake_fd(&self) -> std::io::Result<WakeFd> {
        let (read, write) = std::io::pipe()?;
        let write = Arc::new(Mutex::new(Some(write)));
        self.on_trigger({
            let write = write.clone();
            move || drop(lock(&write).take())
        });
        Ok(WakeFd { read, write })
    }

    /// Runs `hook` when the signal is triggered, on the triggering thread; at
    /// once (on this thread) when it already was. For a thread that blocks in
    /// something other than this signal: the hook wakes it (notifies its
    /// `Condvar` after taking the mutex its waiter checks the signal under,
    /// or drops the write end of a pipe the thread polls). A hook must not
    /// block; it is kept (with what it owns) until the trigger.
    pub fn on_trigger(&self, hook: impl FnOnce() + Send + 'static) {
        let mut hooks = lock(&self.inner.hooks);
        // Checked under the lock that `trigger` takes after setting the flag:
        // a hook is either taken by `trigger` or sees the flag here.
        if self.is_triggered() {
            drop(hooks);
            hook();
        } else {
            hooks.push(Box::new(hook));
        }
    }
}

/// A descriptor that becomes readable when its [`Shutdown`] is triggered
/// (see [`Shutdown::wake_fd`]).
#[derive(Debug)]
pub struct WakeFd {
    read: PipeReader,
    /// Shared with the trigger hook, which closes it; closed on drop too, so
    /// a reader that ends before the trigger leaves no descriptor behind.
    write: Arc<Mutex<Option<PipeWriter>>>,
}

impl AsFd for WakeFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}

impl Drop for WakeFd {
    fn drop(&mut self) {
        drop(lock(&self.write).take());
    }
}

/// Joins `handle` if its thread ends by `deadline`: `Ok` with what `join`
/// returns; `Err` with the handle when it is still running then (the caller
/// leaves it behind or waits longer). Looks every 5 ms: for shutdown and
/// tests, not a hot path.
pub fn join_by<T>(
    handle: std::thread::JoinHandle<T>,
    deadline: Instant,
) -> Result<std::thread::Result<T>, std::thread::JoinHandle<T>> {
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return Err(handle);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(handle.join())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_long_sleep_ends_as_soon_as_the_signal_is_triggered() {
        let s = Shutdown::new();
        let sleeper = {
            let s = s.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                (s.wait_timeout(Duration::from_secs(30)), t.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        s.trigger();
        let (triggered, slept) = sleeper.join().unwrap();
        assert!(triggered);
        // Generous bounds for a loaded machine, well below the 30 s sleep.
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(slept < Duration::from_secs(10), "{slept:?}");
    }

    /// The future is ready at once after the trigger, and a task blocked on
    /// it before the trigger wakes at the trigger; one dropped unfinished
    /// (a `select!` that took another branch) does not get in the way.
    #[test]
    fn triggered_completes_at_the_trigger_and_at_once_after_it() {
        use futures::FutureExt;
        let s = Shutdown::new();
        assert!(s.triggered().now_or_never().is_none(), "not triggered yet");
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || futures::executor::block_on(s.triggered()))
        };
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        s.trigger();
        join_by(waiter, Instant::now() + Duration::from_secs(10))
            .expect("woken by the trigger")
            .expect("no panic");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(s.triggered().now_or_never(), Some(()), "ready at once now");
        assert_eq!(
            s.clone().triggered().now_or_never(),
            Some(()),
            "for every clone"
        );
    }

    #[test]
    fn join_by_joins_a_thread_that_ends_and_hands_back_one_that_does_not() {
        let s = Shutdown::new();
        let waiter = s.clone();
        let h = std::thread::spawn(move || waiter.wait_timeout(Duration::from_secs(30)));
        let h = join_by(h, Instant::now() + Duration::from_millis(50)).expect_err("still waiting");
        s.trigger();
        let ended = join_by(h, Instant::now() + Duration::from_secs(10)).expect("it ended");
        assert!(ended.expect("no panic"), "woken by the trigger");
    }

    #[test]
    fn an_untriggered_sleep_lasts_its_time_and_a_triggered_one_none() {
        let s = Shutdown::default();
        let t = Instant::now();
        assert!(!s.wait_timeout(Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(!s.wait_deadline(Instant::now() - Duration::from_millis(1)));
        assert!(!s.is_triggered());
        s.trigger();
        s.trigger();
        assert!(s.is_triggered());
        let t = Instant::now();
        assert!(s.wait_timeout(Duration::from_secs(30)));
        assert!(s.wait_deadline(Instant::now() + Duration::from_secs(30)));
        // Neither waited out its 30 s (a loaded machine stays well inside 10 s).
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn the_receiver_disconnects_on_trigger_for_select() {
        let s = Shutdown::new();
        let (_tx, data) = crossbeam_channel::unbounded::<u32>();
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || {
                crossbeam_channel::select! {
                    recv(data) -> _ => "data",
                    recv(s.receiver()) -> r => if r.is_err() { "stopped" } else { "message" },
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        s.trigger();
        assert_eq!(waiter.join().unwrap(), "stopped");
    }

    #[test]
    fn hooks_run_once_at_the_trigger_or_at_once_when_late() {
        let s = Shutdown::new();
        let runs = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let runs = runs.clone();
            s.on_trigger(move || {
                runs.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        s.trigger();
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        s.trigger();
        assert_eq!(runs.load(Ordering::SeqCst), 2, "each hook runs once");
        let late = runs.clone();
        s.on_trigger(move || {
            late.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(runs.load(Ordering::SeqCst), 12);
    }

    /// A thread blocked reading the wake descriptor wakes at the trigger:
    /// the write end is closed (end of file).
    #[test]
    fn the_wake_fd_reaches_end_of_file_at_the_trigger() {
        use std::io::Read;
        let s = Shutdown::new();
        let wake = s.wake_fd().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 1];
            (&wake.read).read(&mut buf).unwrap()
        });
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        s.trigger();
        assert_eq!(reader.join().unwrap(), 0, "end of file: the writer is gone");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        // Created after the trigger: readable at once.
        let late = s.wake_fd().unwrap();
        assert_eq!((&late.read).read(&mut [0u8; 1]).unwrap(), 0);
    }

    #[test]
    fn dropping_a_wake_fd_closes_its_write_end() {
        let s = Shutdown::new();
        let wake = s.wake_fd().unwrap();
        let write = wake.write.clone();
        drop(wake);
        assert!(lock(&write).is_none());
    }
}
