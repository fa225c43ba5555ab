//! The startup gate end to end against the API-server double: the startup
//! taint stays while validation is incomplete or fails and goes once it
//! passes, a fault or a stale pass keeps it, the device plugin and MIG
//! devices are counted, and the condition-only mode leaves the taint alone.

use crate::writer_harness::*;
use gpuwatch_core::validation::ExtraCommand;
use std::collections::BTreeMap;
use std::num::NonZeroU32;

/// Settings that run `argv` as the extra command, with the default timeout.
fn with_command(argv: &[&str]) -> ValidationSettings {
    ValidationSettings {
        extra_command: Some(ExtraCommand {
            argv: argv.iter().map(|&a| a.to_owned()).collect(),
            timeout: Duration::from_secs(300),
        }),
        ..ValidationSettings::default()
    }
}

async fn gate(labels: &[(&str, &str)], health: NodeHealth, vcfg: ValidationSettings) -> Harness {
    let api = ApiDouble::start(node(
        vec![taint("dedicated", Some("gpu")), taint(STARTUP_TAINT, None)],
        labels,
    ))
    .await;
    let cfg = api.kube_config();
    Harness::with(api, cfg, vcfg, health).await
}

/// Sets the Node's allocatable `nvidia.com/gpu` as the device plugin does.
fn advertise(api: &ApiDouble, n: u32) {
    api.edit_node(|node| {
        node["status"]["allocatable"]["nvidia.com/gpu"] = serde_json::json!(n.to_string());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_kept_on_partial_validation() {
    // No expected count anywhere (no config, no label, no capacity).
    let h = gate(&[], healthy(8, "boot-a"), ValidationSettings::default()).await;
    assert!(
        wait_for(SECS, || h
            .metrics
            .validation_runs(ValidationResult::Incomplete)
            >= 2)
        .await
    );
    let n = h.api.node();
    assert!(taint_value(&n, STARTUP_TAINT).is_some());
    let r = condition(&n, READY).unwrap();
    assert_eq!(
        (r.status.as_str(), r.reason.as_deref()),
        ("Unknown", Some("ValidationIncomplete"))
    );
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 0);
    assert!(h.metrics.status().startup_taint());
    // NVML down: also incomplete, never removed.
    let mut down = healthy(8, "boot-a");
    let m = down.monitor.as_mut().unwrap();
    gpuwatch_proto::test_util::set_input(m, "nvml", gpuwatch_proto::InputState::Down, "");
    h.set(down);
    let before = h.metrics.validation_runs(ValidationResult::Incomplete);
    assert!(
        wait_for(SECS, || h
            .metrics
            .validation_runs(ValidationResult::Incomplete)
            > before)
        .await
    );
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_kept_on_failed_validation_with_warning_event() {
    let h = gate(
        &[("nvidia.com/gpu.count", "8")],
        healthy(7, "boot-a"),
        ValidationSettings::default(),
    )
    .await;
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Fail)
            >= 1)
        .await
    );
    assert!(
        wait_for(SECS, || h
            .api
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("ValidationFailed")))
        .await
    );
    let ev = h
        .api
        .events()
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("ValidationFailed"))
        .unwrap();
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(ev.message.unwrap().contains("gpu_count"));
    h.until("ValidationFailed condition", |n| {
        condition(n, READY).and_then(|c| c.reason).as_deref() == Some("ValidationFailed")
    })
    .await;
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_kept_when_extra_command_fails() {
    let vcfg = with_command(&["sh", "-c", "echo diag failed >&2; exit 1"]);
    let h = gate(&[("nvidia.com/gpu.count", "2")], healthy(2, "boot-a"), vcfg).await;
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Fail)
            >= 1)
        .await
    );
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    assert!(
        wait_for(SECS, || h.api.events().iter().any(|e| e
            .message
            .as_deref()
            .is_some_and(|m| m.contains("diag failed"))))
        .await
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_removed_after_validation_passes() {
    let vcfg = with_command(&["true"]);
    let h = gate(&[("nvidia.com/gpu.count", "2")], healthy(2, "boot-a"), vcfg).await;
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    let n = h.api.node();
    assert_eq!(taint_keys(&n), vec!["dedicated"]);
    assert_eq!(status_of(&n, READY).as_deref(), Some("True"));
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 1);
    // The engine is told the report (it becomes `/v1/health.validation`).
    let reports = h.reports();
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert!(reports[0].passed && reports[0].complete);
    assert!(
        reports[0]
            .checks
            .iter()
            .any(|c| c.name == "command" && c.passed)
    );
    // The double applied the patch; the writer counts it once the response is in.
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::StartupTaint, WriteResult::Ok)
            == 1)
        .await
    );
    assert!(wait_for(SECS, || !h.metrics.status().startup_taint()).await);
    h.stop().await;
}

