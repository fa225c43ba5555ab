//! Preparation: the configuration read once ([`resolve`]) and turned into the
//! value every part is built from ([`prepare`] → [`Prepared`]).
//!
//! `gpuwatch run` and `gpuwatch validate` both come through here, so the two
//! read a configuration file and their flags the same way and build the same
//! health engine and kernel-log reader from it.

use crate::attribution::podresources::KubeletSettings;
use crate::config::{Config, ConfigError, ConfigErrors, PrometheusSettings, SinkSelection};
use crate::kmsg::{self, KmsgSettings, KmsgSourceArgs};
use crate::nvml::NvmlSettings;
use crate::pipeline::{Liveness, StopReason};
use gpuwatch_core::engine::{BootInfo, Engine, EngineSettings};
use gpuwatch_core::network::NetworkSettings;
use gpuwatch_core::validation::ValidationConfig;
use gpuwatch_core::{Registry, Shutdown};
use gpuwatch_kube::KubeSettings;
use gpuwatch_sinks::otlp::{OtlpSettings, ResourceInfo};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why the configuration cannot become an agent (before anything starts).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    /// The boot id is unreadable.
    #[error(transparent)]
    Boot(#[from] crate::boot::BootError),
}

/// Reads `file` (or takes the defaults), applies a command's `flags` onto it
/// (flags win) and fills in the node name: how every command that builds the
/// agent's parts reads its configuration. It does not validate: [`prepare`]
/// checks every section as it resolves it, once. Returns what `flags` returns
/// beside the configuration (options that exist only as flags).
pub fn resolve<T>(
    file: Option<&Path>,
    flags: impl FnOnce(&mut Config) -> T,
) -> Result<(Config, T), ConfigError> {
    let mut cfg = match file {
        Some(p) => Config::load(p)?,
        None => Config::defaults(),
    };
    let extra = flags(&mut cfg);
    cfg.fill_node_name();
    Ok((cfg, extra))
}

/// The agent's configuration resolved into what its parts are built from: the
/// validated settings, the resolved `[kube]` and `[kubelet]` settings, the
/// classification policy and the boot it runs in. Nothing runs yet and
/// nothing is written.
#[derive(Debug, Clone)]
pub struct Prepared {
    node_name: String,
    state_dir: PathBuf,
    resource: ResourceInfo,
    /// The whole resource (built-in, `OTEL_RESOURCE_ATTRIBUTES`,
    /// `otlp.resource_attributes`), the agent's own pod left out.
    resource_attributes: std::collections::BTreeMap<String, String>,
    api_listen: Option<String>,
    sinks: SinkSelection,
    validation: ValidationConfig,
    kmsg: KmsgSettings,
    engine: EngineSettings,
    nvml: NvmlSettings,
    kube: KubeSettings,
    kubelet: KubeletSettings,
    network: NetworkSettings,
    otlp: Option<OtlpSettings>,
    prometheus: Option<PrometheusSettings>,
    policy: Arc<xid_parser::Policy>,
    boot: BootInfo,
}

