//! The event sinks and exporters: stdout JSON lines, the Prometheus renderer,
//! the OTLP exporter and the Kubernetes node writer. They start before the
//! engine (the writer converges to the restored health at once) and stop
//! last, flushing what the engine emitted while it drained.

use super::{Prepared, RunError, StopBudget};
use crate::api::MetricsRenderer;
use crossbeam_channel::Sender;
use gpuwatch_core::heartbeat::{Progress, Watched};
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_core::{EventSink, Registry};
use gpuwatch_kube::{KubeClient, KubeMetrics};
use gpuwatch_proto::NodeHealth;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Flush budget of each event sink, and of each shutdown hook.
const SINK_STOP: Duration = Duration::from_secs(2);

/// Sinks and exporters assembled for one run.
pub(crate) struct Sinks {
    /// Where the engine sends every emitted event.
    pub event_sinks: Vec<Arc<dyn EventSink>>,
    /// `/metrics` renderer (with `--prometheus`).
    pub metrics: Option<MetricsRenderer>,
    /// Called at shutdown after the engine stopped, with a time budget
    /// (OTLP exporter shutdown, kube writer shutdown).
    pub on_shutdown: Vec<Box<dyn FnOnce(Duration) + Send>>,
    /// Heartbeats of the sinks that loop on their own (the Node writer),
    /// for the input watchdog.
    pub watched: Vec<Watched>,
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sinks")
            .field(
                "event_sinks",
                &self
                    .event_sinks
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>(),
            )
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}

/// Assembles the event sinks and exporters. **This is the one place where
/// sinks are wired**: stdout JSON lines, the Prometheus renderer, the OTLP
/// exporter (metrics + one log record per fault) and, given the agent's
/// Kubernetes client, the Kubernetes node writer (conditions, taints, Events,
/// startup gate; a dry run's client logs the patches instead of sending
/// them). The writer's validation reports go to the engine through
/// `validation_tx`, held weakly: once the agent drops the strong sender, the
/// engine's channel can drain while the writer still runs.
pub(crate) fn build_sinks(
    prepared: &Prepared,
    kube_client: Option<&KubeClient>,
    registry: &Arc<Registry>,
    kube: &Arc<KubeMetrics>,
    rt: &tokio::runtime::Handle,
    health_rx: tokio::sync::watch::Receiver<Arc<NodeHealth>>,
    validation_tx: Weak<Sender<Input>>,
) -> Result<Sinks, RunError> {
    let mut sinks = Sinks {
        event_sinks: Vec::new(),
        metrics: None,
        on_shutdown: Vec::new(),
        watched: Vec::new(),
    };
    if prepared.stdout_sink() {
        sinks
            .event_sinks
            .push(Arc::new(gpuwatch_sinks::stdout::JsonLinesSink::stdout(
                registry.clone(),
            )));
    }
    if let Some(prometheus) = prepared.prometheus() {
        let renderer = gpuwatch_sinks::prometheus::Renderer::with_quiet_window(
            registry.clone(),
            vec![kube.clone()],
            prepared.resource().clone(),
            prometheus.series_quiet_window,
        )
        .with_dcgm_labels(prometheus.dcgm_labels)
        .with_scope_labels(prometheus.scope_labels)
        .with_resource_attributes(prepared.resource_attributes().clone())
        .with_node_uid({
            let status = kube.subscribe();
            move || status.borrow().node_uid.clone()
        });
        sinks.metrics = Some(Arc::new(move |format| renderer.render_as(format)));
    }
    if let Some(otlp) = prepared.otlp() {
        sinks.start_otlp(otlp, prepared.resource(), registry, kube, rt)?;
    }
    if let Some(client) = kube_client {
        sinks.start_kube_writer(prepared, client, kube, rt, health_rx, validation_tx)?;
    }
    Ok(sinks)
}

