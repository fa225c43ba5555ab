//! A health engine on a manual clock ([`Rig`]), and builders for kernel-log
//! events and NVML samples of two simulated GPUs.

use gpuwatch_core::Registry;
use gpuwatch_core::clock::{Clock, ManualClock};
use gpuwatch_core::engine::{BootInfo, Engine, EngineConfig};
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, GpuSample, NodeHealth, Source, Verdict};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use xid_parser::{Policy, PolicyOverrides, XidOverride};

/// PCI addresses of the two simulated GPUs.
pub const PCI0: &str = "0000:3b:00.0";
pub const PCI1: &str = "0000:86:00.0";
pub const UUID0: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
pub const UUID1: &str = "GPU-bbbbbbbb-1111-1111-1111-111111111111";

/// An engine plus the handles a test needs.
pub struct Rig {
    pub engine: Engine,
    pub clock: Arc<ManualClock>,
    pub registry: Arc<Registry>,
    pub state_dir: Option<PathBuf>,
}

pub fn start_time() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

pub fn boot(id: &str) -> BootInfo {
    BootInfo {
        boot_id: id.to_string(),
        boot_time_unix_nano: 0,
    }
}

/// One policy override: XID, action, threshold `(count, window_secs)`.
pub type Override = (u32, Option<Action>, Option<(u32, u64)>);

/// Policy with overrides.
pub fn policy(overrides: &[Override]) -> Arc<Policy> {
    let mut o = PolicyOverrides::default();
    for (xid, action, threshold) in overrides {
        o.xid.insert(
            xid.to_string(),
            XidOverride {
                action: *action,
                threshold: threshold
                    .map(|(count, window_secs)| xid_parser::CountWindow { count, window_secs }),
                recurrence_reboots: None,
            },
        );
    }
    Arc::new(Policy::new(&o).expect("valid test policy"))
}

impl Rig {
    pub fn new(state_dir: Option<&Path>, boot_id: &str) -> Rig {
        Rig::with(
            EngineConfig::default(),
            Arc::new(Policy::default()),
            state_dir,
            boot_id,
            Arc::new(ManualClock::new(start_time())),
        )
    }

    /// An engine that publishes kernel-log faults at once even before the
    /// first NVML poll (NVML slower than `nvml_join_grace_secs`).
    pub fn without_join_grace(state_dir: Option<&Path>, boot_id: &str) -> Rig {
        Rig::with(
            EngineConfig {
                nvml_join_grace_secs: 0,
                ..EngineConfig::default()
            },
            Arc::new(Policy::default()),
            state_dir,
            boot_id,
            Arc::new(ManualClock::new(start_time())),
        )
    }

    /// An engine with `cfg` as a configuration file would give it (resolved
    /// here: an invalid test setting fails the test).
    pub fn with(
        cfg: EngineConfig,
        policy: Arc<Policy>,
        state_dir: Option<&Path>,
        boot_id: &str,
        clock: Arc<ManualClock>,
    ) -> Rig {
        let registry = Registry::new();
        let engine = Engine::new(
            cfg.resolve().expect("valid test [engine] settings"),
            policy,
            state_dir.map(Path::to_path_buf),
            boot(boot_id),
            "node-a".into(),
            Arc::clone(&registry),
            Arc::clone(&clock) as Arc<dyn Clock>,
        );
        Rig {
            engine,
            clock,
            registry,
            state_dir: state_dir.map(Path::to_path_buf),
        }
    }

    pub fn advance(&mut self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
        self.engine.handle(Input::Tick);
    }

    pub fn fault(&mut self, ev: FaultEvent) -> Vec<FaultEvent> {
        self.engine.handle(Input::Fault {
            event: ev,
            read_at: Instant::now(),
        })
    }

    /// Moves the clock and returns what the tick published.
    pub fn tick(&mut self, secs: u64) -> Vec<FaultEvent> {
        self.clock.advance(Duration::from_secs(secs));
        self.engine.handle(Input::Tick)
    }

    /// One incomplete NVML poll (some GPU could not be read).
    pub fn partial_samples(&mut self, s: Vec<GpuSample>) -> Vec<FaultEvent> {
        self.engine.handle(Input::Samples {
            samples: s,
            complete: false,
        })
    }

    /// An NVML XID event for a GPU (identity by UUID and PCI address).
    pub fn nvml_xid(code: u32, uuid: &str, pci: &str) -> FaultEvent {
        let mut ev = FaultEvent {
            code,
            pci_address: pci.to_string(),
            gpu_uuid: uuid.to_string(),
            message: format!("NVML critical XID {code}"),
            count: 1,
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        ev.set_source(Source::NvmlEvent);
        ev
    }

    pub fn samples(&mut self, s: Vec<GpuSample>) -> Vec<FaultEvent> {
        self.engine.handle(Input::Samples {
            samples: s,
            complete: true,
        })
    }

    pub fn nvml(&mut self, ok: bool, message: &str) {
        self.engine.handle(Input::MonitorStatus {
            input: MonitorInput::Nvml,
            ok,
            message: message.into(),
        });
    }

    /// Where the node's pods run, as the pod listing or the kubelet says.
    pub fn placement(&mut self, update: gpuwatch_core::placement::PlacementUpdate) {
        self.engine.handle(Input::Placement(update));
    }

    pub fn health(&self) -> Arc<NodeHealth> {
        self.engine.health()
    }

    pub fn gpu_verdict(&self, pci: &str) -> Verdict {
        self.health()
            .gpus
            .iter()
            .find(|g| g.pci_address == pci)
            .map(|g| g.verdict())
            .unwrap_or(Verdict::Unspecified)
    }

    /// Active fault reasons of one GPU.
    pub fn gpu_faults(&self, pci: &str) -> Vec<String> {
        self.health()
            .gpus
            .iter()
            .find(|g| g.pci_address == pci)
            .map(|g| g.active_faults.iter().map(|f| f.reason.clone()).collect())
            .unwrap_or_default()
    }
}

/// A kernel-log XID event (unclassified, as the engine may receive it).
pub fn xid(code: u32, pci: &str) -> FaultEvent {
    let mut ev = FaultEvent {
        code,
        pci_address: pci.to_string(),
        message: format!("NVRM: Xid (PCI:{pci}): {code}, pid=1234, name=python"),
        count: 1,
        ..Default::default()
    };
    ev.set_kind(FaultKind::Xid);
    ev.set_source(Source::Kmsg);
    ev
}

/// A healthy H100-like sample.
pub fn sample(index: u32, uuid: &str, pci: &str) -> GpuSample {
    GpuSample {
        uuid: uuid.to_string(),
        pci_address: pci.to_string(),
        name: "NVIDIA H100 80GB HBM3".into(),
        temperature_c: Some(40),
        ecc_volatile_corrected: Some(0),
        clock_event_reasons: Some(0),
        ..gpuwatch_proto::test_util::clean_sample(index)
    }
}

pub fn two_gpus() -> Vec<GpuSample> {
    vec![sample(0, UUID0, PCI0), sample(1, UUID1, PCI1)]
}
