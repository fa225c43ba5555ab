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
use gpuwatch_proto::NodeHealth;
use gpuwatch_proto::fabric::Reading;
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
        let pass = self.read_kmsg_ring(&mut engine, &registry)?;
        Ok(pass.finish(engine, self))
    }

    /// Runs the kernel-log reader until it has read the ring (or failed, or
    /// the deadline passed), handing everything it sends to `engine`.
    fn read_kmsg_ring(
        &self,
        engine: &mut Engine,
        registry: &Arc<Registry>,
    ) -> Result<KmsgPass, CheckError> {
        let liveness = Liveness::new();
        let shutdown = Shutdown::new();
        let (tx, rx) = crossbeam_channel::bounded(ENGINE_CHANNEL_CAPACITY);
        let args = self.kmsg_source(engine, registry, &liveness, None);
        let ctx = InputContext::new(shutdown.clone(), tx);
        let thread = crate::kmsg::spawn(args, ctx).map_err(CheckError::KmsgSpawn)?;
        let mut pass = KmsgPass::default();
        pass.read(engine, &rx, &liveness);
        shutdown.trigger();
        // The reader flushes what it holds when it stops; drain until it is gone.
        while let Ok(input) = rx.recv_timeout(KMSG_FLUSH) {
            pass.handle(engine, input);
        }
        if thread.join().is_err() {
            return Err(CheckError::KmsgPanicked);
        }
        pass.caught_up = liveness.kmsg_caught_up();
        Ok(pass)
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

/// What the check saw of the kernel-log reader itself.
#[derive(Debug, Default)]
struct KmsgPass {
    /// The reader's latest status was "readable".
    ok: bool,
    /// Some status said "unreadable".
    failed: bool,
    /// The latest status message.
    message: String,
    /// The reader read the ring to its end.
    caught_up: bool,
}

impl KmsgPass {
    /// Hands `input` to the engine, noting the reader's status.
    fn handle(&mut self, engine: &mut Engine, input: Input) {
        if let Input::MonitorStatus {
            input: MonitorInput::Kmsg,
            ok,
            message,
        } = &input
        {
            self.ok = *ok;
            self.failed |= !*ok;
            self.message.clone_from(message);
        }
        engine.handle(input);
    }

    /// Receives until the reader caught up and went quiet, reported the
    /// input unreadable (no point waiting), ended, or the deadline passed.
    fn read(&mut self, engine: &mut Engine, rx: &Receiver<Input>, liveness: &Liveness) {
        let deadline = Instant::now() + KMSG_DEADLINE;
        loop {
            match rx.recv_timeout(KMSG_QUIET) {
                Ok(input) => {
                    self.handle(engine, input);
                    if self.failed {
                        break;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if liveness.kmsg_caught_up() || Instant::now() >= deadline {
                        break;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    /// The engine's health after the pass, with the kernel-log monitor as
    /// this check observed it, whatever the engine reports.
    fn finish(self, mut engine: Engine, prepared: &Prepared) -> NodeHealth {
        if self.caught_up {
            engine.handle(Input::KmsgCaughtUp);
        }
        engine.handle(Input::Tick);
        let mut health = (*engine.health()).clone();
        let m = health.monitor.get_or_insert_with(Default::default);
        m.kmsg_ok = self.ok || self.caught_up;
        m.kmsg_caught_up = self.caught_up;
        if !m.kmsg_ok && !self.message.is_empty() {
            m.message = self.message;
        } else if !self.caught_up {
            m.message = format!(
                "{} not read to its end within {}s",
                prepared.kmsg().path.display(),
                KMSG_DEADLINE.as_secs()
            );
        }
        health
    }
}
