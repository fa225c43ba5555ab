//! The health-engine thread: started with the engine channel's receiver, the
//! event sinks and the health watch; stopped after every input is gone.

use super::inputs::InputsStopped;
use super::{RunError, StillRunning, StopBudget, join_within};
use crate::liveness::Liveness;
use crate::pipeline::StopReason;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use gpuwatch_core::engine::Engine;
use gpuwatch_core::msg::Input;
use gpuwatch_core::{EventSink, Shutdown};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the engine may take to drain its channel and write the state
/// before it is told to stop.
const ENGINE_DRAIN: Duration = Duration::from_secs(3);
/// How long the engine may take to end once told to stop (it writes the
/// state then).
const ENGINE_JOIN: Duration = Duration::from_secs(2);

/// The engine thread, and the two ways it ends: its channel drained, or
/// told to stop.
#[derive(Debug)]
pub(super) struct EngineThread {
    thread: JoinHandle<()>,
    /// Told once `run_engine` returned.
    done_rx: Receiver<()>,
    /// Stops the engine before its channel is drained (past its share).
    shutdown: Shutdown,
}

impl EngineThread {
    /// Runs `engine` on its own thread until every sender of `rx` is gone and
    /// the channel is drained; it publishes its health to its registry.
    /// When the thread ends, `stop_tx` is told (the agent cannot run without
    /// it).
    pub(super) fn start(
        engine: Engine,
        rx: Receiver<Input>,
        sinks: Vec<Arc<dyn EventSink>>,
        liveness: &Arc<Liveness>,
        stop_tx: Sender<StopReason>,
    ) -> Result<EngineThread, RunError> {
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        let shutdown = Shutdown::new();
        let liveness = liveness.clone();
        let engine_shutdown = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name("gpuwatch-engine".into())
            .spawn(move || {
                {
                    let _alive = liveness.engine_running();
                    gpuwatch_core::engine::run_engine(engine, rx, sinks, engine_shutdown);
                }
                let _ = done_tx.send(());
                let _ = stop_tx.send(StopReason::ThreadExited);
            })
            .map_err(|source| RunError::Spawn {
                what: "engine thread",
                source,
            })?;
        Ok(EngineThread {
            thread,
            done_rx,
            shutdown,
        })
    }

    /// Waits for the engine to drain the channel (no sender is left:
    /// `_inputs`) and write the state; past its share it is told to stop (it
    /// writes the state then).
    pub(super) fn stop(self, _inputs: InputsStopped, budget: &StopBudget, left: &mut StillRunning) {
        let drain = budget.share(ENGINE_DRAIN);
        if self.done_rx.recv_timeout(drain) == Err(RecvTimeoutError::Timeout) {
            tracing::warn!(
                waited_ms = drain.as_millis() as u64,
                "Engine did not drain in time; stopping it."
            );
            self.shutdown.trigger();
        }
        join_within(self.thread, budget.share(ENGINE_JOIN), "engine", left);
    }
}