/// Regression: the report of a validation whose extra command
/// runs for a while was built from the health at spawn time; a fault that
/// appears while the command runs must keep the startup taint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_during_the_extra_command_keeps_the_startup_taint() {
    let vcfg = with_command(&["sleep", "1"]);
    let h = gate(&[("nvidia.com/gpu.count", "2")], healthy(2, "boot-a"), vcfg).await;
    // The command is running (the expected count is set as it is spawned,
    // from the health of that moment); the fault arrives meanwhile.
    assert!(wait_for(SECS, || h.metrics.status().gpus_expected == Some(2)).await);
    h.set(with_fault(
        healthy(2, "boot-a"),
        1,
        79,
        Action::RebootNode,
        1,
    ));
    // The stale passing result comes back after ~1 s and is judged against
    // the current health; the next validation (an interval later) fails on
    // the fault. Once it has, every pass after the stale result is done.
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Fail)
            >= 1)
        .await
    );
    assert!(
        taint_value(&h.api.node(), STARTUP_TAINT).is_some(),
        "startup taint removed although a fault appeared: {:#}",
        h.api.node_json()
    );
    assert_eq!(
        h.metrics
            .kube_writes(KubeObject::StartupTaint, WriteResult::Ok),
        0
    );
    // The engine was told the fault's effect on validation.
    let reports = h.reports();
    assert!(
        reports.iter().any(|r| !r.passed
            && r.checks
                .iter()
                .any(|c| c.name == "active_faults" && !c.passed)),
        "{reports:#?}"
    );
    // The fault taint is there, the startup taint stays.
    let n = h.api.node();
    assert_eq!(taint_value(&n, FAULT_TAINT).as_deref(), Some("reboot_node"));
    assert!(taint_value(&n, STARTUP_TAINT).is_some());
    h.stop().await;
}

/// Regression: a passing result cached while the taint
/// removal could not be written (API forbids the taint patch) must not remove
/// the taint later, after a fault came and went: the validation runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_pass_is_dropped_when_health_fails_in_between() {
    let api = ApiDouble::start(node(
        vec![taint(STARTUP_TAINT, None)],
        &[("nvidia.com/gpu.count", "2")],
    ))
    .await;
    api.forbid("patch", "nodes");
    let cfg = KubeConfig {
        validation_interval_secs: 3600,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Pass)
            == 1)
        .await
    );
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::StartupTaint, WriteResult::Error)
            >= 1)
        .await
    );
    // A fault comes and goes while the taint patch is refused.
    h.set(with_fault(
        healthy(2, "boot-a"),
        0,
        79,
        Action::RebootNode,
        1,
    ));
    assert!(
        wait_for(SECS, || h.reports().last().is_some_and(|r| !r.passed)).await,
        "{:#?}",
        h.reports()
    );
    let gone = h.set(healthy(2, "boot-a"));
    h.api.unforbid("patch", "nodes");
    // No new validation runs for an hour: the old pass must not remove the
    // taint, neither in the pass on the healthy health nor in a retry of a
    // refused patch (a pass that fails is not counted).
    h.reconciled(gone).await;
    assert!(
        taint_value(&h.api.node(), STARTUP_TAINT).is_some(),
        "{:#}",
        h.api.node_json()
    );
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 1);
    h.stop().await;
}

