//! One OTLP log record per fault event: a bounded drop-oldest queue that
//! `send` fills without blocking, and a worker thread that exports batches and
//! retries with exponential backoff while the collector is unreachable.
//!
//! Resources: a record about a pod (the pod whose process caused the fault,
//! else the one pod that held the failed GPU) goes out under a resource of its
//! own: the node's resource plus that pod's `k8s.pod.uid`, `k8s.pod.name`,
//! `k8s.namespace.name`, `k8s.container.name`, `container.id` and controller,
//! so that a collector's `k8sattributes` processor (which associates by
//! resource attributes only) enriches it with the workload's labels. Records
//! without such a pod keep the node's resource. The worker groups each batch
//! by pod and sends one export request per group, setting the exporter's
//! resource before each: no state is kept per pod, so memory stays bounded by
//! the batch size however many pods fault. A group that was accepted is not
//! sent again when a later group of the same batch fails and the batch is
//! retried.
//!
//! Accounting: every event handed to the queue ends up counted exactly once in
//! `gpuwatch.events{stage="otlp_logs"}`: `emitted` when the collector accepted
//! it, `dropped` when it was pushed out of the full queue or left over at
//! shutdown.

use gpuwatch_core::queue::{Settled, SinkQueue};
use gpuwatch_core::{EventSink, Registry, Signal};
use gpuwatch_proto::{FaultEvent, ShortName};
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Unique per sink: tells a retried batch's already accepted records apart.
    id: u64,
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
    rec.add_attribute("gpuwatch.fault.code", i64::from(ev.code));
    match kind {
        gpuwatch_proto::FaultKind::Xid => rec.add_attribute("xid", i64::from(ev.code)),
        gpuwatch_proto::FaultKind::Sxid => rec.add_attribute("sxid", i64::from(ev.code)),
        _ => {}
    }
    if !ev.name.is_empty() {
        rec.add_attribute("gpuwatch.fault.name", ev.name.clone());
    }
    rec.add_attribute("action", ev.action().short_name());
    rec.add_attribute("gpuwatch.severity", sev.short_name());
    if !ev.policy_reason.is_empty() {
        rec.add_attribute("gpuwatch.policy.reason", ev.policy_reason.clone());
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
        rec.add_attribute("gpuwatch.kmsg.seq", i64::try_from(seq).unwrap_or(i64::MAX));
    }
    if let Some(us) = ev.monotonic_usec {
        rec.add_attribute(
            "gpuwatch.kmsg.monotonic_usec",
            i64::try_from(us).unwrap_or(i64::MAX),
        );
    }
    if let Some(f) = ev.facility {
        rec.add_attribute("gpuwatch.kmsg.facility", i64::from(f));
    }
    if let Some(l) = ev.level {
        rec.add_attribute("gpuwatch.kmsg.level", i64::from(l));
    }
    if !ev.boot_id.is_empty() {
        rec.add_attribute("gpuwatch.boot.id", ev.boot_id.clone());
    }
    rec.add_attribute("gpuwatch.source", ev.source().short_name());
    rec.add_attribute("gpuwatch.count", i64::from(ev.count.max(1)));
    for (k, v) in &ev.attributes {
        rec.add_attribute(format!("gpuwatch.{k}"), v.clone());
    }
    add_pods(rec, &ev.pods);
}

/// Every pod that held the failed GPU, in `gpuwatch.affected_pods` (an array
/// of `namespace/name`); the pod the record is about is on its resource
/// ([`pod_resource`]).
fn add_pods(rec: &mut SdkLogRecord, pods: &[gpuwatch_proto::PodRef]) {
    let affected: Vec<AnyValue> = pods
        .iter()
        .filter(|p| p.role() == gpuwatch_proto::PodRole::Affected)
        .map(|p| AnyValue::String(format!("{}/{}", p.namespace, p.name).into()))
        .collect();
    if !affected.is_empty() {
        rec.add_attribute(
            "gpuwatch.affected_pods",
            AnyValue::ListAny(Box::new(affected)),
        );
    }
}

/// The resource attributes of the pod a fault is about, under the
/// OpenTelemetry semantic-convention names (the keys `k8sattributes`
/// associates by and the keys it would add): the pod whose process caused it,
/// else the one pod that held the failed GPU; its controller under the key of
/// its kind (`k8s.job.name`, `k8s.statefulset.name`, …, or
/// `gpuwatch.pod.controller` = `Kind/name` for a kind the conventions do not
/// name). Empty when the fault is about no single pod: the record keeps the
/// node's resource.
pub(crate) fn pod_resource(pods: &[gpuwatch_proto::PodRef]) -> PodAttrs {
    use gpuwatch_proto::PodRole;
    let mut affected = pods.iter().filter(|p| p.role() == PodRole::Affected);
    let only_affected = match (affected.next(), affected.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    };
    let Some(p) = pods
        .iter()
        .find(|p| p.role() == PodRole::Caused)
        .or(only_affected)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, value) in [
        ("k8s.pod.uid", &p.uid),
        ("k8s.pod.name", &p.name),
        ("k8s.namespace.name", &p.namespace),
        ("k8s.container.name", &p.container),
        ("container.id", &p.container_id),
    ] {
        if !value.is_empty() {
            out.push((key, value.clone()));
        }
    }
    if !p.controller_name.is_empty() {
        match controller_key(&p.controller_kind) {
            Some(key) => out.push((key, p.controller_name.clone())),
            None => out.push((
                "gpuwatch.pod.controller",
                format!("{}/{}", p.controller_kind, p.controller_name),
            )),
        }
    }
    out
}

