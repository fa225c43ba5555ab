//! Kubernetes node writer: conditions, taints, Events and the startup-taint gate
//! on the agent's own Node.
//!
//! A level-triggered reconcile loop converges the Node to the state derived from
//! the latest [`NodeHealth`] (the health engine's `watch` channel; after a restart
//! it is the restored, persisted state):
//!
//! - **Conditions** — server-side apply on `nodes/<name>/status` with field manager
//!   `gpuwatch`, applying only our condition types (node conditions merge by `type`).
//!   `lastTransitionTime` only changes with the status; no heartbeat rewrites.
//!   For the first 10 s after start, a condition the Node already carries as
//!   True/False (from the previous agent process) is not moved to Unknown while
//!   NVML has not reported yet, so agent restarts do not flap it.
//!   - `AcceleratedHardwareReady`: `False` only while a fault whose action is in
//!     `hardware_not_ready_actions` (default `inspect_hardware`) is active; `Unknown`
//!     (reason `MonitorUnavailable`) when gpuwatch cannot tell (verdict unknown or not
//!     yet known) and (reasons `ValidationPending`/`ValidationIncomplete`/
//!     `ValidationFailed`) while the startup gate holds; otherwise `True` — reset and
//!     reboot faults keep it `True` (reason `GPURecoveryPending`): the GPU needs a
//!     reset/reboot, the hardware is not judged broken, so a node-repair controller
//!     does not replace the node for it unless configured to.
//!   - `GPUProblem`: `True` while a reset/reboot/inspect fault is active (reason =
//!     the action class of the most severe fault, `class_reason` in module `desired`:
//!     `GPUResetRequired`, `NodeRebootRequired`, `HardwareReplacementRequired`, the
//!     same on a `False` readiness condition; the message names the fault, GPU index,
//!     UUID, PCI address, code, occurrences and boot), `False`/`NoGPUProblem`,
//!     `Unknown`/`MonitorUnavailable`.
//!   - Flapping is bounded (module `flap`): after `condition_flap_limit` clears within
//!     `condition_flap_window_secs` (default 3 per hour) a further clear is held —
//!     the condition and the fault taint stay — until the fault has stayed away a
//!     whole window (its message says until when; `/v1/health` lists it in
//!     `condition_holds`); every status change is counted
//!     (`gpuwatch.kube.condition.transitions`). The history is kept in the state
//!     directory (`kube-conditions.json`, written ahead of the Node), so restarts
//!     and reboots do not start a new window.
//!     Occurrences are bucketed (`seen once`, `seen 2+ times`, `seen 10+ times`, ...)
//!     so a storm rewrites the status only when it crosses a power of ten; the exact
//!     count is in the metrics and the Event's `count`.
//! - **Fault taint** `gpuwatch.io/unhealthy=<action>:NoSchedule` while such a fault is
//!   active. Taints are changed with a merge patch of the live list (only our keys
//!   change) carrying the `resourceVersion` it was computed from: when another
//!   writer changed the Node meanwhile the API server answers 409 Conflict, and the
//!   writer re-reads, recomputes and retries at once after a 25–50 ms jittered
//!   pause — a lost race is not an error (counted as
//!   `gpuwatch.kube.writes{result="conflict"}`), so it never waits out the error
//!   backoff. A foreign taint added during the race is kept.
//! - **Fleet quarantine budget** (module `quarantine`) — the fault taint is written only
//!   while this Node holds one of the budget's Lease slots; a Node past the budget
//!   keeps its conditions, gets no fault taint and a `QuarantineBudgetExhausted`
//!   Warning Event, and takes a slot as soon as one frees. Before the first claim
//!   is answered (API down, agent restarting) the taint is left as the Node has it.
//! - **Device isolation** (module `device_taints`) — a `reset_gpu` or
//!   `inspect_hardware` fault of one GPU that the Node's DRA ResourceSlices
//!   list is isolated with a DeviceTaintRule on that device instead of the
//!   fault taint (node-wide faults keep the Node taint); rules are converged
//!   at the start of every pass, before the Node's taints change. Where the
//!   cluster cannot take rules the fault taint is used instead and the
//!   problem condition says why.
//! - **Startup taint** — while the Node carries it, device validation
//!   ([`gpuwatch_core::validation`]) runs every `validation_interval_secs`; the taint is removed
//!   only after a complete, passing report, and only if the *current* health still
//!   passes the pure checks right before the removal (the extra command can run for
//!   minutes; a fault that appears meanwhile keeps the taint). A passing result is
//!   dropped when the health later fails the checks, when the boot changes or when
//!   the taint reappears. Every report goes to the `on_validation` callback.
//! - **Events** — [`NodeWriter::event_sink`] queues (bounded, coalescing,
//!   drop-oldest counted) and a token bucket paces writes; same reason + GPU within
//!   the window patches `count`/`lastTimestamp`; after a restart Events already on the
//!   API are not sent again.
//! - Watches its own Node (`fieldSelector=metadata.name=<node>`) so a removed
//!   condition or taint is restored (list, then watch; 410 Gone → read again);
//!   API failures back off exponentially with jitter (a 429's `Retry-After` is
//!   the least wait); writes are coalesced to at most one round per
//!   `min_write_interval_ms`. resourceVersions are compared for equality only.
//! - **Dry run** logs the exact JSON it would send, against an in-memory Node.
//!
//! The requests the writer can make are listed in [`WRITER_REQUESTS`]; the RBAC
//! manifest grants exactly those.
//!
//! The crate also lists the pods bound to the Node ([`PodListing`]), one of
//! the agent's two placement sources; the agent starts and stops it with the
//! other (the kubelet's PodResources poller, its own), not with the writer.
//! Both the writer and the listing take one [`KubeClient`], so the agent
//! builds one client; a dry run's has none, and lists nothing.
//!
//! It does not depend on the exporters (`gpuwatch-sinks`), nor they on it:
//! the Events go through `gpuwatch-core`'s bounded queue
//! (`gpuwatch_core::queue`), and what the writer counts is [`KubeMetrics`],
//! a `gpuwatch_core::metric_source::MetricSource` the metric outputs collect
//! beside their table that names its instruments (the local API reads it
//! through its [`KubeStatus`] watch). The startup gate's extra validation
//! command is [`run_extra_command`] (`gpuwatch validate` runs it too). The
//! public API is what the agent and the tests use; everything else is
//! crate-private.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod advertised;
mod backend;
mod cleanup;
mod client;
mod config;
mod desired;
pub mod device_taints;
mod event_text;
mod events;
mod extra_command;
mod flap;
mod gate;
mod install_check;
mod metrics;
mod node;
mod node_watch;
mod pod_events;
mod pods;
mod quarantine;
mod reconcile;
mod resolve;
mod retry;
mod schedule;
mod settings;