/// The gate is incomplete until the kernel-log ring was read
/// (an XID 79 logged before the agent started may still be unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_waits_for_the_kernel_log_ring() {
    let mut h0 = healthy(2, "boot-a");
    h0.monitor.as_mut().unwrap().kmsg_caught_up = false;
    let h = gate(
        &[("nvidia.com/gpu.count", "2")],
        h0,
        ValidationSettings::default(),
    )
    .await;
    assert!(
        wait_for(SECS, || h
            .metrics
            .validation_runs(ValidationResult::Incomplete)
            >= 2)
        .await
    );
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    let r = condition(&h.api.node(), READY).unwrap();
    assert_eq!(r.reason.as_deref(), Some("ValidationIncomplete"));
    assert!(r.message.unwrap_or_default().contains("kmsg"));
    // The ring was read to its end: the next validation passes.
    h.set(healthy(2, "boot-a"));
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    let reports = h.reports();
    assert!(reports.first().is_some_and(|r| !r.complete), "{reports:#?}");
    assert!(reports.last().is_some_and(|r| r.passed), "{reports:#?}");
    h.stop().await;
}

/// A startup taint that comes back after the gate opened is validated again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reappearing_startup_taint_is_validated_again() {
    let h = gate(
        &[("nvidia.com/gpu.count", "2")],
        healthy(2, "boot-a"),
        ValidationSettings::default(),
    )
    .await;
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    // The node is now bad, and someone puts the startup taint back.
    h.set(with_fault(
        healthy(2, "boot-a"),
        0,
        79,
        Action::RebootNode,
        1,
    ));
    h.until("fault taint", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.api.edit_node(|n| {
        n["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"key": STARTUP_TAINT, "effect": "NoSchedule"}));
    });
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Fail)
            >= 1)
        .await
    );
    // Not removed by the pass after the failed validation either.
    h.pass_after(h.passes_at_last_report()).await;
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 1);
    h.stop().await;
}

/// The startup taint stays while NVML sees 8 healthy GPUs but the device
/// plugin advertises none, and the report says so; it goes as soon as the
/// plugin advertises 8. Later, 8 healthy GPUs with 6 allocatable past the grace
/// period: a Warning Event and `GPUProblem=True/GPUsNotAdvertised`, no taint;
/// cleared when the plugin advertises 8 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_gate_waits_for_the_device_plugin_and_unadvertised_gpus_are_reported() {
    let mut n = node(
        vec![taint("dedicated", Some("gpu")), taint(STARTUP_TAINT, None)],
        &[("nvidia.com/gpu.count", "8")],
    );
    n.status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into()),
        );
    let api = ApiDouble::start(n).await;
    let mut cfg = api.kube_config();
    cfg.not_advertised_grace_secs = 1;
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(8, "boot-a"),
    )
    .await;
    let says = |r: &ValidationReport| {
        !r.passed
            && r.checks.iter().any(|c| {
                c.name == "device_plugin"
                    && !c.passed
                    && c.message
                        .starts_with("device plugin advertises 0 of 8 GPUs")
            })
    };
    assert!(
        wait_for(SECS, || h.reports().iter().any(says)).await,
        "{:#?}",
        h.reports()
    );
    h.until("the report on the readiness condition", |n| {
        condition(n, READY).is_some_and(|c| {
            c.status == "Unknown" && c.message.is_some_and(|m| m.contains("device_plugin"))
        })
    })
    .await;
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    // The device plugin comes up.
    let t0 = Instant::now();
    advertise(&h.api, 8);
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    eprintln!(
        "device plugin advertised -> startup taint removed in {:?}",
        t0.elapsed()
    );
    assert_eq!(taint_keys(&h.api.node()), ["dedicated"]);
    // Running: two GPUs drop out of allocatable while NVML sees 8 healthy.
    let t1 = Instant::now();
    advertise(&h.api, 6);
    h.until("GPUsNotAdvertised", |n| {
        condition(n, PROBLEM)
            .is_some_and(|c| c.status == "True" && c.reason.as_deref() == Some("GPUsNotAdvertised"))
    })
    .await;
    assert!(
        t1.elapsed() >= Duration::from_millis(950),
        "before the grace period: {:?}",
        t1.elapsed()
    );
    let msg = condition(&h.api.node(), PROBLEM).unwrap().message.unwrap();
    assert!(
        msg.contains("NVML sees 8 healthy GPUs but the device plugin advertises 6"),
        "{msg}"
    );
    // Exported beside the GPUs NVML sees (`gpuwatch_gpus{state="advertised"}`).
    assert_eq!(h.metrics.status().gpus_advertised, Some(6));
    assert!(
        taint_value(&h.api.node(), FAULT_TAINT).is_none(),
        "no taint for it"
    );
    assert!(
        wait_for(SECS, || h
            .api
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("GPUsNotAdvertised")
                && e.type_.as_deref() == Some("Warning")))
        .await
    );
    advertise(&h.api, 8);
    h.until("recovered", |n| {
        condition(n, PROBLEM).is_some_and(|c| c.status == "False")
    })
    .await;
    h.stop().await;
}

