//! Preparation: the configuration read once ([`resolve`]) and turned into the
//! value every part is built from ([`prepare`] → [`Prepared`]).
//!
//! `gpuwatch run` and `gpuwatch validate` both come through here, so the two
//! read a configuration file and their flags the same way and build the same
//! health engine and kernel-log reader from it.

use crate::config::{Config, ConfigError, ConfigErrors, Overrides};
use crate::kmsg::{self, KmsgSourceArgs};
use crate::liveness::Liveness;
use crate::pipeline::StopReason;
use crate::settings::Settings;
use gpuwatch_core::Registry;
use gpuwatch_core::engine::{BootInfo, Engine, EngineSettings};
use std::path::Path;
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

/// Reads `file` (or takes the defaults), applies a command's flags
/// (`overrides`, which win) and fills in the node name: how every command
/// that builds the agent's parts reads its configuration. It does not
/// validate: [`prepare`] checks every section as it resolves it, once.
pub fn resolve(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let mut cfg = match file {
        Some(p) => Config::load(p)?,
        None => Config::defaults(),
    };
    cfg.apply(overrides);
    cfg.fill_node_name();
    Ok(cfg)
}

/// The agent's configuration resolved (`Settings`) and the boot it runs
/// in: what its parts are built from. Nothing runs yet and nothing is
/// written. The settings are reached through it as through a reference.
#[derive(Debug, Clone)]
pub struct Prepared {
    settings: Settings,
    boot: BootInfo,
}

impl std::ops::Deref for Prepared {
    type Target = Settings;
    fn deref(&self) -> &Settings {
        &self.settings
    }
}

/// Resolves the configuration ([`Config::resolve`], as every command does)
/// and reads the boot id.
pub fn prepare(cfg: Config) -> Result<Prepared, PrepareError> {
    let settings = cfg.resolve()?;
    let boot = BootInfo {
        boot_id: crate::boot::read_boot_id(&settings.kmsg().boot_id_path)?,
        boot_time_unix_nano: crate::boot::boot_time_unix_nanos(),
    };
    Ok(Prepared { settings, boot })
}

impl Prepared {
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
            self.engine().clone(),
            self.policy().clone(),
            Some(self.state_dir().to_path_buf()),
            self.boot.clone(),
            self.node_name().to_owned(),
            registry.clone(),
            Arc::new(gpuwatch_core::clock::SystemClock),
        );
        engine.set_heartbeat(liveness.engine_heartbeat());
        if self.nvml().enabled {
            // A sample older than three poll intervals no longer describes the
            // GPU (NVML stopped answering): Unknown, and it does not validate.
            engine.set_sample_max_age(self.nvml().poll_interval.saturating_mul(3));
        }
        if kmsg::is_device(&self.kmsg().path) {
            engine.track_kmsg_position();
        }
        engine.set_network(self.network().clone());
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
            ..self.engine().clone()
        };
        Engine::new_read_only(
            engine,
            self.policy().clone(),
            self.state_dir().to_path_buf(),
            self.boot.clone(),
            self.node_name().to_owned(),
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
        stop_tx: Option<crossbeam_channel::Sender<StopReason>>,
    ) -> KmsgSourceArgs {
        let (spent_tx, spent_rx) = gpuwatch_core::msg::spent_events();
        engine.return_spent_events(spent_tx);
        KmsgSourceArgs {
            cfg: self.kmsg().clone(),
            resume: engine.kmsg_position().cloned(),
            boot_id: self.boot.boot_id.clone(),
            policy: self.policy().clone(),
            registry: registry.clone(),
            liveness: liveness.clone(),
            stop_tx,
            spent: Some(spent_rx),
        }
    }
}
