//! The reconcile loop: a pass whenever one is wanted and the schedule allows
//! it, a startup-gate validation whenever one is due, and in between a wait
//! for the first input (the health, the Node watch, the validation, the
//! quarantine claimant) or deadline; with its own state ([`ReconcileState`]).

use super::super::backend::ApiError;
use super::super::gate::run_validation;
use super::super::node_watch::Seen;
use super::super::retry::ErrorPolicy;
use super::super::schedule::{Schedule, Wake};
use super::super::settings::KubeSettings;
use super::{Reconciler, STARTUP_UNKNOWN_HOLD, UNSEEN_REREAD_AFTER};
use gpuwatch_core::validation::Expected;
use gpuwatch_proto::ValidationReport;
use std::time::{Duration, SystemTime};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often the loop comes round when it has nothing to do, only to beat
/// its heartbeat.
pub(crate) const WRITER_BEAT: Duration = Duration::from_secs(10);

impl Reconciler {
    /// The loop: a pass whenever one is wanted and the schedule allows it,
    /// a validation whenever the startup gate holds and one is due, and in
    /// between waits for the first of the inputs (health, the Node watch, the
    /// validation, the quarantine claimant) or the next deadline.
    pub(crate) async fn run(mut self) {
        let mut run = ReconcileState::new(&self.cfg, self.quarantine.is_some());
        let progress = self.progress.clone();
        loop {
            progress.beat();
            if self.shutdown.is_triggered() {
                break;
            }
            self.start_validation_if_due(&mut run);
            if run.dirty && run.schedule.is_due(Wake::Pass, Instant::now()) {
                let _pass = progress.begin(std::ffi::OsStr::new("a reconcile pass"));
                self.pass(&mut run).await;
                continue;
            }
            self.plan(&mut run);
            let wake = run.next_wake(self.gate_active());
            tokio::select! {
                () = self.shutdown.triggered() => break,
                r = async {
                    match self.quarantine.as_mut() {
                        Some(q) => q.status_changes().changed().await,
                        None => std::future::pending().await,
                    }
                }, if run.quarantine_open => {
                    // The claimant's answer changes what the taint may be.
                    run.quarantine_open = r.is_ok();
                    run.dirty = true;
                }
                r = self.health_rx.changed(), if run.health_open => {
                    run.health_open = r.is_ok();
                    if r.is_ok() {
                        self.health_changed(run.validation.is_some());
                        run.dirty = true;
                    }
                }
                n = self.node_rx.recv(), if run.nodes_open => match n {
                    Some(seen) => self.node_seen(seen, &mut run),
                    None => run.nodes_open = false,
                },
                r = async { run.validation.as_mut().expect("guarded by is_some").await }, if run.validation.is_some() => {
                    self.validation_done(r, &mut run);
                }
                () = tokio::time::sleep_until(wake) => self.woke(&mut run),
                // Idle: come round only to beat.
                () = tokio::time::sleep(WRITER_BEAT) => {}
            }
        }
        if let Some(v) = run.validation {
            v.abort();
        }
    }

    /// Starts a validation when the gate holds, none runs, none passed and
    /// one is due.
    fn start_validation_if_due(&mut self, run: &mut ReconcileState) {
        let due = run.validation.is_none()
            && self.gate_active()
            && run.schedule.is_due(Wake::Validate, Instant::now());
        if !due || self.gate.passed() {
            return;
        }
        let health = self.health_rx.borrow().clone();
        let expected = self.gate.expected(self.live.as_ref(), &health);
        if let Some(Expected::Gpus(e)) = expected {
            self.metrics
                .publish(|s| s.gpus_expected = Some(u64::from(e)));
        }
        self.gate.validation_started();
        run.validation = Some(tokio::spawn(run_validation(
            health,
            expected,
            self.gate.vcfg().clone(),
        )));
    }

    /// One reconcile pass and what it means for the schedule: paced after a
    /// write, the hold end looked at again when something was held, and after
    /// a failure the error policy's pause with a fresh read of the Node.
    async fn pass(&mut self, run: &mut ReconcileState) {
        let hold = Instant::now() < run.hold_until;
        match self.reconcile(hold).await {
            Ok(pass) => {
                run.dirty = false;
                run.errors.reset();
                if pass.wrote {
                    run.schedule
                        .set(Wake::Pass, Instant::now() + run.min_interval);
                }
                if pass.held {
                    // A health change before then is reconciled as usual.
                    run.schedule.set(Wake::HoldEnds, run.hold_until);
                }
                self.metrics.count_pass(pass.health_updated);
            }
            Err(e) => {
                let pause = run.errors.after(&e);
                let retry_in_ms = pause.as_millis() as u64;
                if matches!(e, ApiError::Conflict(_)) {
                    tracing::info!(node = %self.node_name, error = %e, retry_in_ms, "Node keeps changing under the writer; retrying.");
                } else {
                    tracing::warn!(node = %self.node_name, error = %e, retry_in_ms, "Node reconcile failed; retrying.");
                }
                // Re-read the node next time: our view may be stale.
                self.live = None;
                run.schedule.set(Wake::Pass, Instant::now() + pause);
            }
        }
    }

