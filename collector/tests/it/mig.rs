//! MIG end to end through the built `gpuwatch` and the nvml-sim cdylib on
//! `nvml-sim/scenarios/h100-mig-7x1g.toml` (an H100 in MIG mode with seven
//! 1g.10gb instances, GPU instances 7 to 13, beside an H100 without MIG):
//! `gpuwatch validate` passes and lists the instances, `/v1/health` lists
//! them, a pending MIG mode change fails validation, an unreadable MIG
//! device is that instance's monitoring problem, and XID 94 / 95 written to
//! the real `/dev/kmsg` are scoped to one instance / the whole GPU (with the
//! API-server double watching for a taint).

use crate::common::{self, DevKmsg, TestAgent, http_get, pci_domain, wait_until};
use gpuwatch_proto::ValidationReport;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// The MIG device UUIDs of the shipped scenario's GPU 0, by GPU instance.
const MIG_UUIDS: [(u64, &str); 7] = [
    (7, "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c07"),
    (8, "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c08"),
    (9, "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c09"),
    (10, "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c0a"),
    (11, "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c0b"),
    (12, "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c0c"),
    (13, "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c0d"),
];

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/scenarios/h100-mig-7x1g.toml")
}

/// The shipped scenario with `edit` applied to its text, written to `dir`.
fn variant(dir: &Path, edit: impl FnOnce(String) -> String) -> PathBuf {
    let text = edit(std::fs::read_to_string(shipped()).unwrap());
    let path = dir.join("mig.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `gpuwatch validate --nvml-sim SIM --expected-gpus 2 --json`: the exit
/// code and the report.
fn validate(dir: &Path, sim: &Path) -> (Option<i32>, ValidationReport) {
    let out = common::run_validate(dir, sim, "", &["--expected-gpus", "2", "--json"]);
    (out.status.code(), common::validation_report(&out))
}

fn mig_checks(r: &ValidationReport) -> Vec<(Option<u32>, bool, String)> {
    r.checks
        .iter()
        .filter(|c| c.name == "mig")
        .map(|c| (c.gpu_index, c.passed, c.message.clone()))
        .collect()
}

#[test]
fn validate_passes_on_an_h100_with_seven_mig_instances_and_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let (code, r) = validate(dir.path(), &shipped());
    assert_eq!(code, Some(0), "{r:#?}");
    assert!(r.passed && r.complete, "{r:#?}");
    let count = r.checks.iter().find(|c| c.name == "gpu_count").unwrap();
    assert!(count.passed, "{count:?}");
    let mig = mig_checks(&r);
    assert_eq!(mig.len(), 1, "only GPU 0 is in MIG mode: {mig:?}");
    let (gpu, passed, msg) = &mig[0];
    assert_eq!((*gpu, *passed), (Some(0), true), "{msg}");
    let listed: String = MIG_UUIDS
        .iter()
        .map(|(gi, uuid)| format!("GI {gi} CI 0 1g.10gb {uuid}"))
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        msg,
        &format!("MIG mode enabled; 7 MIG devices: {listed}"),
        "{r:#?}"
    );
}

/// `nvidia-smi -i 1 -mig 1` on a busy GPU leaves MIG pending until the GPU
/// is reset: the node is not what the device plugin will advertise, so
/// validation fails, naming the change.
#[test]
fn a_pending_mig_mode_change_fails_validation() {
    let dir = tempfile::tempdir().unwrap();
    let sim = variant(dir.path(), |t| {
        format!("{t}[gpu.mig]\nenabled = false\npending = true\n")
    });
    let (code, r) = validate(dir.path(), &sim);
    assert_eq!(code, Some(1), "{r:#?}");
    assert!(!r.passed && r.complete, "{r:#?}");
    let mig = mig_checks(&r);
    assert_eq!(mig.len(), 2, "{mig:?}");
    assert!(mig[0].1, "GPU 0 has no change pending: {mig:?}");
    assert_eq!(
        (mig[1].0, mig[1].1, mig[1].2.as_str()),
        (
            Some(1),
            false,
            "MIG mode change pending: disabled now, enabled after the next GPU reset or reboot"
        )
    );
    let failed: Vec<&str> = r
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(failed, ["mig"], "{r:#?}");
}

