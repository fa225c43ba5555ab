//! The engine thread: [`run_engine`] receives inputs, hands the events to the
//! sinks, publishes the health and schedules the state writes.

use super::writer::StateWriter;
use super::{Engine, NANOS, health};
use crate::msg::Input;
use crate::{EventSink, Registry, Shutdown};
use crossbeam_channel::RecvTimeoutError;
use gpuwatch_proto::NodeHealth;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// How long the shutdown waits for a state write in progress before giving
/// up the final write (the process must end within its stop budget even on a
/// hung disk).
pub const FINAL_WRITE_WAIT: Duration = Duration::from_secs(3);

/// The engine thread loop: receives inputs (with a tick timeout), handles them,
/// sends each returned event to every sink at once, publishes the health to
/// `health_tx` and the registry when it changed (timestamps ignored), persists when
/// dirty (at most once per `persist_interval_ms`). Publishing and persisting wait
/// for a 5 ms pause in the input (at most 100 ms for a publication, one more
/// persist interval for a persist) so that they never hold up the events of a
/// burst. The state file is written by a writer thread of its own (the engine
/// only copies the state): the disk never delays an event. Between inputs the
/// thread sleeps until the next of these is due. Returns on channel
/// disconnect or when `shutdown` is triggered (at once, even in the middle of
/// a wait; inputs already queued are handled first), after a final state
/// write (unless the writer is still stuck in an earlier one after
/// [`FINAL_WRITE_WAIT`]) and flushing the sinks.
pub fn run_engine(
    mut engine: Engine,
    rx: crossbeam_channel::Receiver<Input>,
    sinks: Vec<Arc<dyn EventSink>>,
    health_tx: impl Fn(Arc<NodeHealth>),
    shutdown: Shutdown,
) {
    /// Inputs handled between two health publications.
    const BATCH: usize = 4096;
    /// Health is published and state persisted once the input has paused this
    /// long (a burst of records is handled first), or at the latest
    /// `PUBLISH_EVERY` / one more persist interval later. Building and
    /// comparing `NodeHealth` costs O(active faults) (~3 ms with 2000) and a
    /// persist includes an fsync (0.5-5 ms): done between two inputs, they
    /// delay the next event behind them. Publishing after every input took the
    /// engine thread to ~60 % of a core at 500 events/s.
    const SETTLE: Duration = Duration::from_millis(5);
    /// Longest a health change waits for a pause in the input. Consumers
    /// (Kubernetes writer, local API, metrics) see every change within this.
    const PUBLISH_EVERY: Duration = Duration::from_millis(100);
    let tick = Duration::from_millis(engine.cfg.tick_interval_ms.max(1));
    let persist_every = Duration::from_millis(engine.cfg.persist_interval_ms);
    let writer = if engine.state_path.is_some() && !engine.read_only {
        match StateWriter::spawn() {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(error = %e, "Cannot start the state writer thread; writing the state on the engine thread.");
                None
            }
        }
    } else {
        None
    };
    let persist = |engine: &mut Engine| {
        let res = match &writer {
            Some(w) => engine.persist_in_background(w),
            None => engine.persist(),
        };
        if let Err(e) = res {
            error!(error = %e, "Health state file not written.");
        }
    };
    let registry = Arc::clone(&engine.registry);
    let mut published = engine.health();
    registry.set_health(Arc::clone(&published));
    health_tx(Arc::clone(&published));
    let mut last_tick = Instant::now();
    let mut last_input = Instant::now();
    let last_persist: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
    // First input handled since the last publication (None: nothing to
    // publish); `emitted`: some of those inputs produced events, so the health
    // changed for sure.
    let mut unpublished_since: Option<Instant> = None;
    let mut emitted = false;
    engine.defer_activation_logs = true;
    let dispatch = |engine: &mut Engine, input: Input| -> bool {
        let progress = matches!(input, Input::KmsgProgress(_));
        let events = engine.handle(input);
        for ev in &events {
            for sink in &sinks {
                sink.send(ev);
            }
        }
        for activation in engine.activations.drain(..) {
            activation.log();
        }
        if progress {
            // A settled point inside a burst: write here when a write is
            // due, or a long storm (never pausing) would never be persisted.
            let now = Instant::now();
            let due = last_persist.get().is_none_or(|t| now >= t + persist_every);
            if due && engine.persist_due().is_some_and(|t| now >= t) {
                last_persist.set(Some(now));
                persist(engine);
            }
        }
        !events.is_empty()
    };
    loop {
        if shutdown.is_triggered() {
            // Inputs already queued are handled, not lost.
            for _ in 0..BATCH {
                match rx.try_recv() {
                    Ok(input) => emitted |= dispatch(&mut engine, input),
                    Err(_) => break,
                }
            }
            break;
        }
        if let Some(hb) = &engine.heartbeat {
            // Real time, not the engine's clock: this is about the thread.
            hb.store(
                crate::clock::unix_nanos(std::time::SystemTime::now()) / NANOS,
                Ordering::Relaxed,
            );
        }
        // Next thing due: the tick, a publication, a persist.
        let settled = last_input + SETTLE;
        let publish_due = unpublished_since.map(|t| settled.min(t + PUBLISH_EVERY));
        let persist_due = engine.persist_due().map(|ready| {
            let earliest = last_persist.get().map_or(last_input, |t| t + persist_every);
            earliest
                .max(settled.min(earliest + persist_every))
                .max(ready)
        });
        let due = [Some(last_tick + tick), publish_due, persist_due]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(last_tick + tick);
        let wait = due.saturating_duration_since(Instant::now());
        let received = crossbeam_channel::select! {
            recv(rx) -> input => input.map_err(|_| RecvTimeoutError::Disconnected),
            // Handled at the top of the loop.
            recv(shutdown.receiver()) -> _ => continue,
            default(wait) => Err(RecvTimeoutError::Timeout),
        };
        let disconnected = match received {
            Ok(input) => {
                unpublished_since.get_or_insert_with(Instant::now);
                emitted |= dispatch(&mut engine, input);
                let mut closed = false;
                for _ in 1..BATCH {
                    match rx.try_recv() {
                        Ok(input) => emitted |= dispatch(&mut engine, input),
                        Err(crossbeam_channel::TryRecvError::Empty) => break,
                        Err(crossbeam_channel::TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                }
                last_input = Instant::now();
                closed
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        let now = Instant::now();
        if now >= last_tick + tick {
            emitted |= dispatch(&mut engine, Input::Tick);
            last_tick = now;
            unpublished_since.get_or_insert(now);
        }
        if publish_due.is_some_and(|t| now >= t) {
            engine.flush_fault_counts();
            publish(&engine, &mut published, &registry, &health_tx, emitted);
            unpublished_since = None;
            emitted = false;
        }
        if let Some(w) = &writer {
            engine.background_writes_done(w);
        }
        if persist_due.is_some_and(|t| now >= t) {
            last_persist.set(Some(now));
            persist(&mut engine);
        }
        if disconnected {
            break;
        }
    }
    let mut writer_stuck = false;
    if let Some(w) = &writer {
        writer_stuck = !w.wait_idle(FINAL_WRITE_WAIT);
        engine.background_writes_done(w);
    }
    engine.flush_fault_counts();
    publish(&engine, &mut published, &registry, &health_tx, emitted);
    // The final write ignores the backoff: it is the last chance.
    engine.retry_write_at = None;
    if writer_stuck {
        warn!(
            "The state writer is still blocked in an earlier write; no final state write (records after the last written position are read again at the next start)."
        );
    } else if !engine.is_settled() {
        warn!(
            "Kernel-log events beyond the last reported position were handled; keeping the last settled state file (those records are read again at the next start)."
        );
    } else if let Err(e) = engine.persist() {
        warn!(error = %e, "Cannot write the health state file at shutdown.");
    }
    for sink in &sinks {
        sink.flush(Duration::from_secs(2));
    }
    info!("Health engine stopped.");
}

/// Publishes the engine's health when it differs from `published` (timestamps
/// ignored, so an unchanged state is never re-sent). `changed`: events were
/// emitted since the last publication, so the (costly) comparison is skipped.
fn publish(
    engine: &Engine,
    published: &mut Arc<NodeHealth>,
    registry: &Registry,
    health_tx: &dyn Fn(Arc<NodeHealth>),
    changed: bool,
) {
    let current = engine.health();
    if Arc::ptr_eq(&current, published)
        || (!changed && health::same_ignoring_timestamps(&current, published))
    {
        return;
    }
    registry.set_health(Arc::clone(&current));
    health_tx(Arc::clone(&current));
    *published = current;
}