/// With `startup_gate_mode = "condition_only"` the taint belongs to
/// node-readiness-controller (a `readiness.k8s.io/` key, as Karpenter treats
/// such taints as readiness taints): gpuwatch validates, turns its readiness
/// condition True once the GPUs pass, and never writes the taint itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_only_mode_reports_readiness_and_leaves_the_taint_alone() {
    const NRC_TAINT: &str = "readiness.k8s.io/gpu-ready";
    let api = ApiDouble::start(node(
        vec![taint(NRC_TAINT, Some("pending"))],
        &[("nvidia.com/gpu.count", "2")],
    ))
    .await;
    let mut cfg = api.kube_config();
    cfg.startup_gate_mode = gpuwatch_kube::StartupGateMode::ConditionOnly;
    cfg.startup_taint.key = NRC_TAINT.into();
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    h.until("readiness True after validation", |n| {
        status_of(n, READY).as_deref() == Some("True")
    })
    .await;
    assert!(h.metrics.validation_runs(ValidationResult::Pass) >= 1);
    // Once the pass after the passing validation completed, the taint is
    // still there, and was never written.
    h.pass_after(h.passes_at_last_report()).await;
    let n = h.api.node();
    assert_eq!(taint_value(&n, NRC_TAINT).as_deref(), Some("pending"));
    assert!(
        !h.api
            .requests()
            .iter()
            .any(|r| r.verb == "patch" && r.resource == "nodes"),
        "no taint write"
    );
    // node-readiness-controller removes it: nothing changes for gpuwatch,
    // in the pass on the changed Node.
    let before = h.passes();
    h.api
        .edit_node(|n| n["spec"]["taints"] = serde_json::json!([]));
    h.pass_after(before).await;
    assert_eq!(status_of(&h.api.node(), READY).as_deref(), Some("True"));
    h.stop().await;
}

/// A node whose 2 GPUs are in MIG mode with 7 MIG devices each. Under the
/// single strategy GPU feature discovery labels `nvidia.com/gpu.count=14` and
/// the plugin advertises 14 `nvidia.com/gpu` (the GFD README's single-strategy
/// table): the gate counts MIG devices on both sides and lifts the taint once
/// all 14 are advertised, never at 13. Under the mixed strategy the devices
/// are `nvidia.com/mig-1g.18gb`: counted without naming them in
/// `allocatable_resources`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_gate_counts_mig_devices_by_the_device_plugin_strategy() {
    // Single strategy.
    let n = node(
        vec![taint(STARTUP_TAINT, None)],
        &[("nvidia.com/gpu.count", "14")],
    );
    let api = ApiDouble::start(n).await;
    advertise(&api, 13);
    let cfg = api.kube_config();
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        with_mig(healthy(2, "boot-a"), 7),
    )
    .await;
    let short = |r: &ValidationReport| {
        r.checks.iter().any(|c| {
            c.name == "device_plugin"
                && !c.passed
                && c.message
                    .starts_with("device plugin advertises 13 of 14 devices")
        })
    };
    assert!(
        wait_for(SECS, || h.reports().iter().any(short)).await,
        "{:#?}",
        h.reports()
    );
    let r = h.reports().into_iter().find(short).unwrap();
    let count = r.checks.iter().find(|c| c.name == "gpu_count").unwrap();
    assert!(count.passed, "the label counts MIG devices: {count:?}");
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    advertise(&h.api, 14);
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    h.stop().await;

    // Mixed strategy: no nvidia.com/gpu at all, the MIG profile instead.
    let mut n = node(vec![taint(STARTUP_TAINT, None)], &[]);
    n.status.as_mut().unwrap().allocatable = Some(BTreeMap::from([(
        "nvidia.com/mig-1g.18gb".to_owned(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("13".into()),
    )]));
    let api = ApiDouble::start(n).await;
    let mut cfg = api.kube_config();
    cfg.mig_strategy = gpuwatch_kube::MigStrategy::Mixed;
    let vcfg = ValidationSettings {
        expected_gpus: NonZeroU32::new(2),
        ..ValidationSettings::default()
    };
    let h = Harness::with(api, cfg, vcfg, with_mig(healthy(2, "boot-a"), 7)).await;
    let short = |r: &ValidationReport| {
        r.checks.iter().any(|c| {
            c.name == "device_plugin"
                && !c.passed
                && c.message
                    .starts_with("device plugin advertises 13 of 14 devices")
                && c.message.contains("nvidia.com/mig-*")
        })
    };
    assert!(
        wait_for(SECS, || h.reports().iter().any(short)).await,
        "{:#?}",
        h.reports()
    );
    h.api.edit_node(|node| {
        node["status"]["allocatable"]["nvidia.com/mig-1g.18gb"] = serde_json::json!("14");
    });
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    h.stop().await;
}

