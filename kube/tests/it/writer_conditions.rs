//! The writer's conditions on the Node, end to end against the API-server
//! double: a fault shows at once, a changing message keeps the
//! transition time, a removed condition is restored, a new boot clears, an
//! unknown monitor is never False, a refused status write does not hold up
//! the taint, an occurrence storm costs a handful of writes, and another
//! field manager's condition is retried, not overwritten.

use crate::writer_harness::*;
use gpuwatch_proto::test_util::set_input;
use gpuwatch_proto::{InputState, Verdict};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid79_sets_condition_and_taint_at_once() {
    let h = Harness::start(node(vec![], &[]), healthy(8, "boot-a")).await;
    h.until("healthy conditions", |n| {
        status_of(n, READY).as_deref() == Some("True")
            && status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    // Let the write interval after the first round pass, as in a quiet agent.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let before = h.api.requests().len();
    let t0 = Instant::now();
    h.set(with_fault(
        healthy(8, "boot-a"),
        3,
        79,
        Action::RebootNode,
        1,
    ));
    h.until("fault taint and GPUProblem", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
            && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    let took = t0.elapsed();
    eprintln!("fault -> condition + taint on the API: {took:?}");
    // The fault is written at once: the first write of the taint and of the
    // conditions after it is the one that lands (no failed try and backoff
    // in front of it). The wall-clock bound tells that apart from a write
    // left to the writer's idle beat or resync (10 s and more); a loaded
    // machine stays well inside it.
    let after = &h.api.requests()[before..];
    for resource in ["nodes", "nodes/status"] {
        let writes: Vec<u16> = after
            .iter()
            .filter(|r| r.is_write() && r.resource == resource)
            .map(|r| r.status)
            .collect();
        assert_eq!(writes.first(), Some(&200), "{resource} writes: {writes:?}");
    }
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let n = h.api.node();
    let p = condition(&n, PROBLEM).unwrap();
    assert_eq!(p.reason.as_deref(), Some("NodeRebootRequired"));
    let msg = p.message.unwrap();
    for part in [
        "GPU 3",
        "GPU-3",
        "0000:1e:00.0",
        "code 79",
        "seen once",
        "boot boot-a",
    ] {
        assert!(msg.contains(part), "{part} missing in {msg}");
    }
    // A reboot fault is not a hardware verdict: the readiness condition stays True.
    let r = condition(&n, READY).unwrap();
    assert_eq!(
        (r.status.as_str(), r.reason.as_deref()),
        ("True", Some("GPURecoveryPending"))
    );
    // The SSA request is what the API expects.
    let ssa = h
        .api
        .requests()
        .into_iter()
        .find(|r| r.resource == "nodes/status")
        .unwrap();
    assert_eq!(ssa.content_type, "application/apply-patch+yaml");
    assert!(ssa.query.contains("fieldManager=gpuwatch"), "{}", ssa.query);
    assert!(ssa.query.contains("force=true"), "{}", ssa.query);
    let managed = h.api.node_json()["metadata"]["managedFields"].clone();
    assert_eq!(managed[0]["manager"], "gpuwatch");

    // An inspect_hardware fault makes the readiness condition False.
    h.set(with_fault(
        healthy(8, "boot-a"),
        3,
        79,
        Action::InspectHardware,
        1,
    ));
    h.until("hardware not ready", |n| {
        status_of(n, READY).as_deref() == Some("False")
            && taint_value(n, FAULT_TAINT).as_deref() == Some("inspect_hardware")
    })
    .await;
    h.stop().await;
}

/// A long-ago time, as an earlier agent left it on the Node.
const LONG_AGO: &str = "2020-01-01T00:00:00Z";

/// The time field `field` of condition `t` as the double stores it.
fn condition_time(api: &ApiDouble, t: &str, field: &str) -> serde_json::Value {
    let n = api.node_json();
    let c = n["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == t).cloned())
        .unwrap_or_default();
    c[field].clone()
}

/// A message that changes while the status stays (a fault's count crossing
/// its buckets, an earlier agent's wording) keeps `lastTransitionTime` as the
/// Node has it and moves `lastHeartbeatTime`. The Node starts with both
/// conditions at the writer's statuses, transitioned long ago.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_message_keeps_transition_time() {
    let mut n = node(vec![], &[]);
    let earlier = |t: &str, reason: &str| {
        serde_json::json!({"type": t, "status": "True", "reason": reason,
            "message": "an earlier agent's words",
            "lastTransitionTime": LONG_AGO, "lastHeartbeatTime": LONG_AGO})
    };
    n.status.as_mut().unwrap().conditions = Some(
        serde_json::from_value(serde_json::json!([
            earlier(PROBLEM, "GPUResetRequired"),
            earlier(READY, "GPURecoveryPending"),
        ]))
        .unwrap(),
    );
    let api = ApiDouble::start(n).await;
    let cfg = KubeConfig {
        min_write_interval_ms: 100,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("the writer's message", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen once"))
    })
    .await;
    assert_eq!(
        condition_time(&h.api, PROBLEM, "lastTransitionTime"),
        LONG_AGO
    );
    assert_ne!(
        condition_time(&h.api, PROBLEM, "lastHeartbeatTime"),
        LONG_AGO
    );
    // Each count crosses a bucket, so each one changes the message.
    for count in [2, 10, 100, 1000, 10_000] {
        h.set(with_fault(
            healthy(2, "boot-a"),
            0,
            48,
            Action::ResetGpu,
            count,
        ));
    }
    h.until("latest message", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen 10000+ times"))
    })
    .await;
    assert_eq!(status_of(&h.api.node(), PROBLEM).as_deref(), Some("True"));
    for t in [PROBLEM, READY] {
        assert_eq!(
            condition_time(&h.api, t, "lastTransitionTime"),
            LONG_AGO,
            "{t}"
        );
    }
    h.stop().await;
}

/// A health that changes every 100 ms for two seconds (a fault's count
/// crossing buckets back and forth) is written to `nodes/status` at most
/// once per `min_write_interval_ms` (1 s by default): a storm of faults must
/// not become a storm of status writes on the API server. The latest words
/// still land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_keep_the_minimum_gap_while_the_health_churns() {
    let h = Harness::start(
        node(vec![], &[]),
        with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("the first message", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen once"))
    })
    .await;
    let churn = std::time::Instant::now();
    for i in 0..20 {
        let count = [2, 10, 100, 1000][i % 4];
        h.set(with_fault(
            healthy(2, "boot-a"),
            0,
            48,
            Action::ResetGpu,
            count,
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.set(with_fault(
        healthy(2, "boot-a"),
        0,
        48,
        Action::ResetGpu,
        10_000,
    ));
    h.until("latest message", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen 10000+ times"))
    })
    .await;
    let reqs = h.api.requests();
    let writes = reqs
        .iter()
        .filter(|r| r.is_write() && r.resource == "nodes/status" && r.status < 300)
        .count();
    // The first words, one write per second of churn at most, the last
    // words: never one per change.
    let most = 2 + usize::try_from(churn.elapsed().as_secs()).unwrap();
    assert!(
        (2..=most).contains(&writes),
        "{writes} status writes, at most {most}"
    );
    assert_paced(&reqs, "nodes/status");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_condition_and_taint_are_restored() {
    let h = Harness::start(
        node(vec![taint("dedicated", Some("gpu"))], &[]),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("converged", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).is_some()
    })
    .await;
    let ltt = condition(&h.api.node(), PROBLEM)
        .unwrap()
        .last_transition_time;
    h.api.remove_condition(PROBLEM);
    h.api.edit_node(|n| {
        let t = n["spec"]["taints"].as_array_mut().unwrap();
        t.retain(|t| t["key"] != FAULT_TAINT);
    });
    h.until("restored", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
            && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    assert_eq!(taint_keys(&h.api.node())[0], "dedicated");
    // Someone deleted the condition, so it is a new transition.
    let restored = condition(&h.api.node(), PROBLEM).unwrap();
    assert!(restored.last_transition_time >= ltt);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_boot_clears_reboot_fault() {
    let h = Harness::start(
        node(vec![], &[]),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("fault", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.set(healthy(2, "boot-b"));
    h.until("cleared", |n| {
        taint_value(n, FAULT_TAINT).is_none()
            && status_of(n, PROBLEM).as_deref() == Some("False")
            && status_of(n, READY).as_deref() == Some("True")
    })
    .await;
    assert!(wait_for(SECS, || !h.metrics.status().fault_taint).await);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_unavailable_is_unknown_never_false() {
    let mut h0 = healthy(0, "boot-a");
    h0.set_verdict(Verdict::Unknown);
    h0.reason = "MonitorUnavailable".into();
    let m = h0.monitor.as_mut().expect("a monitor status");
    set_input(m, "nvml", InputState::Down, "NVML library not found");
    m.message = "nvml: NVML library not found".into();
    let h = Harness::start(node(vec![], &[]), h0).await;
    h.until("unknown", |n| {
        status_of(n, READY).as_deref() == Some("Unknown")
            && status_of(n, PROBLEM).as_deref() == Some("Unknown")
    })
    .await;
    let r = condition(&h.api.node(), READY).unwrap();
    assert_eq!(r.reason.as_deref(), Some("MonitorUnavailable"));
    assert!(r.message.unwrap().contains("NVML library not found"));
    for req in h
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "nodes/status")
    {
        for c in req.body["status"]["conditions"].as_array().unwrap() {
            assert_ne!(c["status"], "False", "{c}");
        }
    }
    assert!(taint_value(&h.api.node(), FAULT_TAINT).is_none());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_status_write_does_not_block_the_taint() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.forbid("patch", "nodes/status");
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("taint despite 403", |n| {
        taint_value(n, FAULT_TAINT).is_some()
    })
    .await;
    assert!(condition(&h.api.node(), PROBLEM).is_none());
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::Condition, WriteResult::Error)
            >= 2)
        .await
    );
    h.stop().await;
}

/// Regression: the condition message carried the live count,
/// so a storm on one fault meant one status write per pacing interval for its
/// whole length. With the count bucketed, 10 000 occurrences change the
/// message 5 times, even with write pacing (nearly) off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_increments_makes_a_handful_of_status_writes() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        min_write_interval_ms: 1,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        with_fault(healthy(8, "boot-a"), 2, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("first state", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen once"))
    })
    .await;
    let status_writes = |h: &Harness| {
        h.api
            .requests()
            .iter()
            .filter(|r| r.resource == "nodes/status" && r.is_write())
            .count()
    };
    let before = status_writes(&h);
    for count in 2..=10_000u64 {
        h.set(with_fault(
            healthy(8, "boot-a"),
            2,
            79,
            Action::RebootNode,
            count,
        ));
        if count % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    h.until("last bucket", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen 10000+ times"))
    })
    .await;
    // Passes are sequential: once the last bucket is on the Node no write
    // of an earlier state can follow.
    let writes = status_writes(&h) - before;
    eprintln!("storm: 10000 occurrences of one fault -> {writes} status writes");
    assert!(
        (1..=5).contains(&writes),
        "{writes} status writes for 10 000 occurrences"
    );
    // The taint never moved.
    let taint_writes = h
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "nodes" && r.is_write())
        .count();
    assert_eq!(taint_writes, 1);
    h.stop().await;
}