pub use cleanup::{
    CleanupError, CleanupReport, FleetOptions, FleetReport, NodeCleanup, NodeOutcome, PodWait,
    WaitOutcome, all_nodes_cleanup, node_cleanup,
};
pub use client::KubeClient;
pub use config::{DeviceIsolation, KubeConfig, MigStrategy, StartupGateMode, TaintConfig};
pub use extra_command::run_extra_command;
pub use install_check::{CheckLine, InstallCheck, InstallReport, check_install};
pub use metrics::{KubeMetrics, KubeObject, KubeStatus, ValidationResult, WriteResult};
pub use pods::{MIN_LIST_GAP, PlacementCallback, PodListing};
pub use settings::KubeSettings;

use events::{EventQueue, EventWriter, KubeEventSink};
use gpuwatch_core::EventSink;
use gpuwatch_core::Shutdown;
use gpuwatch_core::heartbeat::Progress;
use gpuwatch_core::validation::ValidationSettings;
use gpuwatch_proto::{NodeHealth, ValidationReport};
use reconcile::Reconciler;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// One kind of request the writer sends: RBAC verb, API group, resource
/// (`resource/subresource`), and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiRequest {
    /// RBAC verb (`get`, `watch`, `patch`, `create`, `list`).
    pub verb: &'static str,
    /// API group (`""` for core).
    pub group: &'static str,
    /// Resource, with `/subresource` when there is one.
    pub resource: &'static str,
    /// The scope the request is made in (what RBAC must grant it in).
    pub scope: Scope,
}

/// Where a request of [`WRITER_REQUESTS`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Cluster-scoped (Nodes), or across every namespace (the pod listing).
    Cluster,
    /// `[kube] event_namespace`.
    EventNamespace,
    /// `[kube] quarantine_namespace`, by default the agent's own namespace
    /// (the client's default namespace: in a pod, its service account's).
    QuarantineNamespace,
}

const fn req(verb: &'static str, resource: &'static str) -> ApiRequest {
    ApiRequest {
        verb,
        group: "",
        resource,
        scope: Scope::Cluster,
    }
}

