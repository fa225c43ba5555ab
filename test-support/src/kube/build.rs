//! Builders for what the writer's tests feed it and serve it: a Node with
//! taints, labels and the device plugin's allocatable GPUs, the health the
//! engine publishes (healthy GPUs, an active fault, MIG devices), the fault
//! Events it forwards, and pods bound to a Node. Shared by the writer's
//! tests (`gpuwatch-kube`) and the agent's end-to-end tests.

use gpuwatch_proto::{
    Action, ActiveFault, FaultEvent, FaultKind, GpuHealth, MigDevice, NodeHealth, Verdict,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Pod, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The Node `name` with `taints` and `labels`. The device plugin advertises
/// (`status.allocatable["nvidia.com/gpu"]`) the count the
/// `nvidia.com/gpu.count` label says, 8 without that label.
pub fn node(name: &str, taints: Vec<Taint>, labels: &[(&str, &str)]) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    );
    n.spec = Some(NodeSpec {
        taints: Some(taints),
        ..Default::default()
    });
    let count = labels
        .iter()
        .find(|(k, _)| *k == "nvidia.com/gpu.count")
        .map_or("8", |(_, v)| v);
    n.status = Some(NodeStatus {
        allocatable: Some(BTreeMap::from([(
            "nvidia.com/gpu".to_owned(),
            Quantity(count.to_owned()),
        )])),
        ..Default::default()
    });
    n
}

/// A `NoSchedule` taint.
pub fn taint(key: &str, value: Option<&str>) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// Healthy GPU `i` (`GPU-<i>`, PCI bus `0x1b + i`) with a full PCIe link and
/// no row remapping or ECC errors.
pub fn gpu(i: u32) -> GpuHealth {
    gpuwatch_proto::test_util::healthy_gpu(i)
}

/// `h` with an active XID `code` on GPU `gpu` (index into `h.gpus`), seen
/// `count` times, asking for `action`: the GPU and the Node unhealthy.
pub fn with_fault(
    mut h: NodeHealth,
    gpu: usize,
    code: u32,
    action: Action,
    count: u64,
) -> NodeHealth {
    let mut f = ActiveFault {
        code,
        count,
        reason: format!("XID{code}"),
        boot_id: h.boot_id.clone(),
        message: format!("NVRM: Xid (PCI:0000:1b:00): {code}, occurrence {count}"),
        ..Default::default()
    };
    f.set_kind(FaultKind::Xid);
    f.set_action(action);
    h.gpus[gpu].active_faults.push(f);
    h.gpus[gpu].set_action(action);
    h.gpus[gpu].set_verdict(Verdict::Unhealthy);
    h.set_verdict(Verdict::Unhealthy);
    h.set_action(action);
    h.reason = format!("XID{code}");
    h
}

/// `h` with every GPU in MIG mode, `per_gpu` MIG devices each.
pub fn with_mig(mut h: NodeHealth, per_gpu: u32) -> NodeHealth {
    for (gi, g) in h.gpus.iter_mut().enumerate() {
        let s = g.sample.get_or_insert_with(Default::default);
        s.mig_enabled = Some(true);
        s.mig_devices = (0..per_gpu)
            .map(|i| MigDevice {
                uuid: format!("MIG-{gi:08x}-0000-5000-8000-{i:012x}"),
                gpu_instance: 7 + i,
                compute_instance: 0,
                ..Default::default()
            })
            .collect();
    }
    h
}

/// One XID `code` on GPU `gpu` at `t_nanos` (Unix nanoseconds) in boot
/// `boot-a`, classified as `action`.
pub fn xid_event(code: u32, action: Action, gpu: u32, t_nanos: u64) -> FaultEvent {
    let mut e = FaultEvent {
        code,
        gpu_index: Some(gpu),
        gpu_uuid: format!("GPU-{gpu}"),
        pci_address: "0000:1b:00.0".into(),
        message: format!("NVRM: Xid (PCI:0000:1b:00): {code}, pid=1234"),
        boot_id: "boot-a".into(),
        time_unix_nano: Some(t_nanos),
        count: 1,
        ..Default::default()
    };
    e.set_kind(FaultKind::Xid);
    e.classify(action, "catalog");
    e
}

/// Pod `namespace/name` (uid `uid`) bound to `node`, with a running
/// container per `(name, containerd id)` in `containers`.
pub fn pod_on(
    node: &str,
    namespace: &str,
    name: &str,
    uid: &str,
    containers: &[(&str, &str)],
) -> Pod {
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|(n, id)| serde_json::json!({"name": n, "containerID": format!("containerd://{id}"), "image": "img", "imageID": "", "ready": true, "restartCount": 0}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": {"containerStatuses": statuses},
    }))
    .expect("pod")
}

/// A ResourceSlice of the NVIDIA DRA driver (`gpu.nvidia.com`) named `name`
/// for Node `node`, its pool (the Node's name, as the driver names it) at
/// `generation`, publishing `devices` as `(name, uuid, parentUUID)`: a GPU
/// (`gpu-<minor>`, attribute `type` `gpu`) without a parent, a MIG device
/// (`gpu-<minor>-mig-<profile>-<id>-<start>`, `type` `mig`) with its GPU's
/// UUID. The attribute names and shapes are the driver's
/// (`cmd/gpu-kubelet-plugin/deviceinfo.go` of NVIDIA/k8s-dra-driver-gpu).
pub fn gpu_slice(
    name: &str,
    node: &str,
    generation: i64,
    devices: &[(&str, &str, Option<&str>)],
) -> serde_json::Value {
    use serde_json::json;
    let devices: Vec<serde_json::Value> = devices
        .iter()
        .map(|(n, uuid, parent)| {
            let mut attrs = json!({"uuid": {"string": uuid}, "type": {"string": "gpu"}});
            if let Some(p) = parent {
                attrs["parentUUID"] = json!({"string": p});
                attrs["type"] = json!({"string": "mig"});
            }
            json!({"name": n, "attributes": attrs})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "metadata": {"name": name},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices}})
}