/// Resource attributes of this agent (OTLP resource, Prometheus `target_info`).
pub(crate) fn resource_info(node_name: &str) -> gpuwatch_sinks::otlp::ResourceInfo {
    gpuwatch_sinks::otlp::ResourceInfo {
        node_name: node_name.to_string(),
        host_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        service_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// Puts the Node's uid on the OTLP resource (`k8s.node.uid`) once the
/// Kubernetes writer has read the Node, and again if it changes (the Node
/// object recreated). Ends with the writer's status channel; without a writer
/// no uid is ever published.
async fn follow_node_uid(
    mut status: tokio::sync::watch::Receiver<gpuwatch_kube::KubeStatus>,
    updater: gpuwatch_sinks::otlp::ResourceUpdater,
) {
    let mut last: Option<String> = None;
    loop {
        let uid = status.borrow_and_update().node_uid.clone();
        if let Some(uid) = uid.filter(|u| last.as_ref() != Some(u)) {
            last = Some(uid.clone());
            let updater = updater.clone();
            // Rebuilding the metric pipeline waits for its last export.
            let set = tokio::task::spawn_blocking(move || {
                updater.set_node_uid(&uid, Duration::from_secs(5))
            })
            .await;
            match set {
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "Cannot put the Node's uid on the OTLP resource.");
                }
                Err(e) => tracing::warn!(error = %e, "The OTLP resource update failed."),
                Ok(Ok(_)) => {}
            }
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

impl Sinks {
    /// The OTLP exporter: metrics, and one log record per fault.
    fn start_otlp(
        &mut self,
        otlp: &gpuwatch_sinks::otlp::OtlpSettings,
        resource: &gpuwatch_sinks::otlp::ResourceInfo,
        registry: &Arc<Registry>,
        kube: &Arc<KubeMetrics>,
        rt: &tokio::runtime::Handle,
    ) -> Result<(), RunError> {
        // The exporter spawns its gRPC transport on the runtime.
        let _guard = rt.enter();
        let exporter = gpuwatch_sinks::otlp::OtlpExporter::start_resolved(
            otlp,
            resource,
            registry.clone(),
            vec![kube.clone()],
            rt,
        )
        .map_err(|e| RunError::Sink {
            name: "otlp",
            message: e.to_string(),
        })?;
        tracing::info!(exporter = ?exporter, "OTLP export started.");
        rt.spawn(follow_node_uid(
            kube.subscribe(),
            exporter.resource_updater(),
        ));
        self.event_sinks.push(exporter.log_sink());
        self.on_shutdown
            .push(Box::new(move |budget| exporter.shutdown(budget)));
        Ok(())
    }

    /// The Kubernetes node writer (conditions, taints, Events, startup
    /// gate); a dry run's client logs the patches instead of sending them.
    fn start_kube_writer(
        &mut self,
        prepared: &Prepared,
        client: &KubeClient,
        kube: &Arc<KubeMetrics>,
        rt: &tokio::runtime::Handle,
        health_rx: tokio::sync::watch::Receiver<Arc<NodeHealth>>,
        validation_tx: Weak<Sender<Input>>,
    ) -> Result<(), RunError> {
        // Startup-gate reports go to the engine (`/v1/health.validation`). The
        // writer only holds a weak reference to the engine channel: once the
        // agent drops the strong one (its inputs stopping), the engine's channel
        // can disconnect and drain while the writer still runs.
        let on_validation: gpuwatch_kube::ValidationCallback = Arc::new(move |report| {
            let Some(tx) = validation_tx.upgrade() else {
                return;
            };
            if let Err(e) = tx.try_send(Input::Validation(report)) {
                tracing::debug!(error = %e, "Validation report not handed to the engine.");
            }
        });
        let progress = Progress::new();
        self.watched.push(Watched::new(
            MonitorInput::KubeWriter,
            progress.clone(),
            gpuwatch_kube::writer_deadline(prepared.kube()),
        ));
        let writer = rt
            .block_on(gpuwatch_kube::NodeWriter::start(
                prepared.kube().clone(),
                prepared.validation().clone(),
                prepared.node_name().to_string(),
                kube.clone(),
                health_rx,
                client,
                gpuwatch_kube::WriterHooks {
                    on_validation: Some(on_validation),
                    // A dry run shows nothing on the Node: it keeps no history
                    // for the agent that does.
                    state_dir: (!client.is_dry_run()).then(|| prepared.state_dir().to_path_buf()),
                    progress: progress.clone(),
                    // Its own signal, not the inputs': the writer stops in
                    // the shutdown hook below, after the inputs stopped and
                    // the event sinks flushed, so that its last write lands.
                    shutdown: gpuwatch_core::Shutdown::new(),
                },
            ))
            .map_err(|e| RunError::Sink {
                name: "kube",
                message: e.to_string(),
            })?;
        self.event_sinks.push(writer.event_sink());
        let handle = rt.clone();
        self.on_shutdown.push(Box::new(move |budget| {
            if handle
                .block_on(async {
                    // A little past its own deadline: the writer aborts what
                    // is still busy then and says what it dropped.
                    let margin = Duration::from_millis(100);
                    tokio::time::timeout(budget + margin, writer.shutdown_within(budget)).await
                })
                .is_err()
            {
                tracing::warn!("The Kubernetes writer did not stop within its shutdown budget.");
            }
        }));
        Ok(())
    }

    /// Flushes every event sink, then runs the shutdown hooks, each within
    /// its share.
    pub(super) fn stop(self, budget: &StopBudget) {
        for s in &self.event_sinks {
            s.flush(budget.share(SINK_STOP));
        }
        for hook in self.on_shutdown {
            hook(budget.share(SINK_STOP));
        }
    }
}
