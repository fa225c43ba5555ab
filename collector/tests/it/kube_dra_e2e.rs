//! Device isolation end to end through the real `gpuwatch` binary, as
//! `kube_e2e` runs it (kernel-log FIFO, nvml-sim board, the API double),
//! with the double serving `resource.k8s.io` and the NVIDIA DRA driver's
//! ResourceSlice for the Node's GPUs 0 and 1: an XID 48 on GPU 1 becomes a
//! DeviceTaintRule for `gpu-1` and no Node fault taint (`/v1/health` lists
//! the device); a kill -9 and restart on the same state converges to the
//! same rule and writes none; an XID 79 on the same GPU taints the Node; a
//! new boot in which the GPU validates deletes the rule and the taint; a
//! cluster refusing the rules (403) gets the Node taint, the reason in
//! `GPUProblem` and one warning.

use crate::kube_support::{
    FAULT_TAINT, KubeAgent, KubeWorld, NODE, Nvml, PROBLEM, T, node, wait_until,
};
use gpuwatch_test_support::kube::DraServed;
use gpuwatch_test_support::kube::build::gpu_slice;
use serde_json::Value;
use std::collections::BTreeMap;

const BOARD: &str = "kube-8gpu-healthy.toml";
const GPU0_UUID: &str = "GPU-6b1c2d3e-4f50-4a61-8b72-93a4b5c6d7e0";
const GPU1_UUID: &str = "GPU-6b1c2d3e-4f50-4a61-8b72-93a4b5c6d7e1";
const RULE1: &str = "gpuwatch-kube-e2e-node-gpu-1";

/// XID 48 (double-bit ECC error) on GPU 1, as the driver logs it.
const XID48: &str = "NVRM: Xid (PCI:0000:43:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.";
/// XID 79 on GPU 1.
const XID79: &str =
    "NVRM: Xid (PCI:0000:43:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.";

/// A world whose double serves DeviceTaintRules in v1 and the driver's
/// slice publishing GPUs 0 and 1.
fn dra_world() -> KubeWorld {
    let rig = KubeWorld::new(node(vec![]));
    rig.api.serve_dra(DraServed::rules_in(&["v1"]));
    rig.api.put_resource_slice(gpu_slice(
        "kube-e2e-node-gpu.nvidia.com",
        NODE,
        1,
        &[("gpu-0", GPU0_UUID, None), ("gpu-1", GPU1_UUID, None)],
    ));
    rig
}

fn rule_writes(rig: &KubeWorld) -> usize {
    rig.requests()
        .iter()
        .filter(|r| r.resource == "devicetaintrules" && r.is_write())
        .count()
}

fn problem_true(rig: &KubeWorld) -> bool {
    rig.cond_status(PROBLEM).0 == "True"
}

/// XID 48 on GPU 1 → one DeviceTaintRule isolating DRA device gpu-1 (by
/// its pool, labelled with the GPU's UUID) and no Node fault taint;
/// GPUProblem names the fault and the device, `/v1/health` the rule. The
/// rules.
fn assert_xid48_isolates_gpu_1(rig: &mut KubeWorld, agent: &KubeAgent) -> BTreeMap<String, Value> {
    rig.write_kmsg(XID48);
    assert!(
        wait_until(T, || problem_true(rig)
            && rig.api.device_taint_rules().contains_key(RULE1)),
        "node: {:#}\nrules: {:#?}\nlog: {:#?}",
        rig.api.node_json(),
        rig.api.device_taint_rules(),
        agent.stderr.get()
    );
    let rules = rig.api.device_taint_rules();
    assert_eq!(rules.len(), 1, "{rules:#?}");
    let rule = &rules[RULE1];
    assert_eq!(rule["spec"]["deviceSelector"]["device"], "gpu-1");
    assert_eq!(rule["spec"]["deviceSelector"]["pool"], NODE);
    assert_eq!(rule["spec"]["taint"]["key"], FAULT_TAINT);
    let value = rule["spec"]["taint"]["value"].as_str().unwrap().to_owned();
    assert!(
        value == "reset_gpu" || value == "inspect_hardware",
        "{value}"
    );
    assert_eq!(
        rule["metadata"]["labels"]["gpuwatch.io/gpu-uuid"],
        GPU1_UUID
    );
    // No Node fault taint; GPUProblem names the fault and the device.
    assert_eq!(rig.taint(FAULT_TAINT), None);
    let msg = rig.cond(PROBLEM).unwrap().message.unwrap_or_default();
    assert!(msg.contains("code 48"), "{msg}");
    assert!(
        msg.contains(&format!(
            "isolated by DeviceTaintRule, not the Node taint: gpu-1 ({GPU1_UUID})"
        )),
        "{msg}"
    );
    assert!(wait_until(
        T,
        || agent.health()["isolated_devices"][0]["rule"] == RULE1
    ));
    rules
}

