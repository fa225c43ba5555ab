//! The one-shot check behind `gpuwatch validate`: the agent's health engine
//! (read-only, see [`Prepared::read_only_engine`]) fed with one NVML poll and
//! one pass of the agent's kernel-log reader over the ring of this boot.

use super::Prepared;
use crate::input::InputContext;
use crate::liveness::Liveness;
use crate::pipeline::ENGINE_CHANNEL_CAPACITY;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use gpuwatch_core::engine::Engine;
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_core::{Registry, Shutdown};
use gpuwatch_proto::fabric::Reading;
use gpuwatch_proto::{InputState, NodeHealth};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Why the check could not run.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The kernel-log reader thread could not start.
    #[error("cannot start the kernel-log reader")]
    KmsgSpawn(#[source] std::io::Error),
    /// The kernel-log reader thread panicked.
    #[error("the kernel-log reader panicked")]
    KmsgPanicked,
}

/// How long the check waits for the kernel-log ring to be read.
const KMSG_DEADLINE: Duration = Duration::from_secs(10);
/// A reader quiet this long after the ring was read has sent everything the
/// scanner held (multi-record events wait 10 ms).
const KMSG_QUIET: Duration = Duration::from_millis(50);
/// How long the reader gets to flush what it holds once told to stop.
const KMSG_FLUSH: Duration = Duration::from_secs(2);

impl Prepared {
    /// The node health `gpuwatch validate` judges: the engine of `gpuwatch
    /// run` (same classification, joins and derived faults, the agent's
    /// state read, never written) fed with one NVML poll and one pass of the
    /// kmsg source over the kernel-log ring of this boot (read until
    /// `EAGAIN`, or the end of a `--kmsg-path` file). When the ring cannot
    /// be read to its end within 10 s the `kmsg` check is incomplete. While a
    /// GPU's NVLink fabric registration is pending, NVML is polled again for
    /// up to `[engine] fabric_wait_secs`.
    pub fn check_once(&self) -> Result<NodeHealth, CheckError> {
        let registry = Registry::new();
        let mut engine = self.read_only_engine(&registry);
        feed_nvml_poll(&mut engine, self.nvml(), self.engine().fabric_wait());
        self.read_kmsg_ring(&mut engine, &registry)?;
        Ok(finish(engine))
    }

    /// Runs the kernel-log reader until it has read the ring (or failed, or
    /// the deadline passed), handing everything it sends to `engine`, whose
    /// monitor status then says whether the ring was read to its end.
    fn read_kmsg_ring(
        &self,
        engine: &mut Engine,
        registry: &Arc<Registry>,
    ) -> Result<(), CheckError> {
        let liveness = Liveness::new();
        let shutdown = Shutdown::new();
        let (tx, rx) = crossbeam_channel::bounded(ENGINE_CHANNEL_CAPACITY);
        let args = self.kmsg_source(engine, registry, &liveness, None);
        let ctx = InputContext::new(shutdown.clone(), tx);
        let thread = crate::kmsg::spawn(args, ctx).map_err(CheckError::KmsgSpawn)?;
        read_until_caught_up(engine, &rx);
        shutdown.trigger();
        // The reader flushes what it holds when it stops; drain until it is gone.
        while let Ok(input) = rx.recv_timeout(KMSG_FLUSH) {
            engine.handle(input);
        }
        if thread.join().is_err() {
            return Err(CheckError::KmsgPanicked);
        }
        Ok(())
    }
}

/// One NVML poll into the engine; NVML down is reported as an incomplete
/// validation (never a pass). While some GPU's NVLink fabric registration is
/// pending (the fabric manager is starting), NVML is polled again every
/// second for up to `fabric_wait`, and the last poll is judged.
fn feed_nvml_poll(engine: &mut Engine, cfg: &crate::nvml::NvmlSettings, fabric_wait: Duration) {
    let told = std::sync::atomic::AtomicBool::new(false);
    let polled = crate::nvml::poll_while(cfg, fabric_wait, move |samples| {
        let pending = samples.iter().any(|s| {
            s.fabric
                .as_ref()
                .is_some_and(|f| Reading::of(f).is_pending())
        });
        if pending && !told.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                wait_secs = fabric_wait.as_secs(),
                "GPU NVLink fabric registration in progress; waiting for it (is nvidia-fabricmanager running?)."
            );
        }
        pending
    });
    match polled {
        Ok(samples) => {
            engine.handle(Input::MonitorStatus {
                input: MonitorInput::Nvml,
                ok: true,
                message: String::new(),
            });
            engine.handle(Input::Samples {
                samples,
                complete: true,
            });
        }
        Err(e) => {
            engine.handle(Input::MonitorStatus {
                input: MonitorInput::Nvml,
                ok: false,
                message: format!("NVML unavailable: {e}"),
            });
        }
    }
}

/// Where the engine's monitor status says the kernel-log reader stands:
/// `(down, caught_up)`.
fn kmsg_status(engine: &Engine) -> (bool, bool) {
    let health = engine.health();
    let Some(m) = health.monitor.as_ref() else {
        return (false, false);
    };
    let down = m
        .inputs
        .iter()
        .any(|i| i.input == MonitorInput::Kmsg.as_str() && i.state() == InputState::Down);
    (down, m.kmsg_caught_up)
}

/// Hands what the reader sends to `engine` until the engine says the reader
/// caught up (and it went quiet) or reported the input unreadable (no point
/// waiting), the reader ended, or the deadline passed.
fn read_until_caught_up(engine: &mut Engine, rx: &Receiver<Input>) {
    let deadline = Instant::now() + KMSG_DEADLINE;
    loop {
        match rx.recv_timeout(KMSG_QUIET) {
            Ok(input) => {
                let about_kmsg = matches!(
                    input,
                    Input::MonitorStatus {
                        input: MonitorInput::Kmsg,
                        ..
                    }
                );
                engine.handle(input);
                if about_kmsg && kmsg_status(engine).0 {
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if kmsg_status(engine).1 || Instant::now() >= deadline {
                    break;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// The engine's health after the pass: its monitor status says whether the
/// kernel-log reader could read and read the ring to its end, which the
/// validation's `kmsg` check reads.
fn finish(mut engine: Engine) -> NodeHealth {
    engine.handle(Input::Tick);
    (*engine.health()).clone()
}
