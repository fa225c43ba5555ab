//! Preparation: the configuration read once ([`resolve`]) and turned into the
//! value every part is built from ([`prepare`] → [`Prepared`]).
//!
//! `gpuwatch run` and `gpuwatch validate` both come through here, so the two
//! read a configuration file and their flags the same way and build the same
//! health engine and kernel-log reader from it.

use crate::attribution::podresources::KubeletSettings;
use crate::config::{Config, ConfigError, ConfigErrors};
use crate::kmsg::{self, KmsgSourceArgs};
use crate::nvml::NvmlSettings;
use crate::pipeline::{Liveness, StopReason};
use gpuwatch_core::engine::{BootInfo, Engine, EngineSettings};
use gpuwatch_core::network::NetworkSettings;
use gpuwatch_core::{Registry, Shutdown};
use gpuwatch_kube::KubeSettings;
use gpuwatch_sinks::otlp::OtlpSettings;
use std::path::Path;
use std::sync::Arc;

/// Why the configuration cannot become an agent (before anything starts).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    /// The policy overrides do not build.
    #[error("invalid policy: {0}")]
    Policy(#[from] xid_parser::PolicyError),
    /// The boot id is unreadable.
    #[error(transparent)]
    Boot(#[from] crate::boot::BootError),
}

/// Reads `file` (or takes the defaults), applies a command's `flags` onto it
/// (flags win), fills in the node name and validates: how every command that
/// builds the agent's parts reads its configuration. Returns what `flags`
/// returns beside the configuration (options that exist only as flags).
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
    cfg.validate().map_err(ConfigError::Invalid)?;
    Ok((cfg, extra))
}

/// The agent's configuration resolved into what its parts are built from: the
/// validated settings, the resolved `[kube]` and `[kubelet]` settings, the
/// classification policy and the boot it runs in. Nothing runs yet and
/// nothing is written.
#[derive(Debug, Clone)]
pub struct Prepared {
    cfg: Config,
    engine: EngineSettings,
    nvml: NvmlSettings,
    kube: KubeSettings,
    kubelet: KubeletSettings,
    network: NetworkSettings,
    otlp: Option<OtlpSettings>,
    policy: Arc<xid_parser::Policy>,
    boot: BootInfo,
}

/// Validates `cfg`, resolves `[kube]` and `[kubelet]`, builds the policy and
/// reads the boot id.
pub fn prepare(cfg: Config) -> Result<Prepared, PrepareError> {
    cfg.validate()?;
    let engine = cfg.engine.resolve().map_err(|p| in_section("engine", p))?;
    let nvml = cfg.nvml.resolve().map_err(|p| in_section("nvml", p))?;
    let kube = cfg.kube.resolve().map_err(|p| in_section("kube", p))?;
    let kubelet = cfg
        .kubelet
        .resolve()
        .map_err(|p| in_section("kubelet", p))?;
    let network = cfg
        .network
        .resolve()
        .map_err(|p| in_section("network", p))?;
    let otlp = cfg
        .otlp
        .resolve_for(&super::sinks::resource_info(&cfg), &|k: &str| {
            std::env::var(k).ok()
        })
        .map_err(|p| in_section("otlp", p))?;
    let policy = Arc::new(xid_parser::Policy::new(&cfg.policy)?);
    let boot = BootInfo {
        boot_id: crate::boot::read_boot_id(&cfg.kmsg.boot_id_path)?,
        boot_time_unix_nano: crate::boot::boot_time_unix_nanos(),
    };
    Ok(Prepared {
        cfg,
        engine,
        nvml,
        kube,
        kubelet,
        network,
        otlp,
        policy,
        boot,
    })
}

/// `problems` of section `name`, each prefixed with its key path.
fn in_section(name: &str, problems: Vec<String>) -> ConfigErrors {
    ConfigErrors(
        problems
            .into_iter()
            .map(|p| format!("{name}.{p}"))
            .collect(),
    )
}

impl Prepared {
    /// The validated configuration, flags applied.
    pub fn config(&self) -> &Config {
        &self.cfg
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

    /// The classification policy (built-in table plus `[policy]` overrides).
    pub fn policy(&self) -> &Arc<xid_parser::Policy> {
        &self.policy
    }

    /// The boot the agent runs in (boot id, boot time).
    pub fn boot(&self) -> &BootInfo {
        &self.boot
    }

    /// The engine of the running agent: it loads and writes
    /// `state_dir/health.json` and reports its heartbeat in `liveness`.
    pub(crate) fn agent_engine(&self, registry: &Arc<Registry>, liveness: &Liveness) -> Engine {
        let cfg = &self.cfg;
        let mut engine = Engine::new(
            self.engine.clone(),
            self.policy.clone(),
            Some(cfg.state_dir.clone()),
            self.boot.clone(),
            cfg.node_name.clone(),
            registry.clone(),
            Arc::new(gpuwatch_core::clock::SystemClock),
        );
        engine.set_heartbeat(liveness.engine_heartbeat());
        if self.nvml.enabled {
            // A sample older than three poll intervals no longer describes the
            // GPU (NVML stopped answering): Unknown, and it does not validate.
            engine.set_sample_max_age(self.nvml.poll_interval.saturating_mul(3));
        }
        if kmsg::is_device(&cfg.kmsg.path) {
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
        let cfg = &self.cfg;
        let engine = EngineSettings {
            nvml_join_grace_ns: 0,
            ..self.engine.clone()
        };
        Engine::new_read_only(
            engine,
            self.policy.clone(),
            cfg.state_dir.clone(),
            self.boot.clone(),
            cfg.node_name.clone(),
            registry.clone(),
            Arc::new(gpuwatch_core::clock::SystemClock),
        )
    }

    /// What the kernel-log reader is started with. It resumes after
    /// `engine`'s position (one state, one writer: the reader reports its
    /// progress to the engine, which writes it together with the faults).
    /// `stop_tx` is told when a replay ends (`exit_at_eof`).
    pub(crate) fn kmsg_source(
        &self,
        engine: &Engine,
        registry: &Arc<Registry>,
        liveness: &Arc<Liveness>,
        shutdown: Shutdown,
        stop_tx: Option<crossbeam_channel::Sender<StopReason>>,
    ) -> KmsgSourceArgs {
        KmsgSourceArgs {
            cfg: self.cfg.kmsg.clone(),
            resume: engine.kmsg_position().cloned(),
            boot_id: self.boot.boot_id.clone(),
            policy: self.policy.clone(),
            registry: registry.clone(),
            liveness: liveness.clone(),
            shutdown,
            stop_tx,
        }
    }
}