/// The resource of a record: the node's attributes, the pod's on top.
pub(crate) fn record_resource(
    node: &BTreeMap<String, String>,
    pod: &[(&'static str, String)],
) -> Resource {
    let mut attrs = node.clone();
    for (k, v) in pod {
        attrs.insert((*k).to_owned(), v.clone());
    }
    Resource::builder_empty()
        .with_attributes(attrs.into_iter().map(|(k, v)| KeyValue::new(k, v)))
        .build()
}

/// The OpenTelemetry semantic-convention key of a controller's name, by the
/// controller's kind.
const CONTROLLER_KEYS: [(&str, &str); 7] = [
    ("Job", "k8s.job.name"),
    ("CronJob", "k8s.cronjob.name"),
    ("StatefulSet", "k8s.statefulset.name"),
    ("ReplicaSet", "k8s.replicaset.name"),
    ("Deployment", "k8s.deployment.name"),
    ("DaemonSet", "k8s.daemonset.name"),
    ("ReplicationController", "k8s.replicationcontroller.name"),
];

/// The key of a controller's name, by its kind; `None` for a kind the
/// conventions do not name.
fn controller_key(kind: &str) -> Option<&'static str> {
    CONTROLLER_KEYS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, key)| *key)
}

/// Whether [`pod_resource`] may set `key`: it describes one pod. The node's
/// resource never carries such a key, or a record about a pod for which it
/// is unknown (no container name, no controller) would inherit the agent's.
pub(crate) fn is_pod_key(key: &str) -> bool {
    key.starts_with("k8s.pod.")
        || matches!(
            key,
            "k8s.namespace.name"
                | "k8s.container.name"
                | "container.id"
                | "gpuwatch.pod.controller"
        )
        || CONTROLLER_KEYS.iter().any(|(_, k)| *k == key)
}

/// The worker: owns the OTLP log exporter and drains the queue.
pub(crate) struct Worker {
    pub(crate) queue: Arc<LogQueue>,
    pub(crate) settings: QueueSettings,
    pub(crate) registry: Arc<Registry>,
    pub(crate) exporter: opentelemetry_otlp::LogExporter,
    pub(crate) driver: Driver,
    pub(crate) scope: InstrumentationScope,
    /// The node's resource attributes as they are now (the Node's uid joins
    /// them once the kube writer has read it).
    pub(crate) resource: Arc<Mutex<BTreeMap<String, String>>>,
}

