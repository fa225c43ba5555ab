//! The configuration resolved: [`Config::resolve_each`] checks and types
//! every section once and is the only way from a [`Config`] to what the
//! agent's parts are built from ([`Settings`], through [`Config::resolve`]
//! or [`Resolved::settings`]). Every command comes through it (`run`,
//! `validate`, `check-config`, `check-install`, and for the sections they
//! read `node-cleanup`, `clear`, `explain`, `scan`), so a file that
//! `check-config` accepts is one the agent starts with, and the checks are
//! the conversions: nothing is validated twice, and validation cannot
//! disagree with what runs.

use crate::attribution::podresources::KubeletSettings;
use crate::config::{
    Config, ConfigError, ConfigErrors, LogSettings, PrometheusSettings, parse_recovering,
    read_config_text,
};
use crate::kmsg::KmsgSettings;
use crate::nvml::NvmlSettings;
use gpuwatch_core::engine::EngineSettings;
use gpuwatch_core::network::NetworkSettings;
use gpuwatch_core::validation::ValidationSettings;
use gpuwatch_kube::KubeSettings;
use gpuwatch_sinks::otlp::{OtlpSection, OtlpSettings, ResourceInfo};
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
    stdout_sink: bool,
    log: LogSettings,
    validation: ValidationSettings,
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
    /// `gpuwatch check-config`: reads `path` and reports every problem in one
    /// pass: syntax errors; else every schema problem plus the validation
    /// problems of the rest of the file (entries with schema problems left out).
    /// An empty `node_name` is filled from `NODE_NAME` / the host name first.
    /// A file without problems gives the settings the agent would run with.
    pub fn check_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = read_config_text(path)?;
        let (cfg, parse) = parse_recovering(&text);
        let Some(mut cfg) = cfg else {
            return Err(ConfigError::Parse {
                path: path.to_path_buf(),
                problems: parse,
            });
        };
        cfg.fill_node_name();
        // The agent's own conversion: what it accepts here, it starts with.
        let invalid = match cfg.resolve() {
            Ok(settings) if parse.is_empty() => return Ok(settings),
            Ok(_) => ConfigErrors(Vec::new()),
            Err(invalid) => invalid,
        };
        Err(ConfigError::Check {
            path: path.to_path_buf(),
            parse,
            invalid,
        })
    }

    /// Resolves every section once ([`Config::resolve_each`]) into the
    /// settings of the whole agent; every problem of every section comes
    /// back in one error, each with its key path.
    pub fn resolve(self) -> Result<Settings, ConfigErrors> {
        self.resolve_each().settings()
    }

    /// Resolves every section once (`[validation]`, `[kmsg]`, `[engine]`,
    /// `[nvml]`, the policy, `[kube]`, `[kubelet]`, `[network]`, `[otlp]`
    /// with this process's `OTEL_*` environment and its TLS files,
    /// `/metrics`) and checks what is used as written (the node name, the
    /// state directory, `[api]`, `[sinks]`) and `[log]`. A command that needs
    /// the whole agent takes [`Resolved::settings`]; one that needs only
    /// some sections (`node-cleanup`: `[kube]`) takes those, so that a
    /// problem in a section it never reads does not stop it.
    pub fn resolve_each(self) -> Resolved {
        let cfg = self;
        let mut p = cfg.unresolved_problems();
        let validation = section("validation", cfg.validation.resolve(), &mut p);
        let state_dir = cfg
            .state_dir_problems()
            .is_empty()
            .then(|| cfg.state_dir.clone());
        let log = section("log", cfg.log.resolve(), &mut p);
        let kmsg = section("kmsg", cfg.kmsg.resolve(), &mut p);
        let engine = section("engine", cfg.engine.resolve(), &mut p);
        let nvml = section("nvml", cfg.nvml.resolve(), &mut p);
        let policy = xid_parser::Policy::new(&cfg.policy).map_err(|e| vec![format!("xid: {e}")]);
        let policy = section("policy", policy, &mut p).map(Arc::new);
        let kube = section("kube", cfg.kube.resolve(), &mut p);
        let kubelet = section("kubelet", cfg.kubelet.resolve(), &mut p);
        let network = section("network", cfg.network.resolve(), &mut p);
        let resource = crate::agent::resource_info(&cfg.node_name);
        let env = |k: &str| std::env::var(k).ok();
        let otlp = section("otlp", cfg.otlp.resolve_section(&resource, &env), &mut p);
        // `/metrics` is paced by `[otlp]`'s quiet window, as resolved there.
        let prometheus = otlp
            .as_ref()
            .and_then(|o| cfg.resolve_prometheus(o.pacing.series_quiet_window));
        Resolved {
            problems: p,
            api_listen: cfg.api.enabled.then(|| cfg.api.listen.clone()),
            node_name: cfg.node_name,
            state_dir,
            resource,
            stdout_sink: cfg.sinks.stdout,
            log,
            validation,
            kmsg,
            engine,
            nvml,
            kube,
            kubelet,
            network,
            otlp,
            prometheus,
            policy,
        }
    }
}

/// Every section of one configuration resolved on its own
/// ([`Config::resolve_each`]): the settings of each section that has no
/// problem, and every problem of every section, each with its key path.
#[derive(Debug)]
pub struct Resolved {
    /// Every problem, in the order [`Config::resolve`] reports them.
    problems: Vec<String>,
    node_name: String,
    /// `None` when `state_dir` has a problem.
    state_dir: Option<PathBuf>,
    resource: ResourceInfo,
    api_listen: Option<String>,
    stdout_sink: bool,
    log: Option<LogSettings>,
    validation: Option<ValidationSettings>,
    kmsg: Option<KmsgSettings>,
    engine: Option<EngineSettings>,
    nvml: Option<NvmlSettings>,
    kube: Option<KubeSettings>,
    kubelet: Option<KubeletSettings>,
    network: Option<NetworkSettings>,
    otlp: Option<OtlpSection>,
    prometheus: Option<PrometheusSettings>,
    policy: Option<Arc<xid_parser::Policy>>,
}