/// Server-side apply without `force` against a condition type another field
/// manager owns: 409 naming that manager. The writer reports it (error metric),
/// still writes the taint, keeps retrying at its backoff, and converges once
/// the other manager lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssa_conflict_with_another_manager_is_reported_and_retried() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.own_condition(PROBLEM, "node-problem-detector", "False");
    let mut cfg = api.kube_config();
    cfg.force_conflicts = false;
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("taint despite the apply conflict", |n| {
        taint_value(n, FAULT_TAINT).is_some()
    })
    .await;
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::Condition, WriteResult::Error)
            >= 3)
        .await,
        "the writer keeps trying"
    );
    let reqs = h.api.requests();
    let conflicts: Vec<&Recorded> = reqs
        .iter()
        .filter(|r| r.resource == "nodes/status" && r.status == 409)
        .collect();
    assert!(conflicts.len() >= 3);
    // Backoff, not a hot loop: 50 ms doubling to 400 ms (jittered up to 2x).
    let span = conflicts.last().unwrap().at - conflicts[0].at;
    assert!(
        span >= Duration::from_millis(50 * (conflicts.len() as u64 - 1)),
        "{} conflicts within {span:?}",
        conflicts.len()
    );
    assert_eq!(status_of(&h.api.node(), PROBLEM).as_deref(), Some("False"));
    h.api.remove_condition(PROBLEM);
    h.until("condition converges", |n| {
        status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    h.stop().await;
}