const fn event(verb: &'static str) -> ApiRequest {
    ApiRequest {
        verb,
        group: "",
        resource: "events",
        scope: Scope::EventNamespace,
    }
}

const fn lease(verb: &'static str) -> ApiRequest {
    ApiRequest {
        verb,
        group: "coordination.k8s.io",
        resource: "leases",
        scope: Scope::QuarantineNamespace,
    }
}

/// Requests the writer makes that no role of ours grants: Kubernetes'
/// `system:basic-user` ClusterRole lets every authenticated user create
/// SelfSubjectAccessReviews (the quarantine budget's startup access check).
pub const UNGRANTED_REQUESTS: [ApiRequest; 1] = [ApiRequest {
    verb: "create",
    group: "authorization.k8s.io",
    resource: "selfsubjectaccessreviews",
    scope: Scope::Cluster,
}];

/// Every request the node writer and the pod listing ([`PodListing`]) can
/// make (what the RBAC roles must grant).
/// `list events` serves the Event dedup after a restart; `list nodes` is the
/// quarantine budget's fleet count (the watch of the own Node, with a
/// `metadata.name` field selector, is authorised as `watch`). Node requests are
/// cluster-scoped; `list`/`watch pods` are the pod listing's: the pods bound
/// to this Node (a `spec.nodeName` field selector), to name the pod a
/// faulting process runs in. Event requests only go to `event_namespace`,
/// Lease requests (the quarantine budget's slots) only to
/// `quarantine_namespace` (namespaced Roles there grant them). The
/// DeviceTaintRule client's are [`DEVICE_TAINT_REQUESTS`] (device isolation).
pub const WRITER_REQUESTS: [ApiRequest; 21] = [
    req("get", "nodes"),
    req("list", "nodes"),
    req("watch", "nodes"),
    req("patch", "nodes"),
    req("patch", "nodes/status"),
    event("create"),
    event("patch"),
    event("list"),
    req("list", "pods"),
    req("watch", "pods"),
    lease("list"),
    lease("get"),
    lease("create"),
    lease("update"),
    lease("delete"),
    DEVICE_TAINT_REQUESTS[0],
    DEVICE_TAINT_REQUESTS[1],
    DEVICE_TAINT_REQUESTS[2],
    DEVICE_TAINT_REQUESTS[3],
    DEVICE_TAINT_REQUESTS[4],
    DEVICE_TAINT_REQUESTS[5],
];

const fn dra(verb: &'static str, resource: &'static str) -> ApiRequest {
    ApiRequest {
        verb,
        group: "resource.k8s.io",
        resource,
        scope: Scope::Cluster,
    }
}

/// Every request the DeviceTaintRule client ([`device_taints::DeviceTaints`])
/// can make besides API discovery (which every user may read): this Node's
/// ResourceSlices and the rules of its devices. Both are cluster-scoped
/// (RBAC cannot narrow them to one Node; the admission policy
/// `gpuwatch-own-device-taint-rules` does). Part of [`WRITER_REQUESTS`].
pub const DEVICE_TAINT_REQUESTS: [ApiRequest; 6] = [
    dra("list", "resourceslices"),
    dra("list", "devicetaintrules"),
    dra("get", "devicetaintrules"),
    dra("create", "devicetaintrules"),
    dra("update", "devicetaintrules"),
    dra("delete", "devicetaintrules"),
];

/// Every request `gpuwatch node-cleanup --all-nodes` ([`all_nodes_cleanup`])
/// can make, what the uninstall hook's RBAC must grant: the Node list (paged),
/// a Node read again after a lost race, the taint patch, the condition
/// apply on `nodes/status`; the slot Leases' list and delete in
/// `quarantine_namespace`; the pod list of `--wait-for-pods` in the agents'
/// namespace; every DRA DeviceTaintRule carrying gpuwatch's node label,
/// listed and deleted. Node and DeviceTaintRule requests are
/// cluster-scoped, the others namespaced. `node-cleanup --node` makes a
/// subset of them.
pub const CLEANUP_REQUESTS: [ApiRequest; 9] = [
    req("list", "nodes"),
    req("get", "nodes"),
    req("patch", "nodes"),
    req("patch", "nodes/status"),
    lease("list"),
    lease("delete"),
    req("list", "pods"),
    dra("list", "devicetaintrules"),
    dra("delete", "devicetaintrules"),
];