/// kill -9 once the fault is on disk and restart on the same state: the
/// restarted agent lists the rules and reports the same rule, writes none,
/// and the Node gets no fault taint. The restarted agent.
fn restart_writes_no_rule(
    rig: &KubeWorld,
    cfg: &std::path::Path,
    agent: KubeAgent,
    rules: &BTreeMap<String, Value>,
) -> KubeAgent {
    let state = rig.state_dir().join("health.json");
    assert!(wait_until(T, || std::fs::read_to_string(&state)
        .is_ok_and(|s| s.contains("0000:43:00"))));
    let writes = rule_writes(rig);
    agent.kill9();
    let since = rig.requests().len();
    let agent = rig.start(cfg, Nvml::Sim(BOARD), &[]);
    assert!(
        wait_until(T, || rig.requests()[since..]
            .iter()
            .any(|r| r.resource == "devicetaintrules" && r.verb == "list")),
        "the restarted agent never listed the rules"
    );
    assert!(wait_until(
        T,
        || agent.health()["isolated_devices"][0]["rule"] == RULE1
    ));
    // The round that published the rule in the restarted agent's health
    // made its writes first (the writer publishes the isolated devices at
    // the end of its device round): every write up to it is counted.
    assert_eq!(rule_writes(rig), writes, "a rule written after the restart");
    assert_eq!(&rig.api.device_taint_rules(), rules);
    assert_eq!(rig.taint(FAULT_TAINT), None);
    agent
}

#[test]
fn an_xid48_on_a_dra_gpu_isolates_the_device_and_an_xid79_the_node() {
    let mut rig = dra_world();
    let cfg = rig.config("", "");
    let agent = rig.start(&cfg, Nvml::Sim(BOARD), &[]);
    assert!(wait_until(T, || rig.cond_status(PROBLEM).0 == "False"));
    let rules = assert_xid48_isolates_gpu_1(&mut rig, &agent);
    let agent = restart_writes_no_rule(&rig, &cfg, agent, &rules);

    // XID 79 on the same GPU: the whole machine needs a reboot.
    rig.write_kmsg(XID79);
    assert!(
        wait_until(T, || rig.taint(FAULT_TAINT).as_deref()
            == Some("reboot_node")),
        "node: {:#}",
        rig.api.node_json()
    );
    assert!(rig.api.device_taint_rules().contains_key(RULE1));
    assert_eq!(agent.stop(), Some(0));

    // A new boot in which the GPU validates: the faults clear, the rule is
    // deleted and the Node taint goes.
    rig.set_boot_id("boot-b");
    let agent = rig.start(&cfg, Nvml::Sim(BOARD), &[]);
    assert!(
        wait_until(T, || rig.cond_status(PROBLEM).0 == "False"
            && rig.taint(FAULT_TAINT).is_none()
            && rig.api.device_taint_rules().is_empty()),
        "node: {:#}\nrules: {:#?}",
        rig.api.node_json(),
        rig.api.device_taint_rules()
    );
    assert!(wait_until(T, || agent
        .health()
        .get("isolated_devices")
        .is_none()));
    assert_eq!(agent.stop(), Some(0));
    rig.api.assert_requests_declared();
}

#[test]
fn refused_rules_taint_the_node_with_the_reason_and_one_warning() {
    let mut rig = dra_world();
    rig.api.forbid("create", "devicetaintrules");
    let cfg = rig.config("", "");
    let agent = rig.start(&cfg, Nvml::Sim(BOARD), &[]);
    assert!(wait_until(T, || rig.cond_status(PROBLEM).0 == "False"));
    rig.write_kmsg(XID48);
    assert!(
        wait_until(T, || problem_true(&rig) && rig.taint(FAULT_TAINT).is_some()),
        "node: {:#}",
        rig.api.node_json()
    );
    let msg = rig.cond(PROBLEM).unwrap().message.unwrap_or_default();
    assert!(
        msg.contains("device isolation unavailable: forbidden to create devicetaintrules"),
        "{msg}"
    );
    assert!(rig.api.device_taint_rules().is_empty());
    let log = agent.stderr.clone();
    let unavailable = || {
        log.get()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| {
                (v["level"] == "WARN" || v["level"] == "ERROR")
                    && v["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("Device isolation unavailable"))
            })
            .count()
    };
    assert!(wait_until(T, || unavailable() == 1));
    // Another occurrence: another pass (its condition message says the
    // fault was seen again), no second warning.
    rig.write_kmsg(XID48);
    assert!(
        wait_until(T, || rig
            .cond(PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen 2+ times"))),
        "node: {:#}",
        rig.api.node_json()
    );
    assert!(
        agent.health()["device_isolation_unavailable"]
            .as_str()
            .is_some_and(|m| m.contains("forbidden"))
    );
    // The pass logs its warning before it writes the condition; the last
    // line of a stopped agent says every line before it has been read.
    assert_eq!(agent.stop(), Some(0));
    assert!(wait_until(T, || !log
        .matching("gpuwatch stopped.")
        .is_empty()));
    assert_eq!(unavailable(), 1, "{:#?}", log.get());
}
