//! `gpuwatch validate` and the NVLink fabric: on an NVSwitch system a GPU the
//! fabric manager has not registered fails CUDA initialisation while every
//! NVML counter looks healthy, so the startup gate's validation checks the
//! registration per GPU (nvml-sim answers `nvmlDeviceGetGpuFabricInfoV` from
//! the scenario's `[gpu.fabric]`).

use crate::common::{run_validate, validation_report};
use gpuwatch_proto::ValidationReport;
use std::path::Path;
use std::time::{Duration, Instant};

/// Two GPUs; GPU 0's fabric table is `fabric0` (TOML lines), GPU 1 is
/// registered and healthy. `inject` is appended (timed changes).
fn scenario(dir: &Path, fabric0: &str, inject: &str) -> std::path::PathBuf {
    let healthy = "state = \"completed\"\nclique_id = 1\ncluster_uuid = \"6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11\"\nhealth_mask = 0x1AA\n";
    let text = format!(
        "description = \"fabric validation\"\n\
         [[gpu]]\nuuid = \"GPU-7a1f0c2e-5b3d-4e8f-9a01-1c2d3e4f5a61\"\npci = \"00000000:18:00.0\"\n\
         [gpu.fabric]\n{fabric0}\n\
         [[gpu]]\nuuid = \"GPU-7a1f0c2e-5b3d-4e8f-9a01-1c2d3e4f5a62\"\npci = \"00000000:2A:00.0\"\n\
         [gpu.fabric]\n{healthy}\n{inject}"
    );
    let path = dir.join("fabric.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `gpuwatch validate --nvml-sim S --expected-gpus 2 --json` with the
/// fabric wait set to `wait_secs`; the exit code, the report and how long
/// it took.
fn validate(dir: &Path, sim: &Path, wait_secs: u64) -> (Option<i32>, ValidationReport, Duration) {
    let config = format!("[engine]\nfabric_wait_secs = {wait_secs}\n");
    let started = Instant::now();
    let out = run_validate(dir, sim, &config, &["--expected-gpus", "2", "--json"]);
    let took = started.elapsed();
    (out.status.code(), validation_report(&out), took)
}

fn fabric_check(r: &ValidationReport, gpu: u32) -> (bool, String) {
    let c = r
        .checks
        .iter()
        .find(|c| c.name == "fabric" && c.gpu_index == Some(gpu))
        .unwrap_or_else(|| panic!("no fabric check for GPU {gpu}: {r:?}"));
    (c.passed, c.message.clone())
}

#[test]
fn an_unregistered_or_failed_fabric_fails_validation_and_a_registered_one_passes() {
    let dir = tempfile::tempdir().unwrap();
    // In progress and staying so: fails after the (short) wait.
    let sim = scenario(dir.path(), "state = \"in_progress\"", "");
    let (code, r, took) = validate(dir.path(), &sim, 2);
    assert_eq!(code, Some(1), "{r:?}");
    assert!(r.complete && !r.passed);
    assert_eq!(
        fabric_check(&r, 0),
        (
            false,
            "fabric registration in progress — is nvidia-fabricmanager running?".into()
        )
    );
    assert!(fabric_check(&r, 1).0, "GPU 1 is registered");
    assert!(
        took >= Duration::from_secs(1),
        "waited for the fabric: {took:?}"
    );

    // Completed with a failure status.
    let sim = scenario(
        dir.path(),
        "state = \"completed\"\nstatus = \"insufficient_resources\"",
        "",
    );
    let (code, r, _) = validate(dir.path(), &sim, 2);
    assert_eq!(code, Some(1));
    let (passed, msg) = fabric_check(&r, 0);
    assert!(!passed);
    assert!(
        msg.starts_with("fabric registration failed: insufficient resources"),
        "{msg}"
    );

    // Completed with success: passes.
    let sim = scenario(
        dir.path(),
        "state = \"completed\"\nclique_id = 1\nhealth_mask = 0x1AA",
        "",
    );
    let (code, r, _) = validate(dir.path(), &sim, 2);
    assert_eq!(code, Some(0), "{r:?}");
    assert_eq!(
        fabric_check(&r, 0),
        (true, "registered with the NVLink fabric (clique 1)".into())
    );

    // No fabric on the board: passes.
    let sim = scenario(dir.path(), "state = \"not_supported\"", "");
    let (code, r, _) = validate(dir.path(), &sim, 2);
    assert_eq!(code, Some(0), "{r:?}");
    assert_eq!(
        fabric_check(&r, 0),
        (true, "no NVLink fabric on this GPU".into())
    );
}

#[test]
fn validate_waits_for_a_fabric_manager_that_is_starting() {
    let dir = tempfile::tempdir().unwrap();
    // Registration completes 1.5 s after the first NVML init.
    let sim = scenario(
        dir.path(),
        "state = \"in_progress\"",
        "[[inject]]\nat_ms = 1500\ngpu = 0\n[inject.fabric]\nstate = \"completed\"\nclique_id = 1\nhealth_mask = 0x1AA\n",
    );
    let (code, r, took) = validate(dir.path(), &sim, 30);
    assert_eq!(code, Some(0), "{r:?}");
    assert!(fabric_check(&r, 0).0);
    assert!(
        took < Duration::from_secs(20),
        "stopped waiting once registered: {took:?}"
    );
}