/// Errors starting the node writer.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The `[kube]` settings are invalid: every problem
    /// [`KubeConfig::resolve`] reported.
    #[error("invalid Kubernetes writer settings: {}", .0.join("; "))]
    Config(Vec<String>),
    /// `api_server_url` is not a URL.
    #[error("invalid api_server_url {url:?}: {reason}")]
    Url {
        /// `api_server_url` as configured.
        url: String,
        /// Why it does not parse.
        reason: String,
    },
    /// No in-cluster service account and no usable kubeconfig.
    #[error("cannot find Kubernetes credentials (in-cluster or kubeconfig)")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("cannot build the Kubernetes client")]
    Client(#[source] kube::Error),
    /// `start` was called with an empty node name.
    #[error("the node name is empty (set node_name or the NODE_NAME environment variable)")]
    NoNodeName,
    /// Reading the Node failed (API unreachable, RBAC, not found).
    #[error("cannot read node {node:?}: {reason}")]
    GetNode {
        /// The Node that was asked for.
        node: String,
        /// What the API (or the connection) said.
        reason: String,
    },
}

/// Called with every startup-gate validation report (the agent forwards it to the
/// health engine, which shows it as `/v1/health.validation`).
pub type ValidationCallback = Arc<dyn Fn(ValidationReport) + Send + Sync>;

/// Where the writer hands what it learns for the health engine, and where it
/// keeps what it must remember across restarts.
#[derive(Default, Clone)]
pub struct WriterHooks {
    /// Every startup-gate validation report.
    pub on_validation: Option<ValidationCallback>,
    /// The agent's state directory: the condition flap history is kept in
    /// its `kube-conditions.json`, so the bound survives restarts and
    /// reboots. `None`: in memory only (dry runs, tests).
    pub state_dir: Option<PathBuf>,
    /// The reconcile loop beats it on every round (at least every 10 s)
    /// and names a pass while one runs: the agent's input watchdog holds it
    /// to [`writer_deadline`].
    pub progress: Arc<Progress>,
    /// The writer's stop signal: every task of the writer ends when it is
    /// triggered, by [`NodeWriter::shutdown_within`] or before. The agent
    /// gives the writer one of its own, not the one its inputs share: the
    /// writer stops after the inputs, so that their last fault still reaches
    /// the Node.
    pub shutdown: Shutdown,
}

/// How long the reconcile loop may make no progress before the agent
/// reports the Node writer stuck: twelve request timeouts (a pass makes a
/// handful of requests, each bounded by the timeout), at least two
/// minutes.
pub fn writer_deadline(settings: &KubeSettings) -> Duration {
    gpuwatch_core::heartbeat::deadline(settings.api.request_timeout, 12, Duration::from_secs(120))
}

impl std::fmt::Debug for WriterHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterHooks")
            .field("on_validation", &self.on_validation.is_some())
            .field("state_dir", &self.state_dir)
            .field("shutdown", &self.shutdown)
            .finish_non_exhaustive()
    }
}

