//! The engine thread: [`run_engine`] receives inputs, hands the events to the
//! sinks, publishes the health and schedules the state writes.

use super::persist::StateSnapshot;
use super::writer::StateWriter;
use super::{Engine, NANOS, health};
use crate::msg::Input;
use crate::{EventSink, Registry, Shutdown};
use crossbeam_channel::RecvTimeoutError;
use gpuwatch_proto::{FaultEvent, NodeHealth};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// How long the shutdown waits for a state write in progress before giving
/// up the final write (the process must end within its stop budget even on a
/// hung disk).
pub const FINAL_WRITE_WAIT: Duration = Duration::from_secs(3);

/// Inputs handled between two health publications.
const BATCH: usize = 4096;

/// Events of a burst held back at most while more inputs are queued (see
/// `EngineLoop::dispatch`).
const EMIT_AT: usize = 16;

/// Activation log lines held back at most before a burst's end writes them
/// (a storm that never pauses still logs every few hundred activations).
const ACTIVATION_BACKLOG: usize = 256;

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

/// The engine thread loop: receives inputs (with a tick timeout), handles them,
/// hands each input's events to every sink as soon as they are handled (the
/// activation log lines they cause wait for the next publication),
/// publishes the health to the
/// registry when it changed (timestamps ignored; the registry's health
/// observers are the only way anything else hears of it), persists when
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
    engine: Engine,
    rx: crossbeam_channel::Receiver<Input>,
    sinks: Vec<Arc<dyn EventSink>>,
    shutdown: Shutdown,
) {
    let mut run = EngineLoop::start(engine, &sinks);
    loop {
        if shutdown.is_triggered() {
            run.drain(&rx);
            break;
        }
        run.heartbeat();
        let due = run.next_due();
        let wait = due.wake.saturating_duration_since(Instant::now());
        let received = crossbeam_channel::select! {
            recv(rx) -> input => input.map_err(|_| RecvTimeoutError::Disconnected),
            // Handled at the top of the loop.
            recv(shutdown.receiver()) -> _ => continue,
            default(wait) => Err(RecvTimeoutError::Timeout),
        };
        let disconnected = match received {
            Ok(input) => run.burst(input, &rx),
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        run.catch_up(&due);
        if disconnected {
            break;
        }
    }
    run.stop();
}

/// What the engine thread holds while it runs: the engine, where its
/// events and health go, the state writer, and the schedule of ticks,
/// publications and state writes.
struct EngineLoop<'a> {
    engine: Engine,
    sinks: &'a [Arc<dyn EventSink>],
    registry: Arc<Registry>,
    /// `None`: no state to write, or the writer thread could not start (the
    /// engine thread writes itself then).
    writer: Option<StateWriter<StateSnapshot>>,
    tick: Duration,
    persist_every: Duration,
    /// The health last published, compared with the next (timestamps
    /// ignored) so an unchanged health is not sent again.
    published: Arc<NodeHealth>,
    last_tick: Instant,
    last_input: Instant,
    last_persist: Option<Instant>,
    /// First input handled since the last publication (`None`: nothing to
    /// publish).
    unpublished_since: Option<Instant>,
    /// Some input since the last publication produced events, so the health
    /// changed for sure.
    emitted: bool,
    /// Events of one input or one placement release, reused between them.
    out: Vec<FaultEvent>,
    /// Where the emitted events go back for reuse.
    spent: Option<crate::msg::SpentSender>,
}

/// When the loop wakes next, and the publication and state write that may
/// be due by then.
#[derive(Debug)]
struct Due {
    wake: Instant,
    publish: Option<Instant>,
    persist: Option<Instant>,
}

