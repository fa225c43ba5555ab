//! What the node writer's tests share: a writer started against its own
//! API-server double (`kube_common`, on 127.0.0.1:0) with the callbacks the
//! agent gives it recorded, the Node and health builders bound to [`NODE`],
//! and the names the writer uses by default. The `writer_*` modules glob
//! this one in.
//!
//! "Nothing was written" is checked once the writer says it has acted on
//! the input, not after a fixed sleep: every health the harness publishes
//! carries a fresh update time, and [`Harness::reconciled`] waits until a
//! completed reconcile pass brought the Node to that health
//! (`KubeMetrics::reconciled_health_unix_nano`); [`Harness::pass_after`]
//! waits for a pass that acted on a validation report (or on a change to
//! the Node).

pub(crate) use crate::kube_common::build::{taint, with_fault, with_mig, xid_event};
pub(crate) use crate::kube_common::{
    ApiDouble, Recorded, condition, taint_keys, taint_value, wait_for,
};
pub(crate) use gpuwatch_core::placement::PlacementUpdate;
pub(crate) use gpuwatch_core::validation::ValidationSettings;
pub(crate) use gpuwatch_kube::{
    KubeClient, KubeConfig, KubeMetrics, KubeObject, NodeWriter, PlacementCallback, PodListing,
    ValidationCallback, ValidationResult, WriteResult, WriterHooks,
};
pub(crate) use gpuwatch_proto::{Action, NodeHealth, ValidationReport};
pub(crate) use k8s_openapi::api::core::v1::{Node, Taint};
pub(crate) use std::path::{Path, PathBuf};
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::{Duration, Instant, SystemTime};
pub(crate) use tokio::sync::watch;

pub(crate) const NODE: &str = "gpu-node-1";
pub(crate) const READY: &str = "AcceleratedHardwareReady";
pub(crate) const PROBLEM: &str = "GPUProblem";
pub(crate) const FAULT_TAINT: &str = "gpuwatch.io/unhealthy";
pub(crate) const STARTUP_TAINT: &str =
    "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready";
/// How long a test waits for the writer to converge.
pub(crate) const SECS: Duration = Duration::from_secs(5);

/// The Node [`NODE`] with `taints` and `labels` (see `build::node`).
pub(crate) fn node(taints: Vec<Taint>, labels: &[(&str, &str)]) -> Node {
    crate::kube_common::build::node(NODE, taints, labels)
}

/// [`NODE`]'s health with `n` healthy GPUs in boot `boot`.
pub(crate) fn healthy(n: u32, boot: &str) -> NodeHealth {
    gpuwatch_test_support::health::healthy(NODE, n, boot)
}

/// A health as the harness published it: its update time
/// (`NodeHealth::updated_unix_nano`), later than every earlier one's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Published(u64);

/// What [`KubeMetrics::reconcile_passes`] counted at some moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Passes(u64);

/// A running writer (and, when asked for, the pod listing beside it, on the
/// same client, as the agent runs them), its double, and what they told the
/// agent.
pub(crate) struct Harness {
    pub(crate) api: ApiDouble,
    tx: watch::Sender<Arc<NodeHealth>>,
    pub(crate) writer: Option<NodeWriter>,
    listing: Option<PodListing>,
    pub(crate) metrics: Arc<KubeMetrics>,
    /// Every report the writer handed to `on_validation`, with the
    /// completed reconcile passes counted when it was handed over. The
    /// callback runs on the reconcile loop's task: between passes (a
    /// validation finished, the health or the Node changed), and the next
    /// pass acts on the report; or inside a pass (the gate judged the health
    /// or the DRA devices again), which acts on it itself.
    reports: Arc<Mutex<Vec<(ValidationReport, Passes)>>>,
    /// The update time of the latest health published.
    published: Mutex<u64>,
    /// The health the writer started with.
    pub(crate) initial: Published,
    /// Every update the pod listing handed over.
    pub(crate) placements: Arc<Mutex<Vec<PlacementUpdate>>>,
    /// What the engine wakes to ask the pod listing for a fresh list.
    pub(crate) pods_ask: Arc<tokio::sync::Notify>,
    /// The pod listing's stop signal (the agent's inputs share theirs).
    pods_shutdown: gpuwatch_core::Shutdown,
    /// The reconcile loop's heartbeat.
    pub(crate) progress: Arc<gpuwatch_core::heartbeat::Progress>,
}

