//! The flap bound end to end against the API-server double: within one
//! process, across restarts on the same state directory, and after a kill.

use crate::writer_harness::*;

/// The GPUProblem statuses the writer sent, in order (successful condition
/// writes, across every writer that used `api`).
fn problem_statuses_sent(api: &ApiDouble) -> Vec<String> {
    api.requests()
        .iter()
        .filter(|r| r.resource == "nodes/status" && (200..300).contains(&r.status))
        .filter_map(|r| {
            r.body["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == PROBLEM)
                .and_then(|c| c["status"].as_str().map(str::to_owned))
        })
        .collect()
}

fn true_to_false(statuses: &[String]) -> usize {
    statuses
        .windows(2)
        .filter(|w| w[0] == "True" && w[1] == "False")
        .count()
}

/// Whether the Node's GPUProblem shows a held clear.
fn held(n: &Node) -> bool {
    condition(n, PROBLEM).is_some_and(|c| {
        c.status == "True" && c.message.is_some_and(|m| m.starts_with("held until "))
    })
}

/// A fault that comes back on each new boot and clears once that boot
/// validates, within one agent process. The conditions move only as often as
/// the flap bound allows, then hold (the taint with them), and each move is
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_returning_after_every_reboot_moves_the_conditions_a_bounded_number_of_times() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.condition_flap_limit = 2;
    cfg.condition_flap_window_secs = 600;
    cfg.min_write_interval_ms = 100;
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-0"),
    )
    .await;
    h.until("healthy", |n| {
        status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    let mut seen = Vec::new();
    for boot in 1..=6 {
        let b = format!("boot-{boot}");
        h.set(with_fault(healthy(2, &b), 0, 79, Action::RebootNode, 1));
        h.until("fault shown", |n| {
            status_of(n, PROBLEM).as_deref() == Some("True")
        })
        .await;
        seen.push(true);
        h.set(healthy(2, &b));
        h.until("cleared or held", |n| {
            status_of(n, PROBLEM).as_deref() == Some("False") || held(n)
        })
        .await;
        let n = h.api.node();
        let clear = status_of(&n, PROBLEM).as_deref() == Some("False");
        seen.push(!clear);
        if !clear {
            let p = condition(&n, PROBLEM).unwrap();
            let message = p.message.unwrap_or_default();
            assert!(message.starts_with("held until "), "{message}");
            assert!(
                message.contains(": cleared 2 times within 10 min"),
                "{message}"
            );
            assert!(
                taint_value(&n, FAULT_TAINT).is_some(),
                "the taint is held too"
            );
        }
    }
    // Two clears allowed, then held for good: T F T F T T T T T T T T.
    assert_eq!(
        seen,
        [
            true, false, true, false, true, true, true, true, true, true, true, true
        ]
    );
    let to_false = h.metrics.condition_transitions(PROBLEM, "False");
    let to_true = h.metrics.condition_transitions(PROBLEM, "True");
    // The first status written is not a change.
    assert_eq!((to_true, to_false), (3, 2));
    h.stop().await;
}

/// A node a repair controller reboots forever because every boot brings a
/// fault, a different one each time (so the engine's recurrence escalation
/// does not apply): every boot is a new writer process on the same state
/// directory. The bound counts the clears across them: three clears, the
/// fourth held, a clean fifth boot still held (reason kept, the taint too,
/// `lastTransitionTime` where the problem began). (That a clean boot after
/// the window clears: `flap`'s unit tests, on a clock they set.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flap_bound_holds_across_agent_restarts_and_reboots() {
    let state = tempfile::tempdir().unwrap();
    let mut api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.condition_flap_window_secs = 20;
    cfg.min_write_interval_ms = 100;
    let faults = [(1, 79), (0, 79), (1, 119), (0, 119)];
    let mut shown = Vec::new();
    for (boot, (gpu, code)) in faults.into_iter().enumerate() {
        let b = format!("boot-{boot}");
        let fault = with_fault(healthy(2, &b), gpu, code, Action::RebootNode, 1);
        let h = Harness::with_state(api, cfg.clone(), fault, state.path()).await;
        h.until("fault shown", |n| {
            status_of(n, PROBLEM).as_deref() == Some("True")
                && taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
        })
        .await;
        h.set(healthy(2, &b));
        h.until("cleared or held", |n| {
            status_of(n, PROBLEM).as_deref() == Some("False") || held(n)
        })
        .await;
        shown.push(held(&h.api.node()));
        api = h.stop().await;
    }
    assert_eq!(
        shown,
        [false, false, false, true],
        "the fourth clear is held"
    );
    assert_eq!(true_to_false(&problem_statuses_sent(&api)), 3);
    let n = api.node();
    let p = condition(&n, PROBLEM).unwrap();
    assert_eq!(p.reason.as_deref(), Some("NodeRebootRequired"));
    let message = p.message.clone().unwrap();
    assert!(
        message.contains("cleared 3 times within 20 s") && message.contains("code 119"),
        "{message}"
    );
    assert_eq!(taint_value(&n, FAULT_TAINT).as_deref(), Some("reboot_node"));

    // A clean fifth boot: still held, nothing written, and `/v1/health`'s
    // source says until when.
    let h = Harness::with_state(api, cfg.clone(), healthy(2, "boot-4"), state.path()).await;
    assert!(wait_for(SECS, || !h.metrics.condition_holds().is_empty()).await);
    let hold = h.metrics.condition_holds()[0].clone();
    assert_eq!(hold.condition, PROBLEM);
    assert_eq!(hold.message, message);
    h.reconciled(h.initial).await;
    let still = condition(&h.api.node(), PROBLEM).unwrap();
    assert_eq!(still.status, "True");
    assert_eq!(still.reason.as_deref(), Some("NodeRebootRequired"));
    assert_eq!(still.last_transition_time, p.last_transition_time);
    assert_eq!(
        h.metrics
            .kube_writes(KubeObject::Condition, WriteResult::Ok),
        0
    );
    assert_eq!(
        taint_value(&h.api.node(), FAULT_TAINT).as_deref(),
        Some("reboot_node")
    );
    h.stop().await;
}