/// Resolves every section once (`[kmsg]`, `[engine]`, `[nvml]`, the
/// policy, `[kube]`, `[kubelet]`, `[network]`, `[otlp]` with its environment
/// and TLS files, `/metrics`), checks what no resolve covers
/// ([`Config::unresolved_problems`]) and reads the boot id. Every problem of
/// every section comes back in one error: the checks are the resolves, so
/// nothing is validated twice and validation cannot disagree with what runs.
pub fn prepare(cfg: Config) -> Result<Prepared, PrepareError> {
    let mut p = cfg.unresolved_problems();
    let kmsg = section("kmsg", cfg.kmsg.resolve(), &mut p);
    let engine = section("engine", cfg.engine.resolve(), &mut p);
    let nvml = section("nvml", cfg.nvml.resolve(), &mut p);
    let policy = xid_parser::Policy::new(&cfg.policy).map_err(|e| vec![format!("xid: {e}")]);
    let policy = section("policy", policy, &mut p);
    let kube = section("kube", cfg.kube.resolve(), &mut p);
    let kubelet = section("kubelet", cfg.kubelet.resolve(), &mut p);
    let network = section("network", cfg.network.resolve(), &mut p);
    let resource = super::sinks::resource_info(&cfg.node_name);
    let env = |k: &str| std::env::var(k).ok();
    let otlp = section("otlp", cfg.otlp.resolve_for(&resource, &env), &mut p).flatten();
    if !cfg.otlp.enabled {
        // Off, the export resolves to nothing; its keys are still checked.
        p.extend(cfg.otlp.validate().into_iter().map(|e| format!("otlp.{e}")));
    }
    let prometheus = cfg.resolve_prometheus();
    // The whole resource, as the OTLP export resolves it, for /metrics'
    // target_info (the built-in attributes if the environment's are invalid:
    // the OTLP export reports that when it is on).
    let mut resource_attributes =
        gpuwatch_sinks::otlp::resource_attributes(&resource, &cfg.otlp, &env)
            .unwrap_or_else(|_| resource.attributes().into_iter().collect());
    gpuwatch_sinks::otlp::drop_own_pod(&mut resource_attributes);
    let (
        Some(kmsg),
        Some(engine),
        Some(nvml),
        Some(policy),
        Some(kube),
        Some(kubelet),
        Some(network),
        true,
    ) = (
        kmsg,
        engine,
        nvml,
        policy,
        kube,
        kubelet,
        network,
        p.is_empty(),
    )
    else {
        return Err(ConfigErrors(p).into());
    };
    let boot = BootInfo {
        boot_id: crate::boot::read_boot_id(&kmsg.boot_id_path)?,
        boot_time_unix_nano: crate::boot::boot_time_unix_nanos(),
    };
    Ok(Prepared {
        api_listen: cfg.api.enabled.then(|| cfg.api.listen.clone()),
        node_name: cfg.node_name,
        state_dir: cfg.state_dir,
        resource,
        resource_attributes,
        sinks: cfg.sinks,
        validation: cfg.validation,
        kmsg,
        engine,
        nvml,
        kube,
        kubelet,
        network,
        otlp,
        prometheus,
        policy: Arc::new(policy),
        boot,
    })
}

/// The resolved section `name`, or `None` with its problems added to `all`,
/// each prefixed with its key path.
fn section<T>(name: &str, resolved: Result<T, Vec<String>>, all: &mut Vec<String>) -> Option<T> {
    match resolved {
        Ok(settings) => Some(settings),
        Err(problems) => {
            all.extend(problems.into_iter().map(|p| format!("{name}.{p}")));
            None
        }
    }
}

impl Prepared {
    /// The Kubernetes node the agent watches (flag, file, `NODE_NAME` or
    /// the host name).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Where `health.json` and the operator-clear socket live.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// What the exports say about this agent (node, host, version).
    pub fn resource(&self) -> &ResourceInfo {
        &self.resource
    }

    /// The local API's listen address; `None` while `[api]` is off.
    pub fn api_listen(&self) -> Option<&str> {
        self.api_listen.as_deref()
    }

    /// Which local event sinks are on.
    pub fn sinks(&self) -> &SinkSelection {
        &self.sinks
    }

    /// The startup gate's device validation (`[validation]`).
    pub fn validation(&self) -> &ValidationConfig {
        &self.validation
    }

    /// The kernel-log source's settings (`[kmsg]`, flags applied), resolved.
    pub fn kmsg(&self) -> &KmsgSettings {
        &self.kmsg
    }

    /// The health engine's settings (`[engine]`), resolved.
    pub fn engine(&self) -> &EngineSettings {
        &self.engine
    }

    /// The NVML sources' settings (`[nvml]`), resolved.
    pub fn nvml(&self) -> &NvmlSettings {
        &self.nvml
    }

    /// The node writer's settings (`[kube]`), resolved.
    pub fn kube(&self) -> &KubeSettings {
        &self.kube
    }

    /// The kubelet PodResources poller's settings (`[kubelet]`), resolved.
    pub fn kubelet(&self) -> &KubeletSettings {
        &self.kubelet
    }

    /// The NIC monitor's settings (`[network]`), resolved.
    pub fn network(&self) -> &NetworkSettings {
        &self.network
    }

    /// The OTLP exporter's settings (`[otlp]` with the `OTEL_*` environment
    /// and the TLS files), resolved; `None` while the export is off.
    pub fn otlp(&self) -> Option<&OtlpSettings> {
        self.otlp.as_ref()
    }

