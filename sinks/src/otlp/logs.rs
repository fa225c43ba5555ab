//! One OTLP log record per fault event: a bounded drop-oldest queue that
//! `send` fills without blocking, and a worker thread that exports batches and
//! retries with exponential backoff while the collector is unreachable.
//!
//! Accounting: every event handed to the queue ends up counted exactly once in
//! `gpuwatch.events{stage="otlp_logs"}`: `emitted` when the collector accepted
//! it, `dropped` when it was pushed out of the full queue or left over at
//! shutdown.

use gpuwatch_core::{EventSink, Outcome, Registry, Signal, Stage};
use gpuwatch_proto::{FaultEvent, ShortName};
use opentelemetry::InstrumentationScope;
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// Queue and batching settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueSettings {
    pub(crate) capacity: usize,
    pub(crate) batch_size: usize,
    pub(crate) linger: Duration,
    pub(crate) retry_initial: Duration,
    pub(crate) retry_max: Duration,
}

struct Queued {
    id: u64,
    event: FaultEvent,
    observed: SystemTime,
}

#[derive(Default)]
struct State {
    items: VecDeque<Arc<Queued>>,
    next_id: u64,
    /// Highest id of the batch being exported, if any.
    inflight_upto: Option<u64>,
    /// Records of the in-flight batch that overflow pushed out of the queue:
    /// emitted if the export succeeds, dropped if it fails.
    dropped_inflight: u64,
    flush_requested: bool,
    shutdown: Option<Instant>,
    finished: bool,
}

