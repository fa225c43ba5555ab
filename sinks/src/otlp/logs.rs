//! One OTLP log record per fault event: a bounded drop-oldest queue that
//! `send` fills without blocking, and a worker thread that exports batches and
//! retries with exponential backoff while the collector is unreachable.
//!
//! Accounting: every event handed to the queue ends up counted exactly once in
//! `gpuwatch.events{stage="otlp_logs"}`: `emitted` when the collector accepted
//! it, `dropped` when it was pushed out of the full queue or left over at
//! shutdown.

use crate::queue::{Settled, SinkQueue};
use gpuwatch_core::{EventSink, Registry, Signal};
use gpuwatch_proto::{FaultEvent, ShortName};
use opentelemetry::InstrumentationScope;
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The log queue's bound and the export worker's batching and retries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueSettings {
    /// Records queued at most (the oldest go first).
    pub(crate) capacity: usize,
    pub(crate) batch_size: usize,
    pub(crate) linger: Duration,
    pub(crate) retry_initial: Duration,
    pub(crate) retry_max: Duration,
}

/// A fault event waiting for export, with when the sink was handed it (the
/// record's observed time).
pub(crate) struct Queued {
    event: FaultEvent,
    observed: SystemTime,
}

/// The log records waiting for the collector: what `send` fills and the
/// worker drains.
pub(crate) type LogQueue = SinkQueue<Queued>;

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
    pub(crate) settings: QueueSettings,
    pub(crate) registry: Arc<Registry>,
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
        let settings = self.settings;
        let mut delays = retry_delays(&settings);
        let mut delay = delays.next().unwrap_or(settings.retry_initial);
        let mut failing = false;
        while let Some(batch) = self.queue.next_batch(settings.batch_size, settings.linger) {
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
                    self.queue.settle(
                        batch.len(),
                        Settled::Done {
                            written: batch.len(),
                        },
                    );
                    if failing {
                        tracing::info!("OTLP log export recovered.");
                    }
                    failing = false;
                    delays = retry_delays(&settings);
                    delay = delays.next().unwrap_or(settings.retry_initial);
                }
                Err(e) => {
                    self.queue.settle(batch.len(), Settled::Retry);
                    self.registry.count_export_failure(Signal::Logs);
                    if !failing {
                        tracing::warn!(error = %e, queued = self.queue.len(), retry_in_ms = delay.as_millis() as u64, "OTLP log export failed; retrying with backoff.");
                    } else {
                        tracing::debug!(error = %e, retry_in_ms = delay.as_millis() as u64, "OTLP log export failed again.");
                    }
                    failing = true;
                    // Shutting down: that was the last try.
                    if self.queue.stopping() || !self.queue.backoff(delay) {
                        break;
                    }
                    delay = delays.next().unwrap_or(settings.retry_max);
                }
            }
        }
        let left = self.queue.finish();
        if left > 0 {
            tracing::warn!(records = left, "OTLP log records lost at shutdown.");
        }
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
        self.queue.push(Queued {
            event: event.clone(),
            observed: SystemTime::now(),
        });
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
    use gpuwatch_core::{Outcome, Stage};

    fn settings() -> QueueSettings {
        QueueSettings {
            capacity: 1,
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
            ..settings()
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

    /// The sink face counts at the OTLP logs stage: a full queue drops the
    /// oldest; after the stop every send is dropped.
    #[test]
    fn the_sink_counts_drops_at_its_stage() {
        let reg = Registry::new();
        let queue = Arc::new(LogQueue::new(4, Stage::OtlpLogs, reg.clone()));
        let sink = OtlpLogSink {
            queue: queue.clone(),
        };
        for c in 0..10 {
            sink.send(&ev(c));
        }
        let batch = queue.next_batch(10, Duration::ZERO).unwrap();
        let codes: Vec<u32> = batch.iter().map(|q| q.event.code).collect();
        assert_eq!(codes, vec![6, 7, 8, 9]);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 6);
        queue.settle(batch.len(), Settled::Retry);
        queue.stop(crate::queue::Drain::Until(std::time::Instant::now()));
        sink.send(&ev(10));
        assert!(queue.next_batch(10, Duration::ZERO).is_none());
        assert_eq!(queue.finish(), 4);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 11);
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