    /// The whole resource as the OTLP export resolves it (built-in
    /// attributes, `OTEL_RESOURCE_ATTRIBUTES`, `otlp.resource_attributes`;
    /// the agent's own pod left out): `/metrics`' `target_info`.
    pub fn resource_attributes(&self) -> &std::collections::BTreeMap<String, String> {
        &self.resource_attributes
    }

    /// The Prometheus `/metrics` renderer's settings; `None` while
    /// `[api] prometheus` is off.
    pub fn prometheus(&self) -> Option<&PrometheusSettings> {
        self.prometheus.as_ref()
    }

    /// The classification policy (built-in table plus `[policy]` overrides).
    pub fn policy(&self) -> &Arc<xid_parser::Policy> {
        &self.policy
    }

    /// The boot the agent runs in (boot id, boot time).
    pub fn boot(&self) -> &BootInfo {
        &self.boot
    }

    /// Everything prepared but the boot time (a clock reading taken at each
    /// preparation), as text: two preparations of one configuration give
    /// the same text.
    pub fn settings_text(&self) -> String {
        let mut p = self.clone();
        p.boot.boot_time_unix_nano = 0;
        format!("{p:#?}")
    }

    /// The engine of the running agent: it loads and writes
    /// `state_dir/health.json` and reports its heartbeat in `liveness`.
    pub(crate) fn agent_engine(&self, registry: &Arc<Registry>, liveness: &Liveness) -> Engine {
        let mut engine = Engine::new(
            self.engine.clone(),
            self.policy.clone(),
            Some(self.state_dir.clone()),
            self.boot.clone(),
            self.node_name.clone(),
            registry.clone(),
            Arc::new(gpuwatch_core::clock::SystemClock),
        );
        engine.set_heartbeat(liveness.engine_heartbeat());
        if self.nvml.enabled {
            // A sample older than three poll intervals no longer describes the
            // GPU (NVML stopped answering): Unknown, and it does not validate.
            engine.set_sample_max_age(self.nvml.poll_interval.saturating_mul(3));
        }
        if kmsg::is_device(&self.kmsg.path) {
            engine.track_kmsg_position();
        }
        engine.set_network(self.network.clone());
        liveness.set_state_loaded();
        engine
    }

    /// The engine of a one-shot check beside a running agent: same settings,
    /// the agent's persisted state read but never written (the agent owns
    /// it), so a fault it holds — active or escalated in an earlier boot —
    /// counts like one found now. No join grace: a kernel-log fault on a GPU
    /// NVML does not list (fallen off the bus) must count now, as a node
    /// fault.
    pub(crate) fn read_only_engine(&self, registry: &Arc<Registry>) -> Engine {
        let engine = EngineSettings {
            nvml_join_grace_ns: 0,
            ..self.engine.clone()
        };
        Engine::new_read_only(
            engine,
            self.policy.clone(),
            self.state_dir.clone(),
            self.boot.clone(),
            self.node_name.clone(),
            registry.clone(),
            Arc::new(gpuwatch_core::clock::SystemClock),
        )
    }

    /// What the kernel-log reader is started with. It resumes after
    /// `engine`'s position (one state, one writer: the reader reports its
    /// progress to the engine, which writes it together with the faults).
    /// `stop_tx` is told when a replay ends (`exit_at_eof`). The events
    /// `engine` emits come back to the reader for reuse.
    pub(crate) fn kmsg_source(
        &self,
        engine: &mut Engine,
        registry: &Arc<Registry>,
        liveness: &Arc<Liveness>,
        shutdown: Shutdown,
        stop_tx: Option<crossbeam_channel::Sender<StopReason>>,
    ) -> KmsgSourceArgs {
        let (spent_tx, spent_rx) = gpuwatch_core::msg::spent_events();
        engine.return_spent_events(spent_tx);
        KmsgSourceArgs {
            cfg: self.kmsg.clone(),
            resume: engine.kmsg_position().cloned(),
            boot_id: self.boot.boot_id.clone(),
            policy: self.policy.clone(),
            registry: registry.clone(),
            liveness: liveness.clone(),
            shutdown,
            stop_tx,
            spent: Some(spent_rx),
        }
    }
}
