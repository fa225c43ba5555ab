//! The health a node publishes when nothing is wrong, for the tests of every
//! crate that reads a `NodeHealth`: the engine's device validation, the
//! Kubernetes writer, the exporters and the agent. Tests that need other
//! GPUs or another state start from it and change what they need.

use gpuwatch_proto::test_util::{healthy_gpu, set_input};
use gpuwatch_proto::{InputState, MonitorStatus, NodeHealth, Verdict};

/// The health of Node `node` with `n` healthy GPUs (`healthy_gpu`: `GPU-<i>`,
/// PCI bus `0x1b + i`, a clean sample) in boot `boot`, as the engine
/// publishes it when nothing is wrong (`core/src/engine/health.rs`): both
/// monitors up, the kernel-log ring read to its end, verdict Healthy, reason
/// `Healthy`.
pub fn healthy(node: &str, n: u32, boot: &str) -> NodeHealth {
    let mut h = NodeHealth {
        node_name: node.into(),
        boot_id: boot.into(),
        reason: "Healthy".into(),
        monitor: Some(MonitorStatus {
            message: String::new(),
            kmsg_caught_up: true,
            ..Default::default()
        }),
        gpus: (0..n).map(healthy_gpu).collect(),
        ..Default::default()
    };
    let m = h.monitor.as_mut().expect("set above");
    set_input(m, "kmsg", InputState::Up, "reading /dev/kmsg");
    set_input(m, "nvml", InputState::Up, "");
    h.set_verdict(Verdict::Healthy);
    h
}
