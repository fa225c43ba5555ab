//! Starting and cleaning up: settings that never resolve, a dry run that
//! needs no API server, and `node-cleanup` after an uninstall.

use crate::writer_harness::*;

#[test]
fn invalid_settings_never_resolve_and_every_problem_is_named() {
    let cfg = KubeConfig {
        min_write_interval_ms: 0,
        fault_taint: gpuwatch_kube::TaintConfig {
            key: "bad key".into(),
            effect: "NoSchedule".into(),
        },
        ..KubeConfig::default()
    };
    let err = cfg.resolve().unwrap_err().join("; ");
    for part in ["fault_taint.key", "min_write_interval_ms"] {
        assert!(err.contains(part), "{part} missing: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_needs_no_api_server() {
    let (tx, rx) = watch::channel(Arc::new(healthy(2, "boot-a")));
    let metrics = KubeMetrics::new();
    let cfg = KubeConfig {
        enabled: true,
        // Unreachable on purpose: dry run must not touch it.
        api_server_url: Some("http://127.0.0.1:9".into()),
        min_write_interval_ms: 10,
        ..KubeConfig::default()
    };
    let settings = cfg.resolve().unwrap();
    let client = KubeClient::dry_run();
    let listing = PodListing::start(
        &client,
        &settings,
        NODE,
        Arc::new(|_| {}),
        Arc::default(),
        &gpuwatch_core::Shutdown::new(),
        &tokio::runtime::Handle::current(),
    )
    .unwrap();
    assert!(listing.is_none(), "a dry run lists no pods");
    let w = NodeWriter::start(
        settings,
        ValidationSettings::default(),
        NODE.into(),
        metrics.clone(),
        rx,
        &client,
        WriterHooks::default(),
    )
    .await
    .unwrap();
    tx.send_replace(Arc::new(with_fault(
        healthy(2, "boot-a"),
        0,
        79,
        Action::RebootNode,
        1,
    )));
    assert!(
        wait_for(SECS, || metrics
            .kube_writes(KubeObject::Taint, WriteResult::Ok)
            == 1
            && metrics.kube_writes(KubeObject::Condition, WriteResult::Ok)
                >= 1)
        .await
    );
    w.event_sink().send(&xid_event(
        79,
        Action::RebootNode,
        0,
        1_700_000_000_000_000_000,
    ));
    w.event_sink().flush(SECS);
    assert_eq!(metrics.kube_writes(KubeObject::Event, WriteResult::Ok), 1);
    assert!(metrics.status().fault_taint);
    w.shutdown_within(Duration::from_secs(5)).await;
}

/// `node-cleanup` takes off only gpuwatch's conditions and taints (fault and
/// startup), says what it removed, survives lost races, and a dry run writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_cleanup_removes_only_gpuwatchs_conditions_and_taints() {
    let api = ApiDouble::start(node(
        vec![
            taint("dedicated", Some("gpu")),
            taint(FAULT_TAINT, Some("reboot_node")),
            taint(STARTUP_TAINT, None),
            taint("other.example.com/keep", None),
        ],
        &[],
    ))
    .await;
    api.own_condition(READY, "gpuwatch", "True");
    api.own_condition(PROBLEM, "gpuwatch", "True");
    api.own_condition("Ready", "kubelet", "True");
    let cfg = api.kube_config().resolve().unwrap();
    let want = gpuwatch_kube::CleanupReport {
        conditions: vec![READY.to_owned(), PROBLEM.to_owned()],
        taints: vec![
            format!("{FAULT_TAINT}=reboot_node:NoSchedule"),
            format!("{STARTUP_TAINT}:NoSchedule"),
        ],
        device_taint_rules: Vec::new(),
    };
    let dry = gpuwatch_kube::node_cleanup(&cfg, NODE, true).await.unwrap();
    assert_eq!(dry, want);
    assert!(
        api.requests().iter().all(|r| !r.is_write()),
        "dry run wrote"
    );
    api.concurrent_taint_edits(2);
    let done = gpuwatch_kube::node_cleanup(&cfg, NODE, false)
        .await
        .unwrap();
    assert_eq!(done, want);
    let n = api.node();
    assert_eq!(
        taint_keys(&n),
        [
            "dedicated",
            "other.example.com/keep",
            "other.example.com/edit-1",
            "other.example.com/edit-0"
        ]
    );
    let types: Vec<String> = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Ready"]);
    // Run again: nothing left of ours.
    let again = gpuwatch_kube::node_cleanup(&cfg, NODE, false)
        .await
        .unwrap();
    assert!(again.is_empty());
    api.assert_requests_declared();
}