    /// The deadlines that follow from the state: a re-read once a write set
    /// aside on the watch is old enough, the unadvertised-GPU grace end.
    fn plan(&self, run: &mut ReconcileState) {
        // A watch event was set aside because our own write is still unseen
        // on the watch. If the watch restarted past that write it never shows
        // it, and every later change would wait for UNSEEN_WRITE_LIMIT: re-read
        // the Node once the write is UNSEEN_REREAD_AFTER old (a read then is
        // at least as new as it).
        let reread = self
            .unseen_write
            .as_ref()
            .filter(|_| run.set_aside)
            .map(|(_, at)| *at + UNSEEN_REREAD_AFTER);
        run.schedule.set_opt(Wake::Reread, reread);
        run.schedule
            .set_opt(Wake::Advertised, self.not_advertised.deadline());
        run.schedule
            .set_opt(Wake::FlapHoldEnds, self.flap.deadline(SystemTime::now()));
    }

    /// A Node version from the watcher.
    fn node_seen(&mut self, seen: Seen, run: &mut ReconcileState) {
        let waiting = self.unseen_write.is_some();
        if self.seen(seen) {
            run.dirty = true;
        } else if waiting && self.unseen_write.is_some() {
            run.set_aside = true;
        }
        if self.unseen_write.is_none() {
            run.set_aside = false;
        }
    }

    /// A validation finished: the next one is due an interval later (at once
    /// when its result was stale and dropped).
    fn validation_done(
        &mut self,
        r: Result<ValidationReport, tokio::task::JoinError>,
        run: &mut ReconcileState,
    ) {
        run.validation = None;
        run.schedule
            .set(Wake::Validate, Instant::now() + run.validation_interval);
        match r {
            Ok(report) => {
                let stale = self.gate.spoiled() && report.passed;
                self.record_validation(report);
                if stale && self.gate.report().is_none() {
                    run.schedule.set(Wake::Validate, Instant::now());
                }
            }
            Err(e) => tracing::warn!(error = %e, "Validation task failed."),
        }
        run.dirty = true;
    }

    /// Deadlines passed: each reason's own step, then a pass.
    fn woke(&mut self, run: &mut ReconcileState) {
        let now = Instant::now();
        for why in run.schedule.take_due(now) {
            match why {
                Wake::Reread => {
                    run.set_aside = false;
                    self.unseen_write = None;
                    if !self.backend.is_dry_run() {
                        self.live = None;
                    }
                }
                Wake::Resync => {
                    run.schedule.set(Wake::Resync, now + run.resync);
                    if !self.backend.is_dry_run() {
                        self.live = None;
                    }
                }
                Wake::HoldEnds
                | Wake::Advertised
                | Wake::FlapHoldEnds
                | Wake::Pass
                | Wake::Validate => {}
            }
            run.dirty = true;
        }
    }
}

/// The reconcile loop's own state: the schedule, the error policy, what is open.
struct ReconcileState {
    schedule: Schedule,
    /// A failed pass's pause; a taint write's lost races are retried soon.
    errors: ErrorPolicy,
    /// A pass is wanted (something changed since the last one).
    dirty: bool,
    /// A watch event was set aside while our own write was unseen on it.
    set_aside: bool,
    validation: Option<JoinHandle<ValidationReport>>,
    /// Until then a move to Unknown is held back (see [`STARTUP_UNKNOWN_HOLD`]).
    hold_until: Instant,
    min_interval: Duration,
    resync: Duration,
    validation_interval: Duration,
    health_open: bool,
    nodes_open: bool,
    quarantine_open: bool,
}

impl ReconcileState {
    fn new(cfg: &KubeSettings, quarantine: bool) -> ReconcileState {
        let now = Instant::now();
        let resync = cfg.api.resync;
        let mut schedule = Schedule::default();
        schedule.set(Wake::Pass, now);
        schedule.set(Wake::Validate, now);
        schedule.set(Wake::Resync, now + resync);
        ReconcileState {
            schedule,
            errors: ErrorPolicy::new(cfg.api.backoff_initial, cfg.api.backoff_max)
                .retrying_lost_races_soon(),
            dirty: true,
            set_aside: false,
            validation: None,
            hold_until: now + STARTUP_UNKNOWN_HOLD,
            min_interval: cfg.api.min_write_interval,
            resync,
            validation_interval: cfg.gate.validation_interval,
            health_open: true,
            nodes_open: true,
            quarantine_open: quarantine,
        }
    }

    /// When the loop wakes at the latest: a pass only while one is wanted, a
    /// validation only while the gate holds and none runs.
    fn next_wake(&self, gate_active: bool) -> Instant {
        let validating = self.validation.is_some();
        self.schedule
            .next(|w| match w {
                Wake::Pass => self.dirty,
                Wake::Validate => gate_active && !validating,
                _ => true,
            })
            .unwrap_or_else(|| Instant::now() + self.resync)
    }
}