/// The expected GPU count of `node_name` as the startup gate resolves it:
/// `validation.expected_gpus`, else the node label `validation.expected_gpus_label`,
/// else the node's `nvidia.com/gpu` capacity. Reads the Node once with the
/// writer's client settings (`api_server_url`, in-cluster, kubeconfig); used by
/// `gpuwatch validate`. `Ok(None)`: the Node says nothing.
pub async fn expected_gpus_from_node(
    settings: &KubeSettings,
    validation: &ValidationSettings,
    node_name: &str,
) -> Result<Option<u32>, KubeError> {
    if let Some(n) = validation.expected_gpus {
        return Ok(Some(n.get()));
    }
    if node_name.is_empty() {
        return Err(KubeError::NoNodeName);
    }
    let client = client::build_client(&settings.api).await?;
    let backend = backend::node_api(Some(client), node_name, settings);
    let node = backend.get_node().await.map_err(|e| KubeError::GetNode {
        node: node_name.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(gate::expected_gpus(&node, validation))
}

/// What a count read from the Node ([`expected_gpus_from_node`]) counts on a
/// node whose GPUs NVML sees in `health`: MIG devices under the single MIG
/// strategy once GPUs are in MIG mode, else GPUs.
pub fn node_count(
    n: u32,
    settings: &KubeSettings,
    health: &NodeHealth,
) -> gpuwatch_core::validation::Expected {
    gate::node_count(n, settings.advertised.mig_strategy, health)
}

/// Writes conditions, taints and Events on the agent's own Node.
pub struct NodeWriter {
    sink: Arc<KubeEventSink>,
    queue: Arc<EventQueue>,
    shutdown: Shutdown,
    reconciler: JoinHandle<()>,
    watcher: JoinHandle<()>,
    events: JoinHandle<()>,
    quarantine: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NodeWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeWriter").finish_non_exhaustive()
    }
}

/// The namespace of the quarantine budget's Leases: `[kube]
/// quarantine_namespace`, else the client's default namespace (in a pod, its
/// service account's namespace file; from a kubeconfig, its context's),
/// `default` in a dry run. `gpuwatch check-install` asks the same.
pub(crate) fn quarantine_namespace(
    settings: &KubeSettings,
    client: Option<&kube::Client>,
) -> String {
    settings.quarantine.namespace.clone().unwrap_or_else(|| {
        client
            .map_or("default", |c| c.default_namespace())
            .to_owned()
    })
}

/// Starts the quarantine budget's claimant (none when the budget is off): over
/// the API server's Leases, or in dry-run mode over an in-memory API server
/// whose fleet is this Node alone.
fn start_quarantine(
    settings: &KubeSettings,
    node_name: &str,
    client: Option<kube::Client>,
    metrics: &Arc<KubeMetrics>,
    shutdown: Shutdown,
) -> (Option<quarantine::link::Link>, Option<JoinHandle<()>>) {
    let q = &settings.quarantine;
    let metrics = metrics.clone();
    if q.budget == quarantine::Budget::Off {
        metrics.set_quarantine(quarantine::link::status_view(
            q.budget,
            &quarantine::Status::Off,
        ));
        return (None, None);
    }
    let namespace = quarantine_namespace(settings, client.as_ref());
    let claimant = quarantine::Settings {
        namespace: namespace.clone(),
        budget: q.budget,
        floor: q.floor,
        identity: node_name.to_owned(),
        lease_duration: q.lease_duration,
        retry: q.retry,
        recount_every: quarantine::FLEET_RECOUNT_INTERVAL,
        backoff: (settings.api.backoff_initial, settings.api.backoff_max),
    };
    let (need_tx, need_rx) = watch::channel(quarantine::Need::default());
    let (status_tx, status_rx) = watch::channel(quarantine::Status::Idle);
    let task = match client {
        Some(client) => {
            let store = quarantine::KubeLeaseStore::new(
                client,
                &namespace,
                &q.node_selector,
                settings.taints.fault_keys(),
                settings.api.request_timeout,
            );
            tokio::spawn(quarantine::run(
                quarantine::Claimant::new(store, claimant),
                need_rx,
                status_tx,
                shutdown,
            ))
        }
        None => {
            let store = quarantine::MemoryLeaseStore::with_nodes([node_name.to_owned()]);
            tokio::spawn(quarantine::run(
                quarantine::Claimant::new(store, claimant),
                need_rx,
                status_tx,
                shutdown,
            ))
        }
    };
    let link = quarantine::link::Link::new(need_tx, status_rx, q.budget, metrics);
    (Some(link), Some(task))
}

/// What the writer's tasks share.
struct Shared {
    node_name: String,
    metrics: Arc<KubeMetrics>,
    backend: Arc<dyn backend::NodeApi>,
    queue: Arc<EventQueue>,
    node_uid: Arc<Mutex<Option<String>>>,
    shutdown: Shutdown,
    /// Device isolation (DRA DeviceTaintRules), the reconcile loop's.
    isolator: device_taints::isolate::Isolator,
}

impl Shared {
    fn event_writer(&self, settings: &KubeSettings) -> EventWriter {
        EventWriter {
            queue: self.queue.clone(),
            backend: self.backend.clone(),
            cfg: settings.clone(),
            node_name: self.node_name.clone(),
            node_uid: self.node_uid.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// The reconcile loop, fed the health by `health_rx` and the Node by `node_rx`.
    fn reconciler(
        self,
        settings: KubeSettings,
        validation: ValidationSettings,
        health_rx: watch::Receiver<Arc<NodeHealth>>,
        node_rx: mpsc::Receiver<node_watch::Seen>,
        quarantine: Option<quarantine::link::Link>,
        hooks: WriterHooks,
    ) -> Reconciler {
        let flap = flap::Hysteresis::new(
            settings.flap.limit,
            settings.flap.window,
            &settings.conditions.problem_type,
            &settings.conditions.ready_type,
            &settings.conditions.network_type,
            hooks.state_dir.map(|d| d.join(flap::FILE_NAME)),
        );
        Reconciler::new(reconcile::Parts {
            settings,
            validation,
            node_name: self.node_name,
            metrics: self.metrics,
            backend: self.backend,
            health_rx,
            node_rx,
            events: self.queue,
            node_uid: self.node_uid,
            shutdown: self.shutdown,
            on_validation: hooks.on_validation,
            quarantine,
            flap,
            progress: hooks.progress,
            isolator: self.isolator,
        })
    }
}

impl NodeWriter {
    /// Starts the reconcile loop, the Node watch and the Event writer (and
    /// the quarantine budget's claimant) on the current tokio runtime,
    /// through `client` (a dry run's logs the patches against an in-memory
    /// Node instead), from settings resolved and checked at config load
    /// (`validation` included). An unreachable API server is not an error:
    /// the loop retries. `hooks.on_validation` is called (on a runtime task;
    /// it must not block) with every startup-gate validation report.
    pub async fn start(
        settings: KubeSettings,
        validation: ValidationSettings,
        node_name: String,
        metrics: Arc<KubeMetrics>,
        health_rx: watch::Receiver<Arc<NodeHealth>>,
        client: &KubeClient,
        hooks: WriterHooks,
    ) -> Result<NodeWriter, KubeError> {
        if node_name.is_empty() {
            return Err(KubeError::NoNodeName);
        }
        let shutdown = hooks.shutdown.clone();
        let isolator = device_taints::isolate::Isolator::new(client, &node_name, &settings);
        let client = client.client().cloned();
        if client.is_none() {
            tracing::info!(node = %node_name, "Kubernetes writer in dry-run mode: patches are logged, not sent.");
        }
        let backend = backend::node_api(client.clone(), &node_name, &settings);
        let (quarantine_link, quarantine_task) =
            start_quarantine(&settings, &node_name, client, &metrics, shutdown.clone());
        let events = &settings.events;
        let queue = Arc::new(EventQueue::new(events.queue_capacity, metrics.clone()));
        let sink = Arc::new(KubeEventSink {
            queue: queue.clone(),
            enabled: events.enabled,
            pods: events.enabled && events.pods,
        });
        let (node_tx, node_rx) = mpsc::channel(16);
        let watcher = tokio::spawn(node_watch::watch_node(
            backend.clone(),
            node_tx,
            settings.api.clone(),
            shutdown.clone(),
        ));
        let shared = Shared {
            node_name,
            metrics,
            backend,
            queue: queue.clone(),
            node_uid: Arc::new(Mutex::new(None)),
            shutdown: shutdown.clone(),
            isolator,
        };
        let events = tokio::spawn(shared.event_writer(&settings).run());
        let reconciler = shared.reconciler(
            settings,
            validation,
            health_rx,
            node_rx,
            quarantine_link,
            hooks,
        );
        Ok(NodeWriter {
            sink,
            queue,
            shutdown,
            reconciler: tokio::spawn(reconciler.run()),
            watcher,
            events,
            quarantine: quarantine_task,
        })
    }

    /// The sink that turns fault events into Events on the Node (never blocks).
    pub fn event_sink(&self) -> Arc<dyn EventSink> {
        self.sink.clone()
    }

    /// Triggers the writer's shutdown ([`WriterHooks::shutdown`]), waits for
    /// every task of the writer and gives queued Events what is left
    /// of `within`, so the writer keeps to the share of the agent's stop
    /// deadline it was given. A task still busy at the deadline (an API call
    /// in flight) is aborted; Events still queued then are dropped, and the
    /// log says how many.
    pub async fn shutdown_within(self, within: Duration) {
        let end = tokio::time::Instant::now() + within;
        self.shutdown.trigger();
        let mut tasks = vec![self.reconciler, self.watcher];
        tasks.extend(self.quarantine);
        for task in &mut tasks {
            if tokio::time::timeout_at(end, &mut *task).await.is_err() {
                task.abort();
            }
        }
        self.queue.close();
        let mut events = self.events;
        if tokio::time::timeout_at(end, &mut events).await.is_err() {
            events.abort();
            tracing::warn!(
                queued = self.queue.len(),
                "Kubernetes Events still queued at shutdown were dropped."
            );
        }
    }
}