impl Harness {
    /// A writer with the double's test settings against a double serving `n`.
    pub(crate) async fn start(n: Node, health: NodeHealth) -> Harness {
        let api = ApiDouble::start(n).await;
        Harness::start_with_api(api, health).await
    }

    /// A writer with the double's test settings against `api`.
    pub(crate) async fn start_with_api(api: ApiDouble, health: NodeHealth) -> Harness {
        let cfg = api.kube_config();
        Harness::with(api, cfg, ValidationSettings::default(), health).await
    }

    pub(crate) async fn with(
        api: ApiDouble,
        cfg: KubeConfig,
        vcfg: ValidationSettings,
        health: NodeHealth,
    ) -> Harness {
        Harness::start_writer(api, cfg, vcfg, health, false, None).await
    }

    /// A writer, and the pod listing into `placements`.
    pub(crate) async fn with_listing(api: ApiDouble, health: NodeHealth) -> Harness {
        let cfg = api.kube_config();
        Harness::start_writer(api, cfg, ValidationSettings::default(), health, true, None).await
    }

    /// A writer that keeps its history in `state_dir`, as the agent does.
    pub(crate) async fn with_state(
        api: ApiDouble,
        cfg: KubeConfig,
        health: NodeHealth,
        state_dir: &Path,
    ) -> Harness {
        let dir = Some(state_dir.to_path_buf());
        Harness::start_writer(api, cfg, ValidationSettings::default(), health, false, dir).await
    }

    async fn start_writer(
        api: ApiDouble,
        cfg: KubeConfig,
        vcfg: ValidationSettings,
        health: NodeHealth,
        pods: bool,
        state_dir: Option<PathBuf>,
    ) -> Harness {
        let mut health = health;
        let initial = stamp(&mut health, 0);
        let (tx, rx) = watch::channel(Arc::new(health));
        let metrics = KubeMetrics::new();
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink = reports.clone();
        let counted = metrics.clone();
        let on_validation: ValidationCallback = Arc::new(move |r: ValidationReport| {
            let passes = Passes(counted.reconcile_passes());
            sink.lock().unwrap().push((r, passes));
        });
        let placements = Arc::new(Mutex::new(Vec::new()));
        let seen = placements.clone();
        let on_pods: PlacementCallback = Arc::new(move |u: PlacementUpdate| {
            seen.lock().unwrap().push(u);
        });
        let pods_ask = Arc::new(tokio::sync::Notify::new());
        let settings = cfg.resolve().expect("valid settings");
        let client = KubeClient::connect(&settings).await.expect("a client");
        let pods_shutdown = gpuwatch_core::Shutdown::new();
        let listing = pods.then(|| {
            PodListing::start(
                &client,
                &settings,
                NODE,
                on_pods,
                pods_ask.clone(),
                &pods_shutdown,
                &tokio::runtime::Handle::current(),
            )
            .expect("listing starts")
            .expect("a live client lists")
        });
        let progress = gpuwatch_core::heartbeat::Progress::new();
        let writer = NodeWriter::start(
            settings,
            vcfg,
            NODE.into(),
            metrics.clone(),
            rx,
            &client,
            WriterHooks {
                on_validation: Some(on_validation),
                state_dir,
                progress: progress.clone(),
                shutdown: gpuwatch_core::Shutdown::new(),
            },
        )
        .await
        .expect("writer starts");
        Harness {
            api,
            tx,
            writer: Some(writer),
            listing,
            metrics,
            reports,
            published: Mutex::new(initial.0),
            initial,
            placements,
            pods_ask,
            pods_shutdown,
            progress,
        }
    }

    /// Every validation report so far, oldest first.
    pub(crate) fn reports(&self) -> Vec<ValidationReport> {
        let reports = self.reports.lock().unwrap();
        reports.iter().map(|(r, _)| r.clone()).collect()
    }

    /// The completed reconcile passes when the latest validation report was
    /// handed over; fails the test when there is none.
    pub(crate) fn passes_at_last_report(&self) -> Passes {
        let reports = self.reports.lock().unwrap();
        reports.last().expect("a validation report").1
    }

    /// The completed reconcile passes now.
    pub(crate) fn passes(&self) -> Passes {
        Passes(self.metrics.reconcile_passes())
    }