impl Resolved {
    /// The settings of the whole agent, or every problem of every section.
    pub fn settings(self) -> Result<Settings, ConfigErrors> {
        let r = self;
        let (
            Some(state_dir),
            Some(log),
            Some(validation),
            Some(kmsg),
            Some(engine),
            Some(nvml),
            Some(policy),
            Some(kube),
            Some(kubelet),
            Some(network),
            Some(otlp),
            true,
        ) = (
            r.state_dir,
            r.log,
            r.validation,
            r.kmsg,
            r.engine,
            r.nvml,
            r.policy,
            r.kube,
            r.kubelet,
            r.network,
            r.otlp,
            r.problems.is_empty(),
        )
        else {
            return Err(ConfigErrors(r.problems));
        };
        Ok(Settings {
            node_name: r.node_name,
            state_dir,
            resource: r.resource,
            resource_attributes: otlp.resource_attributes,
            api_listen: r.api_listen,
            stdout_sink: r.stdout_sink,
            log,
            validation,
            kmsg,
            engine,
            nvml,
            kube,
            kubelet,
            network,
            otlp: otlp.export,
            prometheus: r.prometheus,
            policy,
        })
    }

    /// The state directory (`state_dir`), or its problems.
    pub fn state_dir(&self) -> Result<&Path, ConfigErrors> {
        self.part(self.state_dir.as_deref(), "state_dir")
    }

    /// `[kube]` resolved, or its problems (each `kube.<key>: ...`).
    pub fn kube(&self) -> Result<&KubeSettings, ConfigErrors> {
        self.part(self.kube.as_ref(), "kube")
    }

    /// `[network]` resolved, or its problems (each `network.<key>: ...`).
    pub fn network(&self) -> Result<&NetworkSettings, ConfigErrors> {
        self.part(self.network.as_ref(), "network")
    }

    /// The classification policy (`[policy]` over the built-in table), or
    /// its problems (each `policy.<key>: ...`).
    pub fn policy(&self) -> Result<&Arc<xid_parser::Policy>, ConfigErrors> {
        self.part(self.policy.as_ref(), "policy")
    }

    /// `value`, or the problems whose key path is `key` or under it.
    fn part<'a, T: ?Sized>(&self, value: Option<&'a T>, key: &str) -> Result<&'a T, ConfigErrors> {
        value.ok_or_else(|| {
            ConfigErrors(
                self.problems
                    .iter()
                    .filter(|p| {
                        p.strip_prefix(key)
                            .is_some_and(|rest| rest.starts_with(['.', ':']))
                    })
                    .cloned()
                    .collect(),
            )
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

    /// Whether every fault event is also written as one JSON line on
    /// stdout (`[sinks] stdout`).
    pub fn stdout_sink(&self) -> bool {
        self.stdout_sink
    }

    /// How the agent's own log is written (`[log]`), resolved.
    pub fn log(&self) -> &LogSettings {
        &self.log
    }

    /// The startup gate's device validation (`[validation]`).
    pub fn validation(&self) -> &ValidationSettings {
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

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::path::Path;

    fn resolved(text: &str) -> super::Resolved {
        Config::parse(Path::new("t.toml"), text)
            .unwrap()
            .resolve_each()
    }

    fn keys(problems: &[String]) -> Vec<&str> {
        problems
            .iter()
            .map(|p| p.split(':').next().unwrap())
            .collect()
    }

    /// A command that needs some sections (`node-cleanup`: `[kube]`) gets them
    /// while another section has problems, and a section's own problems are
    /// its alone, each naming its key.
    #[test]
    fn a_section_resolves_while_another_has_problems() {
        let r = resolved(
            "node_name = \"n1\"\n[kube]\nproblem_condition_type = \"MyGPUProblem\"\n[otlp]\nexport_interval_secs = 0\n[network]\nflap_threshold = 0\n",
        );
        let owned = r.kube().unwrap().owned_condition_types();
        assert!(owned.iter().any(|t| t == "MyGPUProblem"), "{owned:?}");
        assert!(r.policy().is_ok() && r.state_dir().is_ok());
        assert_eq!(
            keys(&r.network().unwrap_err().0),
            ["network.flap_threshold"]
        );
        let all = r.settings().unwrap_err().0;
        assert_eq!(
            keys(&all),
            ["network.flap_threshold", "otlp.export_interval_secs"],
            "{all:#?}"
        );

        let r = resolved(
            "node_name = \"n1\"\nstate_dir = \"rel\"\n[kube]\nevent_namespace = \"Not A Namespace\"\n",
        );
        assert_eq!(keys(&r.kube().unwrap_err().0), ["kube.event_namespace"]);
        assert_eq!(keys(&r.state_dir().unwrap_err().0), ["state_dir"]);
        assert!(r.network().is_ok());
    }

    /// The whole agent's settings are what `resolve` gives: one conversion.
    #[test]
    fn settings_are_the_sections_resolved() {
        let r = resolved(
            "node_name = \"n1\"\nstate_dir = \"/srv/gw\"\n[kube]\nproblem_condition_type = \"MyGPUProblem\"\n",
        );
        let kube = r.kube().unwrap().clone();
        let settings = r.settings().unwrap();
        assert_eq!(settings.kube(), &kube);
        assert_eq!(settings.state_dir(), Path::new("/srv/gw"));
    }
}
