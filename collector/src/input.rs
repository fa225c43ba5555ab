//! What every input of the agent is started with: one [`InputContext`], as
//! Vector hands each source a `SourceContext { shutdown, out }`.
//!
//! An input (the NIC poller, the NVML sources, the kubelet PodResources
//! poller, the input watchdog, the local API's operator clears) takes one
//! context instead of a stop signal, a channel and a heartbeat of its own
//! kind: it stops when [`InputContext::shutdown`] is triggered (a thread
//! waits on the [`Shutdown`] itself, an async task on
//! [`InputContext::stopped`]), sends what it reads and its status into
//! [`InputContext::out`] by one of the two send rules below, and beats
//! [`InputContext::progress`] while it works, which the agent's input
//! watchdog holds to the input's deadline ([`InputContext::watched`]).
//!
//! The two send rules:
//! - [`InputContext::offer`]: never waits; a full channel drops the input.
//!   For a reading whose next one carries the whole state again (a NIC
//!   scan: counters are cumulative), so that a storm of kernel-log faults
//!   goes first.
//! - [`InputContext::deliver`] (and [`InputContext::report`], a status):
//!   waits for room, but not past the shutdown. For what is said once and
//!   must not be lost (a status change).

use crossbeam_channel::{SendTimeoutError, Sender, TrySendError};
use gpuwatch_core::Shutdown;
use gpuwatch_core::heartbeat::{Progress, Watched};
use gpuwatch_core::msg::{Input, MonitorInput};
use std::sync::Arc;
use std::time::Duration;

/// How long one wait for room in the channel lasts before [`InputContext::deliver`]
/// looks at the shutdown again.
const DELIVER_RETRY: Duration = Duration::from_millis(100);

/// The stop signal, the output channel and the heartbeat of one input (see
/// the module doc). Clones share all three.
#[derive(Clone, Debug)]
pub struct InputContext {
    shutdown: Shutdown,
    out: Sender<Input>,
    progress: Arc<Progress>,
}

impl InputContext {
    /// A context sending into `out`, stopped by `shutdown`, with a heartbeat
    /// that has not started.
    pub fn new(shutdown: Shutdown, out: Sender<Input>) -> InputContext {
        InputContext {
            shutdown,
            out,
            progress: Progress::new(),
        }
    }

    /// The stop signal; a thread waits on it (it wakes a sleep, a
    /// `select!`, a `poll(2)` set at once).
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Whether the input should stop.
    pub fn is_stopping(&self) -> bool {
        self.shutdown.is_triggered()
    }

    /// Completes once the shutdown is triggered: the stop signal for an
    /// async task (in a `select!`, or as a server's graceful shutdown).
    pub async fn stopped(&self) {
        self.shutdown.triggered().await;
    }

    /// Where the input's output goes (the engine channel, or the NVML
    /// forwarder's), for an input with a send rule of its own.
    pub fn out(&self) -> &Sender<Input> {
        &self.out
    }

    /// The input's heartbeat: beat it while working, and name what may
    /// block ([`Progress::begin`]).
    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// The heartbeat for the input watchdog: `input` stalls when it makes
    /// no progress for `deadline`.
    pub(crate) fn watched(&self, input: MonitorInput, deadline: Duration) -> Watched {
        Watched::new(input, self.progress.clone(), deadline)
    }

    /// Sends without waiting; a full channel drops `input` (module doc).
    /// False when the receiver is gone: the input should stop.
    pub fn offer(&self, input: Input) -> bool {
        match self.out.try_send(input) {
            Ok(()) | Err(TrySendError::Full(_)) => true,
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Sends, waiting for room in the channel, but not past the shutdown
    /// (module doc). False when the receiver is gone or the input stops
    /// before there was room.
    pub fn deliver(&self, input: Input) -> bool {
        let mut input = input;
        loop {
            match self.out.send_timeout(input, DELIVER_RETRY) {
                Ok(()) => return true,
                Err(SendTimeoutError::Timeout(back)) if !self.is_stopping() => input = back,
                Err(_) => return false,
            }
        }
    }

    /// Tells the engine how `input` is: [`InputContext::deliver`] of its
    /// `MonitorStatus`.
    pub fn report(&self, input: MonitorInput, ok: bool, message: String) -> bool {
        self.deliver(Input::MonitorStatus { input, ok, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn offer_drops_when_full_and_stops_when_the_receiver_is_gone() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let ctx = InputContext::new(Shutdown::new(), tx);
        assert!(ctx.offer(Input::Tick));
        assert!(
            ctx.offer(Input::KmsgCaughtUp),
            "full: dropped, not an error"
        );
        assert_eq!(rx.try_iter().count(), 1);
        drop(rx);
        assert!(!ctx.offer(Input::Tick));
    }

    #[test]
    fn deliver_waits_for_room_but_not_past_the_shutdown() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let shutdown = Shutdown::new();
        let ctx = InputContext::new(shutdown.clone(), tx);
        assert!(ctx.report(MonitorInput::Network, true, String::new()));
        // Full: the engine takes the first input a little later.
        let taker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            let first = rx.recv().unwrap();
            (first, rx)
        });
        assert!(ctx.deliver(Input::Tick), "delivered once there was room");
        let (first, rx) = taker.join().unwrap();
        assert!(matches!(
            first,
            Input::MonitorStatus {
                input: MonitorInput::Network,
                ok: true,
                ..
            }
        ));
        // Full again, and nobody takes: the shutdown ends the wait.
        let waiter = {
            let ctx = ctx.clone();
            std::thread::spawn(move || ctx.deliver(Input::KmsgCaughtUp))
        };
        std::thread::sleep(Duration::from_millis(150));
        shutdown.trigger();
        assert!(!waiter.join().unwrap(), "not delivered");
        assert!(matches!(rx.try_recv(), Ok(Input::Tick)));
        drop(rx);
        assert!(!ctx.deliver(Input::Tick), "the receiver is gone");
    }

    #[test]
    fn an_async_waiter_wakes_at_the_trigger_and_a_late_one_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let shutdown = Shutdown::new();
        let ctx = InputContext::new(shutdown.clone(), tx);
        let waiting = {
            let ctx = ctx.clone();
            rt.spawn(async move { ctx.stopped().await })
        };
        rt.block_on(async {
            let early = tokio::time::timeout(Duration::from_millis(100), ctx.stopped()).await;
            assert!(early.is_err(), "not stopped before the trigger");
        });
        let t = Instant::now();
        shutdown.trigger();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .expect("woken by the trigger")
                .unwrap();
            ctx.stopped().await;
        });
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(ctx.is_stopping());
    }
}