    /// Publishes `h` as the engine does, with an update time later than
    /// every earlier health's (the writer's output does not depend on it).
    pub(crate) fn set(&self, mut h: NodeHealth) -> Published {
        let mut last = self.published.lock().unwrap();
        let p = stamp(&mut h, *last);
        *last = p.0;
        self.tx.send_replace(Arc::new(h));
        p
    }

    /// Waits until a reconcile pass brought the Node to health `p` (or a
    /// later one) and completed: whatever the writer does about `p` is on
    /// the API double, and the Events it raised are queued. Fails the test
    /// after [`SECS`].
    pub(crate) async fn reconciled(&self, p: Published) {
        let ok = wait_for(SECS, || self.metrics.reconciled_health_unix_nano() >= p.0).await;
        assert!(
            ok,
            "no reconcile pass completed on health {p:?}; the latest was on {}; node: {:#}",
            self.metrics.reconciled_health_unix_nano(),
            self.api.node_json()
        );
    }

    /// Waits until one more reconcile pass than `before` counted completed.
    /// After [`Harness::passes_at_last_report`] that is a pass that acted
    /// on the report (see `reports`), and one always comes; `before` taken
    /// from [`Harness::passes`] ahead of a change to the Node may be met by
    /// a pass already under way then. Fails the test after [`SECS`].
    pub(crate) async fn pass_after(&self, before: Passes) {
        let ok = wait_for(SECS, || self.metrics.reconcile_passes() > before.0).await;
        assert!(
            ok,
            "no reconcile pass completed after {before:?}; node: {:#}",
            self.api.node_json()
        );
    }

    pub(crate) fn writer(&self) -> &NodeWriter {
        self.writer.as_ref().expect("writer running")
    }

    /// Waits until the Node satisfies `f`; fails the test naming `what` after [`SECS`].
    pub(crate) async fn until(&self, what: &str, f: impl Fn(&Node) -> bool) {
        let ok = wait_for(SECS, || f(&self.api.node())).await;
        assert!(
            ok,
            "timed out waiting for {what}; node: {:#}",
            self.api.node_json()
        );
    }

    /// Stops the pod listing and the writer, checks they made only the
    /// requests the crate declares, and hands the double back (for a
    /// restarted writer).
    pub(crate) async fn stop(mut self) -> ApiDouble {
        // The listing has no stop of its own: it ends on the shutdown it
        // shares with the agent's other inputs.
        self.pods_shutdown.trigger();
        if let Some(l) = self.listing.take() {
            assert!(
                l.stop_within(Duration::from_secs(5)).await,
                "the listing stops"
            );
        }
        if let Some(w) = self.writer.take() {
            w.shutdown_within(Duration::from_secs(5)).await;
        }
        self.api.assert_requests_declared();
        self.api
    }
}

/// Gives `h` an update time later than `after` (the wall clock's, as the
/// engine stamps it, or one past `after` when that is not later).
fn stamp(h: &mut NodeHealth, after: u64) -> Published {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    let at = u64::try_from(now).expect("before 2554").max(after + 1);
    h.updated_unix_nano = Some(at);
    Published(at)
}

/// The status of condition `t` on `n`.
pub(crate) fn status_of(n: &Node, t: &str) -> Option<String> {
    condition(n, t).map(|c| c.status)
}

/// Successful writes to `resource` (taints: `nodes`; conditions: `nodes/status`).
fn ok_writes(reqs: &[Recorded], resource: &str) -> Vec<Instant> {
    reqs.iter()
        .filter(|r| r.is_write() && r.resource == resource && r.status < 300)
        .map(|r| r.at)
        .collect()
}

/// No two successful writes to `resource` closer than half the writer's
/// limit (`min_write_interval_ms`, 1 s by default). The writer counts the
/// interval from the end of its pass, after the answer, so the double's
/// times are at least that far apart; but a request the double answers only
/// after the client gave up on it (a starved machine) is recorded late, and
/// the retry follows it closer. Half the interval still tells an unpaced
/// writer (writes milliseconds apart) from a paced one.
pub(crate) fn assert_paced(reqs: &[Recorded], resource: &str) {
    let at = ok_writes(reqs, resource);
    for w in at.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_millis(500),
            "two {resource} writes {:?} apart",
            w[1] - w[0]
        );
    }
}
