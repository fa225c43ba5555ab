//! The configuration resolved: [`Config::resolve`] checks and types every
//! section once and is the only way from a [`Config`] to what the agent's
//! parts are built from ([`Settings`]). `gpuwatch run`, `validate`,
//! `check-config` and `check-install` all come through it, so a file that
//! `check-config` accepts is one the agent starts with, and the checks are
//! the conversions: nothing is validated twice, and validation cannot
//! disagree with what runs.

use crate::attribution::podresources::KubeletSettings;
use crate::config::{Config, ConfigErrors, PrometheusSettings, SinkSelection};
use crate::kmsg::KmsgSettings;
use crate::nvml::NvmlSettings;
use gpuwatch_core::engine::EngineSettings;
use gpuwatch_core::network::NetworkSettings;
use gpuwatch_core::validation::ValidationConfig;
use gpuwatch_kube::KubeSettings;
use gpuwatch_sinks::otlp::{OtlpSettings, ResourceInfo};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every section of the configuration, checked and typed: durations as
/// `Duration`, actions as `Action`, the OTLP export with its environment and
/// TLS files, the classification policy built.
#[derive(Debug, Clone)]
pub struct Settings {
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
}

impl Config {
    /// Resolves every section once (`[kmsg]`, `[engine]`, `[nvml]`, the
    /// policy, `[kube]`, `[kubelet]`, `[network]`, `[otlp]` with this
    /// process's `OTEL_*` environment and its TLS files, `/metrics`) and
    /// checks what is used as written (the node name, the state directory,
    /// `[api]`, `[sinks]`, `[validation]`, `[log]`). Every problem of every
    /// section comes back in one error, each with its key path.
    pub fn resolve(self) -> Result<Settings, ConfigErrors> {
        let cfg = self;
        let mut p = cfg.unresolved_problems();
        let kmsg = section("kmsg", cfg.kmsg.resolve(), &mut p);
        let engine = section("engine", cfg.engine.resolve(), &mut p);
        let nvml = section("nvml", cfg.nvml.resolve(), &mut p);
        let policy = xid_parser::Policy::new(&cfg.policy).map_err(|e| vec![format!("xid: {e}")]);
        let policy = section("policy", policy, &mut p);
        let kube = section("kube", cfg.kube.resolve(), &mut p);
        let kubelet = section("kubelet", cfg.kubelet.resolve(), &mut p);
        let network = section("network", cfg.network.resolve(), &mut p);
        let resource = crate::agent::resource_info(&cfg.node_name);
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
            return Err(ConfigErrors(p));
        };
        Ok(Settings {
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
        })
    }
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

impl Settings {
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

    /// The whole resource as the OTLP export sends it (the built-in
    /// attributes, `OTEL_RESOURCE_ATTRIBUTES`, `otlp.resource_attributes`;
    /// the agent's own pod left out): `/metrics`' `target_info`.
    pub fn resource_attributes(&self) -> &std::collections::BTreeMap<String, String> {
        &self.resource_attributes
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

    /// The Prometheus `/metrics` renderer's settings; `None` while
    /// `[api] prometheus` is off.
    pub fn prometheus(&self) -> Option<&PrometheusSettings> {
        self.prometheus.as_ref()
    }

    /// The classification policy (built-in table plus `[policy]` overrides).
    pub fn policy(&self) -> &Arc<xid_parser::Policy> {
        &self.policy
    }
}