/// The queue shared by the sink (producer) and the worker (consumer).
pub(crate) struct LogQueue {
    state: Mutex<State>,
    /// Wakes the worker (new records, flush, shutdown).
    work: Condvar,
    /// Wakes `flush` / `shutdown` waiters (queue drained, worker finished).
    idle: Condvar,
    settings: QueueSettings,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for LogQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogQueue")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl LogQueue {
    pub(crate) fn new(settings: QueueSettings, registry: Arc<Registry>) -> Arc<LogQueue> {
        Arc::new(LogQueue {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            settings,
            registry,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues one event; never blocks beyond a short mutex hold. When full,
    /// the oldest record is dropped and counted.
    pub(crate) fn push(&self, event: &FaultEvent) {
        let observed = SystemTime::now();
        let mut st = self.lock();
        if st.shutdown.is_some() {
            drop(st);
            self.registry
                .count_events(Stage::OtlpLogs, Outcome::Dropped, 1);
            return;
        }
        if st.items.len() >= self.settings.capacity
            && let Some(old) = st.items.pop_front()
        {
            if st.inflight_upto.is_some_and(|upto| old.id <= upto) {
                st.dropped_inflight += 1;
            } else {
                self.registry
                    .count_events(Stage::OtlpLogs, Outcome::Dropped, 1);
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        st.items.push_back(Arc::new(Queued {
            id,
            event: event.clone(),
            observed,
        }));
        let len = st.items.len();
        drop(st);
        if len == 1 || len >= self.settings.batch_size {
            self.work.notify_one();
        }
    }

    /// Records waiting (not yet acknowledged by the collector).
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Asks the worker to send now and waits until the queue is empty or `timeout`.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        st.flush_requested = true;
        self.work.notify_one();
        while !(st.finished || st.items.is_empty() && st.inflight_upto.is_none()) {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .idle
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.items.is_empty()
    }

    /// Tells the worker to make a last attempt until `deadline`, then waits for it.
    pub(crate) fn shutdown(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        st.shutdown = Some(deadline);
        self.work.notify_all();
        while !st.finished {
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!("OTLP log worker did not stop in time; abandoning it.");
                return;
            }
            st = self
                .idle
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Tells the worker to stop (at once, counting what is left as dropped)
    /// without waiting for it.
    pub(crate) fn request_stop(&self) {
        let mut st = self.lock();
        if st.shutdown.is_none() {
            st.shutdown = Some(Instant::now());
        }
        self.work.notify_all();
    }

    /// Waits for a batch to send; `None` when the worker should stop.
    fn next_batch(&self) -> Option<Vec<Arc<Queued>>> {
        let mut st = self.lock();
        let mut first_seen: Option<Instant> = None;
        loop {
            if st.shutdown.is_some() {
                if st.items.is_empty() || st.shutdown.is_some_and(|d| Instant::now() >= d) {
                    return None;
                }
                break;
            }
            if st.items.is_empty() {
                first_seen = None;
                st.flush_requested = false;
                self.idle.notify_all();
                st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let since = *first_seen.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            if st.items.len() >= self.settings.batch_size
                || st.flush_requested
                || waited >= self.settings.linger
            {
                break;
            }
            st = self
                .work
                .wait_timeout(st, self.settings.linger - waited)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let batch: Vec<_> = st
            .items
            .iter()
            .take(self.settings.batch_size)
            .cloned()
            .collect();
        st.inflight_upto = batch.last().map(|q| q.id);
        st.dropped_inflight = 0;
        Some(batch)
    }

    /// Settles the in-flight batch after the export.
    fn finish_batch(&self, batch_len: usize, ok: bool) {
        let mut st = self.lock();
        let upto = st.inflight_upto.take();
        let dropped_inflight = std::mem::take(&mut st.dropped_inflight);
        if ok {
            if let Some(upto) = upto {
                while st.items.front().is_some_and(|q| q.id <= upto) {
                    st.items.pop_front();
                }
            }
            self.registry
                .count_events(Stage::OtlpLogs, Outcome::Emitted, batch_len as u64);
        } else if dropped_inflight > 0 {
            self.registry
                .count_events(Stage::OtlpLogs, Outcome::Dropped, dropped_inflight);
        }
        if st.items.is_empty() {
            self.idle.notify_all();
        }
    }

    /// Sleeps for the backoff delay unless shutdown comes first. Returns false
    /// when the worker should stop.
    fn backoff(&self, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        let mut st = self.lock();
        loop {
            if let Some(deadline) = st.shutdown {
                // One last try if there is time left before the deadline.
                return Instant::now() < deadline;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            st = self
                .work
                .wait_timeout(st, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Counts everything left as dropped and marks the worker finished.
    fn finish(&self) {
        let mut st = self.lock();
        let left = st.items.len() as u64;
        st.items.clear();
        if left > 0 {
            self.registry
                .count_events(Stage::OtlpLogs, Outcome::Dropped, left);
            tracing::warn!(records = left, "OTLP log records lost at shutdown.");
        }
        st.finished = true;
        self.idle.notify_all();
    }
}

/// Runs an export future to completion on the current thread.
pub(crate) enum Driver {
    /// gRPC: tonic's connection lives on the tokio runtime.
    Runtime(tokio::runtime::Handle),
    /// HTTP: the blocking reqwest client must run outside any runtime.
    Park,
}

impl Driver {
    fn block_on<F: Future>(&self, fut: F) -> F::Output {
        match self {
            Driver::Runtime(h) => h.block_on(fut),
            Driver::Park => futures::executor::block_on(fut),
        }
    }
}

fn severity(number: i32) -> Option<Severity> {
    Some(match number {
        9 => Severity::Info,
        13 => Severity::Warn,
        17 => Severity::Error,
        21 => Severity::Fatal,
        _ => return None,
    })
}

fn nanos_to_time(n: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(n)
}

/// Fills one log record from a fault event.
pub(crate) fn fill_record(rec: &mut SdkLogRecord, ev: &FaultEvent, observed: SystemTime) {
    rec.set_event_name("gpuwatch.fault");
    if let Some(t) = ev.time_unix_nano {
        rec.set_timestamp(nanos_to_time(t));
    }
    rec.set_observed_timestamp(observed);
    let sev = ev.severity();
    if let Some(s) = severity(sev.otel_number()) {
        rec.set_severity_number(s);
        rec.set_severity_text(sev.otel_text());
    }
    rec.set_body(AnyValue::from(ev.message.clone()));
    let kind = ev.kind();
    rec.add_attribute("fault.kind", kind.short_name());
    rec.add_attribute("code", i64::from(ev.code));
    match kind {
        gpuwatch_proto::FaultKind::Xid => rec.add_attribute("xid", i64::from(ev.code)),
        gpuwatch_proto::FaultKind::Sxid => rec.add_attribute("sxid", i64::from(ev.code)),
        _ => {}
    }
    if !ev.name.is_empty() {
        rec.add_attribute("fault.name", ev.name.clone());
    }
    rec.add_attribute("action", ev.action().short_name());
    rec.add_attribute("severity", sev.short_name());
    if !ev.policy_reason.is_empty() {
        rec.add_attribute("policy.reason", ev.policy_reason.clone());
    }
    if !ev.pci_address.is_empty() {
        rec.add_attribute("gpu.pci.address", ev.pci_address.clone());
    }
    if !ev.gpu_uuid.is_empty() {
        rec.add_attribute("gpu.uuid", ev.gpu_uuid.clone());
    }
    if let Some(i) = ev.gpu_index {
        rec.add_attribute("gpu.index", i64::from(i));
    }
    if let Some(pid) = ev.pid {
        rec.add_attribute("process.pid", i64::from(pid));
    }
    if !ev.process.is_empty() {
        rec.add_attribute("process.executable.name", ev.process.clone());
    }
    if let Some(seq) = ev.kmsg_seq {
        rec.add_attribute("kmsg.seq", i64::try_from(seq).unwrap_or(i64::MAX));
    }
    if let Some(us) = ev.monotonic_usec {
        rec.add_attribute("kmsg.monotonic_usec", i64::try_from(us).unwrap_or(i64::MAX));
    }
    if let Some(f) = ev.facility {
        rec.add_attribute("kmsg.facility", i64::from(f));
    }
    if let Some(l) = ev.level {
        rec.add_attribute("kmsg.level", i64::from(l));
    }
    if !ev.boot_id.is_empty() {
        rec.add_attribute("host.boot.id", ev.boot_id.clone());
    }
    rec.add_attribute("source", ev.source().short_name());
    rec.add_attribute("count", i64::from(ev.count.max(1)));
    for (k, v) in &ev.attributes {
        rec.add_attribute(format!("gpuwatch.{k}"), v.clone());
    }
    add_pods(rec, &ev.pods);
}

/// The fault's pod under the OpenTelemetry semantic-convention names (so a
/// backend joins it with its other Kubernetes data): the pod whose process
/// caused it, else the one pod that held the failed GPU, with its
/// controller under the key of its kind (`k8s.job.name`,
/// `k8s.statefulset.name`, `k8s.replicaset.name`, …). Every pod that held
/// it is listed in `gpuwatch.affected_pods` (an array of `namespace/name`).
fn add_pods(rec: &mut SdkLogRecord, pods: &[gpuwatch_proto::PodRef]) {
    use gpuwatch_proto::PodRole;
    let affected: Vec<&gpuwatch_proto::PodRef> = pods
        .iter()
        .filter(|p| p.role() == PodRole::Affected)
        .collect();
    let main = pods
        .iter()
        .find(|p| p.role() == PodRole::Caused)
        .or(match affected.as_slice() {
            [one] => Some(*one),
            _ => None,
        });
    if let Some(p) = main {
        for (key, value) in [
            ("k8s.pod.uid", &p.uid),
            ("k8s.pod.name", &p.name),
            ("k8s.namespace.name", &p.namespace),
            ("k8s.container.name", &p.container),
            ("container.id", &p.container_id),
        ] {
            if !value.is_empty() {
                rec.add_attribute(key, value.clone());
            }
        }
        if !p.controller_name.is_empty() {
            match controller_key(&p.controller_kind) {
                Some(key) => rec.add_attribute(key, p.controller_name.clone()),
                None => rec.add_attribute(
                    "gpuwatch.pod.controller",
                    format!("{}/{}", p.controller_kind, p.controller_name),
                ),
            }
        }
    }
    if !affected.is_empty() {
        let list: Vec<AnyValue> = affected
            .iter()
            .map(|p| AnyValue::String(format!("{}/{}", p.namespace, p.name).into()))
            .collect();
        rec.add_attribute("gpuwatch.affected_pods", AnyValue::ListAny(Box::new(list)));
    }
}

/// The OpenTelemetry semantic-convention key of a controller's name, by its
/// kind; `None` for a kind the conventions do not name.
fn controller_key(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Job" => "k8s.job.name",
        "CronJob" => "k8s.cronjob.name",
        "StatefulSet" => "k8s.statefulset.name",
        "ReplicaSet" => "k8s.replicaset.name",
        "Deployment" => "k8s.deployment.name",
        "DaemonSet" => "k8s.daemonset.name",
        "ReplicationController" => "k8s.replicationcontroller.name",
        _ => return None,
    })
}

/// The worker: owns the OTLP log exporter and drains the queue.
pub(crate) struct Worker {
    pub(crate) queue: Arc<LogQueue>,
    pub(crate) exporter: opentelemetry_otlp::LogExporter,
    pub(crate) driver: Driver,
    pub(crate) scope: InstrumentationScope,
}

/// Retry delays after failed log exports: doubling from `retry_initial` up
/// to `retry_max`, each with random jitter (backon's: up to the delay again),
/// so a fleet whose collector comes back does not retry in lock step.
fn retry_delays(settings: &QueueSettings) -> impl Iterator<Item = Duration> + use<> {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_min_delay(settings.retry_initial)
        .with_max_delay(settings.retry_max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

impl Worker {
    pub(crate) fn run(self) {
        // A provider without processors: only used to create records.
        let provider = SdkLoggerProvider::builder().build();
        let logger = provider.logger("gpuwatch");
        let settings = self.queue.settings;
        let mut delays = retry_delays(&settings);
        let mut delay = delays.next().unwrap_or(settings.retry_initial);
        let mut failing = false;
        while let Some(batch) = self.queue.next_batch() {
            let records: Vec<SdkLogRecord> = batch
                .iter()
                .map(|q| {
                    let mut rec = logger.create_log_record();
                    fill_record(&mut rec, &q.event, q.observed);
                    rec
                })
                .collect();
            let pairs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
                records.iter().map(|r| (r, &self.scope)).collect();
            let result = self
                .driver
                .block_on(self.exporter.export(LogBatch::new(&pairs)));
            match result {
                Ok(()) => {
                    self.queue.finish_batch(batch.len(), true);
                    if failing {
                        tracing::info!("OTLP log export recovered.");
                    }
                    failing = false;
                    delays = retry_delays(&settings);
                    delay = delays.next().unwrap_or(settings.retry_initial);
                }
                Err(e) => {
                    self.queue.finish_batch(batch.len(), false);
                    self.queue.registry.count_export_failure(Signal::Logs);
                    if !failing {
                        tracing::warn!(error = %e, queued = self.queue.len(), retry_in_ms = delay.as_millis() as u64, "OTLP log export failed; retrying with backoff.");
                    } else {
                        tracing::debug!(error = %e, retry_in_ms = delay.as_millis() as u64, "OTLP log export failed again.");
                    }
                    failing = true;
                    // Shutting down: that was the last try.
                    if self.queue.lock().shutdown.is_some() || !self.queue.backoff(delay) {
                        break;
                    }
                    delay = delays.next().unwrap_or(settings.retry_max);
                }
            }
        }
        self.queue.finish();
        let _ = provider.shutdown();
    }
}

/// The [`EventSink`] face of the queue.
pub(crate) struct OtlpLogSink {
    pub(crate) queue: Arc<LogQueue>,
}

impl EventSink for OtlpLogSink {
    fn name(&self) -> &'static str {
        "otlp_logs"
    }

    fn send(&self, event: &FaultEvent) {
        self.queue.push(event);
    }

    fn flush(&self, timeout: Duration) {
        if !self.queue.flush(timeout) {
            tracing::warn!(
                queued = self.queue.len(),
                "OTLP log records still queued after flush timeout."
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(capacity: usize) -> QueueSettings {
        QueueSettings {
            capacity,
            batch_size: 3,
            linger: Duration::from_millis(1),
            retry_initial: Duration::from_millis(1),
            retry_max: Duration::from_millis(4),
        }
    }

    fn ev(code: u32) -> FaultEvent {
        FaultEvent {
            code,
            ..Default::default()
        }
    }

    #[test]
    fn retry_delays_double_up_to_the_max_with_jitter() {
        let s = QueueSettings {
            retry_initial: Duration::from_millis(1000),
            retry_max: Duration::from_millis(30_000),
            ..settings(1)
        };
        // Without jitter: 1, 2, 4, 8, 16, 30, 30, ... s; jitter adds up to as much again.
        let bare = [1, 2, 4, 8, 16, 30, 30, 30u64];
        let mut differ = false;
        for _ in 0..20 {
            let got: Vec<Duration> = retry_delays(&s).take(bare.len()).collect();
            for (d, b) in got.iter().zip(bare) {
                let b = Duration::from_secs(b);
                assert!(*d >= b && *d <= b * 2, "{d:?} outside [{b:?}, {:?}]", b * 2);
            }
            differ |= got != retry_delays(&s).take(bare.len()).collect::<Vec<_>>();
        }
        assert!(differ, "two agents would retry in lock step");
        // The sequence never ends while the collector stays away.
        assert_eq!(retry_delays(&s).take(1000).count(), 1000);
    }

    fn codes(q: &LogQueue) -> Vec<u32> {
        q.lock().items.iter().map(|i| i.event.code).collect()
    }

    /// A fresh registry and a queue of `capacity` holding events `0..n`.
    fn filled(capacity: usize, n: u32) -> (Arc<Registry>, Arc<LogQueue>) {
        let reg = Registry::new();
        let q = LogQueue::new(settings(capacity), reg.clone());
        for c in 0..n {
            q.push(&ev(c));
        }
        (reg, q)
    }

    #[test]
    fn drop_oldest_beyond_the_bound_and_count_each_drop() {
        let (reg, q) = filled(4, 10);
        assert_eq!(codes(&q), vec![6, 7, 8, 9]);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 6);
    }

    #[test]
    fn successful_batch_is_emitted_and_removed() {
        let (reg, q) = filled(10, 5);
        let b = q.next_batch().unwrap();
        assert_eq!(b.len(), 3);
        q.finish_batch(b.len(), true);
        assert_eq!(codes(&q), vec![3, 4]);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Emitted), 3);
    }

    #[test]
    fn failed_batch_stays_at_the_head() {
        let (reg, q) = filled(10, 4);
        let b = q.next_batch().unwrap();
        q.finish_batch(b.len(), false);
        assert_eq!(codes(&q), vec![0, 1, 2, 3]);
        let again = q.next_batch().unwrap();
        assert_eq!(
            again.iter().map(|i| i.event.code).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Emitted), 0);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 0);
    }

    #[test]
    fn overflow_during_export_is_counted_once() {
        // Capacity 3, batch of 3 in flight, 2 more pushed: the 2 oldest (in flight)
        // leave the queue. Success: all 3 in flight were delivered -> emitted.
        let (reg, q) = filled(3, 3);
        let b = q.next_batch().unwrap();
        q.push(&ev(3));
        q.push(&ev(4));
        q.finish_batch(b.len(), true);
        assert_eq!(codes(&q), vec![3, 4]);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Emitted), 3);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 0);

        // Failure: the pushed-out in-flight records are lost -> dropped.
        let (reg, q) = filled(3, 3);
        let b = q.next_batch().unwrap();
        q.push(&ev(3));
        q.push(&ev(4));
        q.finish_batch(b.len(), false);
        assert_eq!(codes(&q), vec![2, 3, 4]);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Emitted), 0);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 2);
    }

    #[test]
    fn shutdown_counts_leftovers_as_dropped_and_rejects_new_sends() {
        let reg = Registry::new();
        let q = LogQueue::new(settings(10), reg.clone());
        q.push(&ev(1));
        q.push(&ev(2));
        q.lock().shutdown = Some(Instant::now());
        assert!(q.next_batch().is_none());
        q.finish();
        q.push(&ev(3));
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 3);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn record_carries_event_fields() {
        let provider = SdkLoggerProvider::builder().build();
        let logger = provider.logger("t");
        let mut rec = logger.create_log_record();
        let mut e = FaultEvent {
            code: 79,
            message: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.".into(),
            pid: Some(1234),
            gpu_index: Some(1),
            time_unix_nano: Some(1_700_000_000_000_000_000),
            count: 2,
            attributes: [("channel".to_owned(), "0x00000008".to_owned())].into(),
            pods: vec![gpuwatch_proto::PodRef {
                uid: "1f2e3d4c-5b6a-4789-8abc-def012345678".into(),
                name: "trainer-0".into(),
                namespace: "ml".into(),
                container: "main".into(),
                container_id: "4f1c0e8b6a2d".into(),
                role: gpuwatch_proto::PodRole::Caused as i32,
                controller_kind: "Job".into(),
                controller_name: "train-42".into(),
            }],
            ..Default::default()
        };
        e.set_kind(gpuwatch_proto::FaultKind::Xid);
        e.classify(gpuwatch_proto::Action::InspectHardware, "xid 79 table");
        fill_record(&mut rec, &e, SystemTime::now());
        assert_eq!(rec.severity_number(), Some(Severity::Fatal));
        assert_eq!(rec.severity_text(), Some("FATAL"));
        assert_eq!(
            rec.timestamp(),
            Some(nanos_to_time(1_700_000_000_000_000_000))
        );
        let attrs: std::collections::HashMap<String, String> = rec
            .attributes_iter()
            .map(|(k, v)| (k.to_string(), format!("{v:?}")))
            .collect();
        assert!(attrs["xid"].contains("79"));
        assert!(attrs["process.pid"].contains("1234"));
        assert!(attrs["gpuwatch.channel"].contains("0x00000008"));
        // Semantic-convention keys keep their names.
        assert!(attrs["k8s.pod.uid"].contains("1f2e3d4c"));
        assert!(attrs["k8s.pod.name"].contains("trainer-0"));
        assert!(attrs["k8s.namespace.name"].contains("ml"));
        assert!(attrs["k8s.container.name"].contains("main"));
        assert!(attrs["k8s.job.name"].contains("train-42"));
        assert!(attrs["container.id"].contains("4f1c0e8b6a2d"));
        assert!(!attrs.contains_key("gpuwatch.affected_pods"));
        assert!(attrs["action"].contains("inspect_hardware"));
    }
}