/// A DRA Node (the NVIDIA DRA driver publishes its GPUs in ResourceSlices)
/// with no `nvidia.com/gpu` extended resource at all: the gate counts the
/// GPUs the slices publish by UUID, holds the startup taint while a GPU
/// NVML sees is missing from them (naming its UUID), and removes it once
/// both are published and validate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_dra_node_the_gate_counts_the_gpus_its_slices_publish() {
    use crate::kube_common::DraServed;
    use crate::kube_common::build::gpu_slice;
    let api = ApiDouble::start(node(vec![taint(STARTUP_TAINT, None)], &[])).await;
    api.edit_node(|n| n["status"]["allocatable"] = serde_json::json!({}));
    api.serve_dra(DraServed::rules_in(&["v1"]));
    // The driver has published GPU-0 only so far.
    api.put_resource_slice(gpu_slice("s", NODE, 1, &[("gpu-0", "GPU-0", None)]));
    let cfg = api.kube_config();
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    let plugin_check = |r: &ValidationReport| {
        r.checks
            .iter()
            .find(|c| c.name == "device_plugin")
            .map(|c| (c.passed, c.message.clone()))
    };
    assert!(
        wait_for(SECS, || h
            .reports()
            .iter()
            .any(|r| plugin_check(r).is_some_and(
                |(passed, m)| !passed && m.ends_with("missing GPU-1")
            )))
        .await,
        "{:#?}",
        h.reports()
    );
    let r = h.reports().last().cloned().unwrap();
    assert!(!r.passed);
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    assert_eq!(
        plugin_check(&r).unwrap().1,
        "DRA driver gpu.nvidia.com publishes 1 of 2 GPUs in the Node's ResourceSlices; missing GPU-1"
    );
    // The driver publishes both (a new generation of its pool).
    h.api.put_resource_slice(gpu_slice(
        "s",
        NODE,
        2,
        &[("gpu-0", "GPU-0", None), ("gpu-1", "GPU-1", None)],
    ));
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    let r = h.reports().last().cloned().unwrap();
    assert!(r.passed, "{r:#?}");
    assert_eq!(
        plugin_check(&r).unwrap().1,
        "DRA driver gpu.nvidia.com publishes 2 of 2 GPUs in the Node's ResourceSlices"
    );
    let count = r.checks.iter().find(|c| c.name == "gpu_count").unwrap();
    assert_eq!(count.message, "expected 2 GPUs, NVML sees 2");
    // Running: no GPUsNotAdvertised on a DRA Node without the extended
    // resource; the advertised count is the published GPUs.
    assert_eq!(h.metrics.status().gpus_advertised, Some(2));
    assert_eq!(status_of(&h.api.node(), PROBLEM).as_deref(), Some("False"));
    h.stop().await;
}