impl<'a> EngineLoop<'a> {
    /// Starts the state writer and publishes the initial health.
    fn start(mut engine: Engine, sinks: &'a [Arc<dyn EventSink>]) -> EngineLoop<'a> {
        let writer = if engine.persist.writes() {
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
        let registry = Arc::clone(&engine.registry);
        let published = engine.health();
        registry.set_health(Arc::clone(&published));
        engine.defer_activation_logs = true;
        let spent = engine.spent.take();
        EngineLoop {
            tick: engine.cfg.tick_interval,
            persist_every: engine.cfg.persist_interval,
            engine,
            sinks,
            registry,
            writer,
            published,
            last_tick: Instant::now(),
            last_input: Instant::now(),
            last_persist: None,
            unpublished_since: None,
            emitted: false,
            out: Vec::new(),
            spent,
        }
    }

    /// Handles one input and hands its events to the sinks unless more
    /// inputs are already queued behind it (`more_queued`) and fewer than
    /// [`EMIT_AT`] events wait. The engine keeping up, every event leaves at
    /// once; falling behind (a burst), events leave in runs of up to
    /// [`EMIT_AT`], one `write(2)` and one wake-up of the sinks' readers per
    /// run instead of one each, so the engine catches up sooner. Holding a
    /// whole burst back was measured to cost more than it saved: the first
    /// events waited for the last, and the sinks' readers idled meanwhile. A
    /// kernel-log position is a settled point: the events so far leave and
    /// the state is written there when a write is due, or a long storm
    /// (never pausing) would never be persisted.
    fn dispatch(&mut self, input: Input, more_queued: bool) {
        let progress = matches!(input, Input::KmsgProgress(_));
        let events = self.engine.handle(input);
        self.emitted |= !events.is_empty();
        self.out.extend(events);
        if !more_queued || self.out.len() >= EMIT_AT {
            self.emit();
        }
        if progress {
            let now = Instant::now();
            let due = self
                .last_persist
                .is_none_or(|t| now >= t + self.persist_every);
            if due && self.engine.persist_due().is_some_and(|t| now >= t) {
                // The state written says these events were handled: they
                // leave first.
                self.emit();
                self.last_persist = Some(now);
                self.persist();
            }
        }
    }

    /// Hands the events waiting in `out` to every sink, in order, then back
    /// to their source when it takes them (a full way back drops them).
    fn emit(&mut self) {
        if !self.out.is_empty() {
            for sink in self.sinks {
                sink.send_batch(&self.out);
            }
            match &self.spent {
                Some(tx) => {
                    for ev in self.out.drain(..) {
                        let _ = tx.try_send(ev);
                    }
                }
                None => self.out.clear(),
            }
        }
    }

    /// Logs the activations the inputs handled so far caused. Called where
    /// the health is published (the input paused, or at the latest
    /// [`PUBLISH_EVERY`]), or once [`ACTIVATION_BACKLOG`] wait: formatting
    /// and writing a log line costs about as much as handling an event, and
    /// a record read while it is written waits for it.
    fn log_activations(&mut self) {
        for activation in self.engine.activations.drain(..) {
            activation.log();
        }
    }

    /// Hands the records whose placement wait is over (every one when
    /// `all`) to the sinks.
    fn release_waiting(&mut self, all: bool) {
        let before = self.out.len();
        self.engine.release_waiting(all, &mut self.out);
        if self.out.len() > before {
            self.emitted = true;
            self.unpublished_since.get_or_insert_with(Instant::now);
        }
        self.emit();
    }

    /// Writes the state (on the writer thread when there is one).
    fn persist(&mut self) {
        let res = match &self.writer {
            Some(w) => self.engine.persist_in_background(w),
            None => self.engine.persist(),
        };
        if let Err(e) = res {
            error!(error = %e, "Health state file not written.");
        }
    }

    /// Stores the Unix seconds of this loop pass for the liveness check.
    fn heartbeat(&self) {
        if let Some(hb) = &self.engine.heartbeat {
            // Real time, not the engine's clock: this is about the thread.
            hb.beat(crate::clock::unix_nanos(std::time::SystemTime::now()) / NANOS);
        }
    }

    /// The next thing due: the tick, a publication, a persist.
    fn next_due(&self) -> Due {
        let settled = self.last_input + SETTLE;
        let publish = self
            .unpublished_since
            .map(|t| settled.min(t + PUBLISH_EVERY));
        let persist = self.engine.persist_due().map(|ready| {
            let earliest = self
                .last_persist
                .map_or(self.last_input, |t| t + self.persist_every);
            earliest
                .max(settled.min(earliest + self.persist_every))
                .max(ready)
        });
        let tick = self.last_tick + self.tick;
        let release = self.engine.placement_due_in().map(|d| Instant::now() + d);
        let wake = [Some(tick), publish, persist, release]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(tick);
        Due {
            wake,
            publish,
            persist,
        }
    }

    /// Handles `first` and whatever else is queued behind it (up to
    /// [`BATCH`] inputs); true when the channel disconnected.
    fn burst(&mut self, first: Input, rx: &crossbeam_channel::Receiver<Input>) -> bool {
        self.unpublished_since.get_or_insert_with(Instant::now);
        let mut closed = false;
        let mut next = Some(first);
        let mut handled = 0;
        while let Some(input) = next.take() {
            handled += 1;
            if handled < BATCH {
                match rx.try_recv() {
                    Ok(queued) => next = Some(queued),
                    Err(crossbeam_channel::TryRecvError::Empty) => {}
                    Err(crossbeam_channel::TryRecvError::Disconnected) => closed = true,
                }
            }
            self.dispatch(input, next.is_some());
        }
        if self.engine.activations.len() >= ACTIVATION_BACKLOG {
            self.log_activations();
        }
        self.last_input = Instant::now();
        closed
    }

    /// At shutdown: the inputs already queued are handled, not lost (up to
    /// [`BATCH`]).
    fn drain(&mut self, rx: &crossbeam_channel::Receiver<Input>) {
        for _ in 0..BATCH {
            match rx.try_recv() {
                Ok(input) => self.dispatch(input, true),
                Err(_) => break,
            }
        }
        self.emit();
        self.log_activations();
    }

    /// After a wake: the tick, the publication and the state write that are
    /// due, and the outcomes of the writer thread's finished writes.
    fn catch_up(&mut self, due: &Due) {
        let now = Instant::now();
        if now >= self.last_tick + self.tick {
            self.dispatch(Input::Tick, false);
            self.last_tick = now;
            self.unpublished_since.get_or_insert(now);
        } else {
            self.release_waiting(false);
        }
        if due.publish.is_some_and(|t| now >= t) {
            self.engine.flush_fault_counts();
            self.publish();
            self.unpublished_since = None;
            self.emitted = false;
            self.log_activations();
        }
        if let Some(w) = &self.writer {
            self.engine.background_writes_done(w);
        }
        if due.persist.is_some_and(|t| now >= t) {
            self.last_persist = Some(now);
            self.persist();
        }
    }

    fn publish(&mut self) {
        publish(
            &self.engine,
            &mut self.published,
            &self.registry,
            self.emitted,
        );
    }

    /// The last publication, the final state write (unless the writer is
    /// stuck or the state is not settled) and the sinks' flush.
    fn stop(mut self) {
        // Records waiting for placement go out as they are: the sinks are
        // flushed below.
        self.release_waiting(true);
        let mut writer_stuck = false;
        if let Some(w) = &self.writer {
            writer_stuck = !w.wait_idle(FINAL_WRITE_WAIT);
            self.engine.background_writes_done(w);
        }
        self.engine.flush_fault_counts();
        self.publish();
        self.log_activations();
        // The final write ignores the backoff: it is the last chance.
        self.engine.persist.end_backoff();
        if writer_stuck {
            warn!(
                "The state writer is still blocked in an earlier write; no final state write (records after the last written position are read again at the next start)."
            );
        } else if !self.engine.is_settled() {
            warn!(
                "Kernel-log events beyond the last reported position were handled; keeping the last settled state file (those records are read again at the next start)."
            );
        } else if let Err(e) = self.engine.persist() {
            warn!(error = %e, "Cannot write the health state file at shutdown.");
        }
        for sink in self.sinks {
            sink.flush(Duration::from_secs(2));
        }
        info!("Health engine stopped.");
    }
}

/// Publishes the engine's health when it differs from `published` (timestamps
/// ignored, so an unchanged state is never re-sent). `changed`: events were
/// emitted since the last publication, so the (costly) comparison is skipped.
fn publish(engine: &Engine, published: &mut Arc<NodeHealth>, registry: &Registry, changed: bool) {
    let current = engine.health();
    if Arc::ptr_eq(&current, published)
        || (!changed && health::same_ignoring_timestamps(&current, published))
    {
        return;
    }
    registry.set_health(Arc::clone(&current));
    *published = current;
}