fn health(addr: &str) -> Option<Value> {
    http_get(addr, "/v1/health").and_then(|(_, b)| serde_json::from_str(&b).ok())
}

fn gpu(h: &Value, index: u64) -> &Value {
    h["gpus"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["index"] == index))
        .unwrap_or_else(|| panic!("no GPU {index}: {h:#}"))
}

/// `(gpu_instance, profile, uuid, verdict)` of a GPU's `mig_instances`.
fn instances(g: &Value) -> Vec<(u64, String, String, String)> {
    g["mig_instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    (
                        m["gpu_instance"].as_u64().unwrap_or_default(),
                        m["profile"].as_str().unwrap_or_default().to_owned(),
                        m["uuid"].as_str().unwrap_or_default().to_owned(),
                        m["verdict"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn all_seven(verdict: &str, but: Option<(u64, &str)>) -> Vec<(u64, String, String, String)> {
    MIG_UUIDS
        .iter()
        .map(|(gi, uuid)| {
            let v = match but {
                Some((b, v)) if b == *gi => v,
                _ => verdict,
            };
            (*gi, "1g.10gb".to_owned(), (*uuid).to_owned(), v.to_owned())
        })
        .collect()
}

/// `/v1/health` lists GPU 0's seven instances (GPU instance, profile, MIG
/// UUID, verdict) and none for GPU 1; GPU 0's sample carries the MIG mode.
#[test]
fn v1_health_lists_the_mig_instances() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("kmsg.log");
    std::fs::write(&log, "").unwrap();
    let agent = TestAgent::start_nvml_sim(
        &dir.path().join("state"),
        &shipped(),
        &["--kmsg-path", log.to_str().unwrap()],
    );
    let addr = agent.api_addr().expect("API address");
    assert!(
        wait_until(T, || health(&addr).is_some_and(|h| h["gpus"]
            .as_array()
            .is_some_and(
                |g| g.len() == 2 && g.iter().all(|g| !g["sample"].is_null())
            ))),
        "{:#?} {}",
        health(&addr),
        agent.stderr.tail(20)
    );
    let h = health(&addr).unwrap();
    let g0 = gpu(&h, 0);
    assert_eq!(instances(g0), all_seven("healthy", None), "{g0:#}");
    assert_eq!(g0["sample"]["mig_enabled"], true);
    assert_eq!(g0["sample"]["mig_pending"], true);
    assert_eq!(g0["sample"]["mig_devices"][0]["memory_mib"], 10_194);
    assert_eq!(g0["sample"]["mig_devices"][0]["gpu_slices"], 1);
    let g1 = gpu(&h, 1);
    assert!(instances(g1).is_empty(), "{g1:#}");
    assert_eq!(g1["sample"]["mig_enabled"], false);
    let (code, _, stderr) = agent.stop();
    assert_eq!(code, Some(0), "{}", stderr.tail(20));
}

/// Every NVML call on GPU instance 10's MIG handle fails: that instance is
/// `unknown` with the failed call, the other six and both GPUs stay healthy,
/// and the node is healthy (a monitoring problem of one instance is no
/// hardware verdict).
#[test]
fn a_mig_device_nvml_cannot_read_is_that_instances_problem_only() {
    let dir = tempfile::tempdir().unwrap();
    let sim = variant(dir.path(), |t| {
        t.replace(
            "gpu_instance = 10\nprofile = \"1g.10gb\"\n",
            "gpu_instance = 10\nprofile = \"1g.10gb\"\nfailing = true\n",
        )
    });
    let log = dir.path().join("kmsg.log");
    std::fs::write(&log, "").unwrap();
    let agent = TestAgent::start_nvml_sim(
        &dir.path().join("state"),
        &sim,
        &["--kmsg-path", log.to_str().unwrap()],
    );
    let addr = agent.api_addr().expect("API address");
    let seven = |h: &Value| {
        h["gpus"]
            .as_array()
            .is_some_and(|g| g.len() == 2 && !instances(gpu(h, 0)).is_empty())
    };
    assert!(
        wait_until(T, || health(&addr).is_some_and(|h| seven(&h))),
        "{:#?} {}",
        health(&addr),
        agent.stderr.tail(20)
    );
    let h = health(&addr).unwrap();
    let g0 = gpu(&h, 0);
    assert_eq!(g0["verdict"], "healthy", "{g0:#}");
    assert_eq!(gpu(&h, 1)["verdict"], "healthy");
    assert_eq!(h["verdict"], "healthy", "{h:#}");
    let mig = g0["mig_instances"].as_array().unwrap();
    assert_eq!(
        mig.len(),
        7,
        "the unreadable device is still listed: {g0:#}"
    );
    let verdicts: Vec<&str> = mig.iter().map(|m| m["verdict"].as_str().unwrap()).collect();
    assert_eq!(
        verdicts,
        [
            "healthy", "healthy", "healthy", "unknown", "healthy", "healthy", "healthy"
        ]
    );
    assert!(
        mig[3]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("NVML cannot read this MIG device: nvmlDeviceGetUUID")),
        "{:#}",
        mig[3]
    );
    let (code, _, stderr) = agent.stop();
    assert_eq!(code, Some(0), "{}", stderr.tail(20));
}

/// Makes an agent on `state` start reading `/dev/kmsg` after a record this
/// test writes now: the faults other tests left in the ring (an XID 79
/// taints the node whatever GPU it names) are before it.
fn start_after_a_fresh_record(k: &DevKmsg, marker: &str, state: &Path) {
    k.write(&format!("gpuwatch test {marker}-start"));
    let start = common::seq_of(&format!("{marker}-start")).expect("the start record in the ring");
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    gpuwatch_core::engine::preset_kmsg_position(
        state,
        gpuwatch_core::msg::KmsgPosition {
            boot_id: boot_id.trim().to_owned(),
            last_seq: start,
        },
    )
    .unwrap();
}

/// The keys of the double's Node's taints.
fn taint_keys(api: &gpuwatch_test_support::kube::ApiDouble) -> Vec<String> {
    api.node_json()["spec"]["taints"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
}

/// The status of the double's Node's `GPUProblem` condition.
fn gpu_problem(api: &gpuwatch_test_support::kube::ApiDouble) -> Option<String> {
    api.node_json()["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "GPUProblem").cloned())
        .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
}

/// XID 94 ("Contained") printed for GPU instance 9 is that instance's: the
/// event names GPU instance 9 and its MIG UUID on GPU 0, GPU 0 and the node
/// stay healthy, the other six instances too, and the active fault is the
/// instance's.
fn assert_xid94_marks_instance_9_only(agent: &TestAgent, marker: &str, dom: u16, k: &DevKmsg) {
    k.write(&format!(
        "NVRM: Xid (PCI:{dom:04x}:18:00 GPU-I:09): 94, pid=4242, name={marker}-94, Contained: CE User Channel (0x9). RST: No, D-RST: No"
    ));
    assert!(
        agent.wait_events(&format!("{marker}-94"), 1, T),
        "{}",
        agent.stderr.tail(20)
    );
    let ev = &agent.events(&format!("{marker}-94"))[0];
    assert_eq!(ev["code"], 94);
    assert_eq!(ev["attributes"]["gpu_instance"], "9", "{ev:#}");
    assert_eq!(ev["attributes"]["mig_uuid"], MIG_UUIDS[2].1, "{ev:#}");
    assert_eq!(ev["gpu_index"], 0, "{ev:#}");
    let addr = agent.api_addr().expect("API address");
    let h = health(&addr).unwrap();
    let g0 = gpu(&h, 0);
    assert_eq!(g0["verdict"], "healthy", "{g0:#}");
    assert_eq!(h["verdict"], "healthy", "{h:#}");
    assert_eq!(
        instances(g0),
        all_seven("healthy", Some((9, "degraded"))),
        "{g0:#}"
    );
    let f = &g0["active_faults"][0];
    assert_eq!(
        (&f["gpu_instance"], &f["mig_uuid"]),
        (&9.into(), &MIG_UUIDS[2].1.into())
    );
}

/// XID 95 (uncontained) on GPU 0 marks the GPU and all seven instances
/// unhealthy, GPU 1 stays healthy, and the Node gets the fault taint.
fn assert_xid95_marks_the_whole_gpu(
    agent: &TestAgent,
    marker: &str,
    dom: u16,
    k: &DevKmsg,
    api: &gpuwatch_test_support::kube::ApiDouble,
) {
    k.write(&format!(
        "NVRM: Xid (PCI:{dom:04x}:18:00): 95, pid=4243, name={marker}-95, Uncontained: FBHUB. RST: Yes, D-RST: No"
    ));
    assert!(
        agent.wait_events(&format!("{marker}-95"), 1, T),
        "{}",
        agent.stderr.tail(20)
    );
    let addr = agent.api_addr().expect("API address");
    assert!(
        wait_until(T, || health(&addr)
            .is_some_and(|h| gpu(&h, 0)["verdict"] == "unhealthy")),
        "{:#?}",
        health(&addr)
    );
    let h = health(&addr).unwrap();
    assert_eq!(instances(gpu(&h, 0)), all_seven("unhealthy", None));
    assert_eq!(gpu(&h, 1)["verdict"], "healthy");
    assert!(
        wait_until(T, || taint_keys(api)
            .iter()
            .any(|t| t == "gpuwatch.io/unhealthy")),
        "{:#} {}",
        api.node_json(),
        agent.stderr.tail(20)
    );
}

/// Through the live agent, the real `/dev/kmsg` and the API-server double:
/// XID 94 printed for GPU instance 9 ("Contained") is that instance's — the
/// event names GPU instance 9 and its MIG UUID, GPU 0's verdict and its six
/// other instances stay healthy, the Node gets no taint and no problem
/// condition. XID 95 (uncontained) on the same GPU then marks the GPU and
/// all seven instances, and the Node is tainted.
///
/// The scenario's GPUs sit in a PCI domain of this run's own, and the
/// agent starts from a position at a record this test writes first.
#[test]
fn a_contained_xid_on_a_mig_instance_through_dev_kmsg_marks_that_instance_only() {
    let k = DevKmsg::acquire();
    let marker = common::marker("mig");
    let dom = pci_domain(&marker);
    let dir = tempfile::tempdir().unwrap();
    let sim = variant(dir.path(), |t| {
        t.replace("00000000:18:00.0", &format!("0000{dom:04X}:18:00.0"))
            .replace("00000000:2A:00.0", &format!("0000{dom:04X}:2A:00.0"))
    });
    let state = dir.path().join("state");
    start_after_a_fresh_record(&k, &marker, &state);
    let (rt, api) = crate::kube_support::bare_api_double("e2e-node");
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[nvml]\npoll_interval_ms = 100\n[kube]\nenabled = true\napi_server_url = \"{}\"\nbackoff_initial_ms = 50\nbackoff_max_ms = 400\nrequest_timeout_secs = 2\nnormal_event_spread_secs = 0\n",
            api.url
        ),
    )
    .unwrap();
    let agent = TestAgent::start_nvml_sim(
        &state,
        &sim,
        &[
            "--accept-user-facility",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let addr = agent.api_addr().expect("API address");
    assert!(
        wait_until(T, || gpu_problem(&api).as_deref() == Some("False")
            && health(&addr).is_some_and(|h| instances(gpu(&h, 0)).len() == 7)),
        "{:#} {}",
        api.node_json(),
        agent.stderr.tail(20)
    );
    assert_xid94_marks_instance_9_only(&agent, &marker, dom, &k);
    // The writer has had time to act on it: nothing changed on the Node.
    // It decides within one `min_write_interval_ms` (the default 1 s here),
    // writes nothing when the Node already agrees and publishes no sign of
    // a pass that wrote nothing: the absence is checked after that interval
    // and a margin.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(taint_keys(&api).is_empty(), "{:#}", api.node_json());
    assert_eq!(
        gpu_problem(&api).as_deref(),
        Some("False"),
        "{:#}",
        api.node_json()
    );
    assert_xid95_marks_the_whole_gpu(&agent, &marker, dom, &k, &api);
    let (code, _, stderr) = agent.stop();
    assert_eq!(code, Some(0), "{}", stderr.tail(20));
    api.stop();
    drop(rt);
    drop(k);
}
