//! The event sinks and exporters: stdout JSON lines, the Prometheus renderer,
//! the OTLP exporter and the Kubernetes node writer. They start before the
//! engine (the writer converges to the restored health at once) and stop
//! last, flushing what the engine emitted while it drained.

use super::{Prepared, RunError, RunOptions, StopBudget};
use crate::api::MetricsRenderer;
use crate::config::Config;
use gpuwatch_core::{EventSink, Registry};
use gpuwatch_kube::KubeMetrics;
use gpuwatch_proto::NodeHealth;
use std::sync::Arc;
use std::time::Duration;

/// Flush budget of each event sink, and of each shutdown hook.
const SINK_STOP: Duration = Duration::from_secs(2);

/// Sinks and exporters assembled for one run.
pub struct Sinks {
    /// Where the engine sends every emitted event.
    pub event_sinks: Vec<Arc<dyn EventSink>>,
    /// `/metrics` renderer (with `--prometheus`).
    pub metrics: Option<MetricsRenderer>,
    /// Called at shutdown after the engine stopped, with a time budget
    /// (OTLP exporter shutdown, kube writer shutdown).
    pub on_shutdown: Vec<Box<dyn FnOnce(Duration) + Send>>,
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

/// How the sinks and the health engine reach each other.
#[derive(Debug)]
pub struct EngineLink {
    /// Validation reports and pod listings go to the engine here. Held
    /// weakly: once the agent drops the strong sender, the engine's channel
    /// can drain while the writer still runs.
    pub tx: std::sync::Weak<crossbeam_channel::Sender<gpuwatch_core::msg::Input>>,
    /// The engine wakes this to ask the pod listing for a fresh list.
    pub pods_ask: Arc<tokio::sync::Notify>,
}

/// Assembles the event sinks and exporters. **This is the one place where
/// sinks are wired**: stdout JSON lines, the Prometheus renderer, the OTLP
/// exporter (metrics + one log record per fault) and the Kubernetes node
/// writer (conditions, taints, Events, startup gate; `--kube-dry-run` logs the
/// patches instead of sending them).
pub fn build_sinks(
    prepared: &Prepared,
    opts: &RunOptions,
    registry: &Arc<Registry>,
    kube: &Arc<KubeMetrics>,
    rt: &tokio::runtime::Handle,
    health_rx: tokio::sync::watch::Receiver<Arc<NodeHealth>>,
    engine: EngineLink,
) -> Result<Sinks, RunError> {
    let cfg = prepared.config();
    let mut sinks = Sinks {
        event_sinks: Vec::new(),
        metrics: None,
        on_shutdown: Vec::new(),
    };
    if cfg.sinks.stdout {
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
            resource_info(cfg),
            prometheus.series_quiet_window,
        );
        sinks.metrics = Some(Arc::new(move || renderer.render()));
    }
    if let Some(otlp) = prepared.otlp() {
        sinks.start_otlp(otlp, cfg, registry, kube, rt)?;
    }
    if prepared.kube().enabled() || opts.kube_dry_run {
        sinks.start_kube_writer(prepared, opts, kube, rt, health_rx, engine)?;
    }
    Ok(sinks)
}

/// Resource attributes of this agent (OTLP resource, Prometheus `target_info`).
pub fn resource_info(cfg: &Config) -> gpuwatch_sinks::otlp::ResourceInfo {
    gpuwatch_sinks::otlp::ResourceInfo {
        node_name: cfg.node_name.clone(),
        host_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        service_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

impl Sinks {
    /// The OTLP exporter: metrics, and one log record per fault.
    fn start_otlp(
        &mut self,
        otlp: &gpuwatch_sinks::otlp::OtlpSettings,
        cfg: &Config,
        registry: &Arc<Registry>,
        kube: &Arc<KubeMetrics>,
        rt: &tokio::runtime::Handle,
    ) -> Result<(), RunError> {
        // The exporter spawns its gRPC transport on the runtime.
        let _guard = rt.enter();
        let exporter = gpuwatch_sinks::otlp::OtlpExporter::start_resolved(
            otlp,
            &resource_info(cfg),
            registry.clone(),
            vec![kube.clone()],
            rt,
        )
        .map_err(|e| RunError::Sink {
            name: "otlp",
            message: e.to_string(),
        })?;
        tracing::info!(exporter = ?exporter, "OTLP export started.");
        self.event_sinks.push(exporter.log_sink());
        self.on_shutdown
            .push(Box::new(move |budget| exporter.shutdown(budget)));
        Ok(())
    }

    /// The Kubernetes node writer (conditions, taints, Events, startup
    /// gate); `--kube-dry-run` logs the patches instead of sending them.
    fn start_kube_writer(
        &mut self,
        prepared: &Prepared,
        opts: &RunOptions,
        kube: &Arc<KubeMetrics>,
        rt: &tokio::runtime::Handle,
        health_rx: tokio::sync::watch::Receiver<Arc<NodeHealth>>,
        engine: EngineLink,
    ) -> Result<(), RunError> {
        let EngineLink {
            tx: validation_tx,
            pods_ask,
        } = engine;
        // Startup-gate reports go to the engine (`/v1/health.validation`). The
        // writer only holds a weak reference to the engine channel: once the
        // agent drops the strong one (its inputs stopping), the engine's channel
        // can disconnect and drain while the writer still runs.
        let cfg = prepared.config();
        let pods_tx = validation_tx.clone();
        let on_validation: gpuwatch_kube::ValidationCallback = Arc::new(move |report| {
            let Some(tx) = validation_tx.upgrade() else {
                return;
            };
            if let Err(e) = tx.try_send(gpuwatch_core::msg::Input::Validation(report)) {
                tracing::debug!(error = %e, "Validation report not handed to the engine.");
            }
        });
        // The node's pods go to the engine the same way (weakly held).
        let on_pods: gpuwatch_kube::PlacementCallback = Arc::new(move |update| {
            let Some(tx) = pods_tx.upgrade() else {
                return;
            };
            if let Err(e) = tx.try_send(gpuwatch_core::msg::Input::Placement(update)) {
                tracing::debug!(error = %e, "Pod listing not handed to the engine.");
            }
        });
        let writer = rt
            .block_on(gpuwatch_kube::NodeWriter::start(
                prepared.kube().clone(),
                cfg.validation.clone(),
                cfg.node_name.clone(),
                kube.clone(),
                health_rx,
                opts.kube_dry_run,
                gpuwatch_kube::WriterHooks {
                    on_validation: Some(on_validation),
                    on_pods: Some(on_pods),
                    pods_ask: Some(pods_ask),
                    // A dry run shows nothing on the Node: it keeps no history
                    // for the agent that does.
                    state_dir: (!opts.kube_dry_run).then(|| cfg.state_dir.clone()),
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
