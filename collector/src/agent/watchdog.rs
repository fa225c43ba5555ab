//! The one watchdog of the agent's inputs: a thread that checks every
//! input's heartbeat ([`gpuwatch_core::heartbeat`]) against its deadline and
//! tells the engine when one stalls or moves again, as the input's
//! `MonitorStatus`. The engine makes that input's part of the health
//! Unknown (the network, which pods hold a GPU) or shows it (the Node
//! writer). The kernel-log reader and NVML beat the same kind of heartbeat,
//! but `/healthz` holds theirs ([`Liveness::watch`](crate::liveness::Liveness::watch),
//! on top of NVML's call deadline; the engine keeps its loop heartbeat), because a
//! restart unblocks those and does not unblock a sysfs read.

use super::{RunError, StillRunning, StopBudget, join_within};
use crate::input::InputContext;
use gpuwatch_core::heartbeat::{Transition, Watchdog};
use gpuwatch_core::msg::Input;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Stop budget of the watchdog thread (it wakes for the shutdown at once).
const WATCHDOG_STOP: Duration = Duration::from_millis(500);

/// The watchdog thread (none when no input is watched).
#[derive(Debug)]
pub(super) struct InputWatchdog {
    thread: Option<JoinHandle<()>>,
}

impl InputWatchdog {
    /// Starts the thread: it tells the engine through `ctx` that each input
    /// is watched (ok), then every change ([`Watchdog::check`]), each once
    /// ([`InputContext::deliver`]: a change is not repeated, so it must not
    /// be dropped) and logged once (WARN when an input stalls, INFO when it
    /// recovers), until `ctx`'s shutdown.
    pub(super) fn start(
        mut watchdog: Watchdog,
        ctx: InputContext,
    ) -> Result<InputWatchdog, RunError> {
        if watchdog.is_empty() {
            return Ok(InputWatchdog { thread: None });
        }
        let thread = std::thread::Builder::new()
            .name("gpuwatch-watchdog".into())
            .spawn(move || {
                let inputs: Vec<_> = watchdog.inputs().collect();
                for input in inputs {
                    if !ctx.report(input, true, String::new()) {
                        return;
                    }
                }
                let tick = watchdog.tick();
                while !ctx.shutdown().wait_timeout(tick) {
                    for change in watchdog.check(Instant::now()) {
                        if !ctx.deliver(status(change)) {
                            return;
                        }
                    }
                }
            })
            .map_err(|source| RunError::Spawn {
                what: "input watchdog thread",
                source,
            })?;
        Ok(InputWatchdog {
            thread: Some(thread),
        })
    }

    pub(super) fn stop(self, budget: &StopBudget, left: &mut StillRunning) {
        if let Some(t) = self.thread {
            join_within(t, budget.share(WATCHDOG_STOP), "input watchdog", left);
        }
    }
}

/// The engine's input for a change, logged.
fn status(change: Transition) -> Input {
    match change {
        Transition::Stalled { input, message } => {
            tracing::warn!(
                input = input.as_str(),
                detail = %message,
                "An input is stuck; what it covers is reported as unknown until it makes progress again."
            );
            Input::MonitorStatus {
                input,
                ok: false,
                message,
            }
        }
        Transition::Recovered { input } => {
            tracing::info!(
                input = input.as_str(),
                "An input that was stuck makes progress again."
            );
            Input::MonitorStatus {
                input,
                ok: true,
                message: String::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_core::Shutdown;
    use gpuwatch_core::heartbeat::{Progress, Watched};
    use gpuwatch_core::msg::MonitorInput;

    fn statuses(rx: &crossbeam_channel::Receiver<Input>) -> Vec<(MonitorInput, bool, String)> {
        rx.try_iter()
            .filter_map(|i| match i {
                Input::MonitorStatus { input, ok, message } => Some((input, ok, message)),
                _ => None,
            })
            .collect()
    }

    /// A real thread over a heartbeat that stops beating: the engine hears
    /// the input is watched, then one stall naming what it is stuck in,
    /// then one recovery, and the thread ends with the shutdown.
    #[test]
    fn a_stuck_input_is_reported_once_and_its_recovery_once() {
        let progress = Progress::new();
        let mut w = Watchdog::new();
        w.watch(Watched::new(
            MonitorInput::PodResources,
            progress.clone(),
            Duration::from_millis(300),
        ));
        let (tx, rx) = crossbeam_channel::bounded(16);
        let shutdown = Shutdown::new();
        let dog = InputWatchdog::start(w, InputContext::new(shutdown.clone(), tx)).unwrap();
        let stuck = progress.begin(std::ffi::OsStr::new("List on kubelet.sock"));
        let mut seen = Vec::new();
        let wait_for = |n: usize, seen: &mut Vec<_>| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while seen.len() < n && Instant::now() < deadline {
                seen.extend(statuses(&rx));
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        wait_for(2, &mut seen);
        assert_eq!(seen[0], (MonitorInput::PodResources, true, String::new()));
        let (input, ok, message) = &seen[1];
        assert_eq!((*input, *ok), (MonitorInput::PodResources, false));
        assert!(
            message.starts_with("List on kubelet.sock has not returned for"),
            "{message}"
        );
        // Still stuck three deadlines later: nothing more is reported.
        std::thread::sleep(Duration::from_millis(900));
        assert!(statuses(&rx).is_empty(), "a stall is reported once");
        drop(stuck);
        wait_for(3, &mut seen);
        assert_eq!(seen[2], (MonitorInput::PodResources, true, String::new()));
        shutdown.trigger();
        let mut left = StillRunning::default();
        dog.stop(&StopBudget::new(Duration::from_secs(5)), &mut left);
        assert!(left.is_empty(), "the thread stops with the shutdown");
    }
}