/// A pod's resource attributes ([`pod_resource`]; empty: the node's).
type PodAttrs = Vec<(&'static str, String)>;

/// A batch's records grouped by the resource they go out under (the pod's
/// attributes; empty: the node's), in the order each group first appears,
/// leaving out the records a failed try already delivered.
fn group_by_pod<'a>(
    batch: &'a [Arc<Queued>],
    delivered: &HashSet<u64>,
) -> Vec<(PodAttrs, Vec<&'a Queued>)> {
    let mut groups: Vec<(PodAttrs, Vec<&'a Queued>)> = Vec::new();
    for q in batch.iter().filter(|q| !delivered.contains(&q.id)) {
        let pod = pod_resource(&q.event.pods);
        match groups.iter_mut().find(|(p, _)| *p == pod) {
            Some((_, items)) => items.push(q),
            None => groups.push((pod, vec![q])),
        }
    }
    groups
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
    pub(crate) fn run(mut self) {
        // A provider without processors: only used to create records.
        let provider = SdkLoggerProvider::builder().build();
        let logger = provider.logger("gpuwatch");
        let settings = self.settings;
        let mut delays = retry_delays(&settings);
        let mut delay = delays.next().unwrap_or(settings.retry_initial);
        let mut failing = false;
        // Records of the batch at the head that a failed try already
        // delivered (a group before the failing one).
        let mut delivered: HashSet<u64> = HashSet::new();
        while let Some(batch) = self.queue.next_batch(settings.batch_size, settings.linger) {
            delivered.retain(|id| batch.iter().any(|q| q.id == *id));
            let node = self
                .resource
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let mut result = Ok(());
            for (pod, items) in group_by_pod(&batch, &delivered) {
                let records: Vec<SdkLogRecord> = items
                    .iter()
                    .map(|q| {
                        let mut rec = logger.create_log_record();
                        fill_record(&mut rec, &q.event, q.observed);
                        rec
                    })
                    .collect();
                let pairs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
                    records.iter().map(|r| (r, &self.scope)).collect();
                self.exporter.set_resource(&record_resource(&node, &pod));
                match self
                    .driver
                    .block_on(self.exporter.export(LogBatch::new(&pairs)))
                {
                    Ok(()) => delivered.extend(items.iter().map(|q| q.id)),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            match result {
                Ok(()) => {
                    delivered.clear();
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
    /// The id of the next record queued.
    pub(crate) next_id: AtomicU64,
}

impl EventSink for OtlpLogSink {
    fn name(&self) -> &'static str {
        "otlp_logs"
    }

    fn send(&self, event: &FaultEvent) {
        self.queue.push(Queued {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
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
            next_id: AtomicU64::new(0),
        };
        for c in 0..10 {
            sink.send(&ev(c));
        }
        let batch = queue.next_batch(10, Duration::ZERO).unwrap();
        let codes: Vec<u32> = batch.iter().map(|q| q.event.code).collect();
        assert_eq!(codes, vec![6, 7, 8, 9]);
        assert_eq!(reg.events(Stage::OtlpLogs, Outcome::Dropped), 6);
        queue.settle(batch.len(), Settled::Retry);
        queue.stop(gpuwatch_core::queue::Drain::Until(std::time::Instant::now()));
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
        // The pod is on the resource, not on the record.
        assert!(
            attrs
                .keys()
                .all(|k| !k.starts_with("k8s.") && k != "container.id"),
            "{attrs:?}"
        );
        assert!(!attrs.contains_key("gpuwatch.affected_pods"));
        assert!(attrs["action"].contains("inspect_hardware"));
        let pod = pod_resource(&e.pods);
        assert_eq!(
            pod,
            [
                (
                    "k8s.pod.uid",
                    "1f2e3d4c-5b6a-4789-8abc-def012345678".to_owned()
                ),
                ("k8s.pod.name", "trainer-0".to_owned()),
                ("k8s.namespace.name", "ml".to_owned()),
                ("k8s.container.name", "main".to_owned()),
                ("container.id", "4f1c0e8b6a2d".to_owned()),
                ("k8s.job.name", "train-42".to_owned()),
            ]
        );
        let node: BTreeMap<String, String> = [
            ("service.name".to_owned(), "gpuwatch".to_owned()),
            ("k8s.node.name".to_owned(), "n1".to_owned()),
        ]
        .into();
        let res = record_resource(&node, &pod);
        let get = |k: &'static str| res.get(&opentelemetry::Key::from_static_str(k));
        assert_eq!(get("k8s.pod.name"), Some("trainer-0".into()));
        assert_eq!(get("k8s.node.name"), Some("n1".into()));
        assert_eq!(get("service.name"), Some("gpuwatch".into()));
    }

    fn pod(name: &str, role: gpuwatch_proto::PodRole) -> gpuwatch_proto::PodRef {
        gpuwatch_proto::PodRef {
            uid: format!("uid-{name}"),
            name: name.into(),
            namespace: "ml".into(),
            role: role as i32,
            controller_kind: "Widget".into(),
            controller_name: "w".into(),
            ..Default::default()
        }
    }

    /// The pod whose process caused the fault wins; else the one pod that
    /// held the GPU; several holders and no cause: the node's resource.
    #[test]
    fn the_record_is_about_the_causing_pod_else_the_only_holder() {
        use gpuwatch_proto::PodRole::{Affected, Caused};
        let uid = |pods: &[gpuwatch_proto::PodRef]| {
            pod_resource(pods)
                .into_iter()
                .find(|(k, _)| *k == "k8s.pod.uid")
                .map(|(_, v)| v)
        };
        assert_eq!(uid(&[]), None);
        assert_eq!(uid(&[pod("a", Affected)]), Some("uid-a".into()));
        assert_eq!(uid(&[pod("a", Affected), pod("b", Affected)]), None);
        assert_eq!(
            uid(&[pod("a", Affected), pod("b", Caused), pod("c", Affected)]),
            Some("uid-b".into())
        );
        // A controller kind the conventions do not name keeps gpuwatch's key.
        assert!(
            pod_resource(&[pod("a", Affected)])
                .contains(&("gpuwatch.pod.controller", "Widget/w".to_owned()))
        );
    }

    /// One group per pod in first-seen order, the pod-less records together,
    /// records already delivered left out.
    #[test]
    fn a_batch_groups_by_pod_and_skips_the_delivered() {
        use gpuwatch_proto::PodRole::Caused;
        let q = |id: u64, pods: Vec<gpuwatch_proto::PodRef>| {
            Arc::new(Queued {
                id,
                event: FaultEvent {
                    pods,
                    ..Default::default()
                },
                observed: SystemTime::now(),
            })
        };
        let batch = vec![
            q(0, vec![pod("a", Caused)]),
            q(1, vec![]),
            q(2, vec![pod("b", Caused)]),
            q(3, vec![pod("a", Caused)]),
            q(4, vec![]),
        ];
        let ids = |delivered: &HashSet<u64>| -> Vec<Vec<u64>> {
            group_by_pod(&batch, delivered)
                .into_iter()
                .map(|(_, items)| items.iter().map(|q| q.id).collect())
                .collect()
        };
        assert_eq!(ids(&HashSet::new()), [vec![0, 3], vec![1, 4], vec![2]]);
        assert_eq!(ids(&[0, 3, 1].into()), [vec![2], vec![4]]);
    }
}