/// A writer killed while it holds a clear (its runtime dropped: no graceful
/// shutdown) keeps holding after a restart: the history reached the disk
/// before the Node showed the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_while_holding_keeps_holding_after_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.condition_flap_limit = 1;
    cfg.min_write_interval_ms = 100;
    let fault = |gpu| with_fault(healthy(2, "boot-a"), gpu, 79, Action::RebootNode, 1);
    let (tx, rx) = watch::channel(Arc::new(fault(0)));
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let settings = cfg.resolve().unwrap();
    let state_dir = state.path().to_path_buf();
    let writer = doomed
        .spawn(async move {
            // The client's tasks run on the doomed runtime too.
            let client = KubeClient::connect(&settings).await.expect("a client");
            NodeWriter::start(
                settings,
                ValidationSettings::default(),
                NODE.into(),
                KubeMetrics::new(),
                rx,
                &client,
                WriterHooks {
                    state_dir: Some(state_dir),
                    ..WriterHooks::default()
                },
            )
            .await
        })
        .await
        .unwrap()
        .expect("writer starts");
    let problem = |s: &'static str| move |n: &Node| status_of(n, PROBLEM).as_deref() == Some(s);
    assert!(wait_for(SECS, || problem("True")(&api.node())).await);
    tx.send_replace(Arc::new(healthy(2, "boot-a")));
    assert!(wait_for(SECS, || problem("False")(&api.node())).await);
    tx.send_replace(Arc::new(fault(1)));
    assert!(wait_for(SECS, || problem("True")(&api.node())).await);
    tx.send_replace(Arc::new(healthy(2, "boot-a")));
    assert!(
        wait_for(SECS, || held(&api.node())).await,
        "{:#}",
        api.node_json()
    );
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.path().join("kube-conditions.json")).unwrap())
            .unwrap();
    assert_eq!(file["conditions"][PROBLEM]["holding"], true, "{file}");
    doomed.shutdown_background();
    drop(writer);
    let before = condition(&api.node(), PROBLEM).unwrap();

    let h = Harness::with_state(api, cfg, healthy(2, "boot-a"), state.path()).await;
    assert!(wait_for(SECS, || !h.metrics.condition_holds().is_empty()).await);
    h.reconciled(h.initial).await;
    let after = condition(&h.api.node(), PROBLEM).unwrap();
    assert_eq!(after, before, "still held, as it was");
    assert_eq!(
        taint_value(&h.api.node(), FAULT_TAINT).as_deref(),
        Some("reboot_node")
    );
    h.stop().await;
}
