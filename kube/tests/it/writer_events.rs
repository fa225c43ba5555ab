//! The writer's Kubernetes Events end to end against the API-server double:
//! deduplicated and typed, not sent again after a restart, Normal ones
//! spread and Warnings not, writes rate limited, a crash-looping pod's
//! repeats patched, and a shutdown that keeps to its deadline while the API
//! hangs.

use crate::writer_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_deduplicated_and_typed() {
    let h = Harness::start(node(vec![], &[]), healthy(2, "boot-a")).await;
    let sink = h.writer().event_sink();
    sink.send(&xid_event(
        13,
        Action::RestartApp,
        0,
        1_700_000_000_000_000_000,
    ));
    sink.send(&xid_event(
        13,
        Action::RestartApp,
        0,
        1_700_000_001_000_000_000,
    ));
    sink.send(&xid_event(
        79,
        Action::RebootNode,
        1,
        1_700_000_002_000_000_000,
    ));
    sink.send(&xid_event(0, Action::Ignore, 1, 1_700_000_002_000_000_000));
    sink.flush(SECS);
    let events = h.api.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let xid13 = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("XID13"))
        .unwrap();
    assert_eq!(xid13.type_.as_deref(), Some("Normal"));
    assert_eq!(xid13.count, Some(2));
    assert_eq!(xid13.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(xid13.involved_object.name.as_deref(), Some(NODE));
    assert_eq!(xid13.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        xid13.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("gpuwatch")
    );
    let xid79 = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("XID79"))
        .unwrap();
    assert_eq!(xid79.type_.as_deref(), Some("Warning"));
    assert!(xid79.message.as_deref().unwrap().contains("GPU 1 (GPU-1"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_fault_keeps_state_and_sends_no_duplicate_events() {
    let health = with_fault(healthy(2, "boot-a"), 1, 79, Action::RebootNode, 1);
    let h = Harness::start(node(vec![], &[]), health.clone()).await;
    let ev = xid_event(79, Action::RebootNode, 1, 1_700_000_000_000_000_000);
    h.writer().event_sink().send(&ev);
    h.until("fault state", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    assert!(wait_for(SECS, || h.api.events().len() == 1).await);
    let before = h.api.node();
    let api = h.stop().await;

    // Restart: same persisted health, and the same fault event delivered again.
    let cfg = api.kube_config();
    let h = Harness::with(api, cfg, ValidationSettings::default(), health).await;
    h.writer().event_sink().send(&ev);
    // The flush returns once the queue is drained and the write settled.
    h.writer().event_sink().flush(SECS);
    let events = h.api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].count, Some(1));
    assert_eq!(events[0].reason.as_deref(), Some("XID79"));
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let after = h.api.node();
    assert_eq!(
        condition(&after, PROBLEM).unwrap().last_transition_time,
        condition(&before, PROBLEM).unwrap().last_transition_time
    );
    assert_eq!(taint_keys(&after), taint_keys(&before));
    // The restarted writer wrote nothing: the live node already matched.
    let writes_after_restart = h
        .metrics
        .kube_writes(KubeObject::Condition, WriteResult::Ok)
        + h.metrics.kube_writes(KubeObject::Taint, WriteResult::Ok);
    assert_eq!(writes_after_restart, 0);
    // A new occurrence later is counted on the same Event.
    h.writer().event_sink().send(&xid_event(
        79,
        Action::RebootNode,
        1,
        1_700_000_060_000_000_000,
    ));
    assert!(wait_for(SECS, || h.api.events()[0].count == Some(2)).await);
    assert_eq!(h.api.events().len(), 1);
    h.stop().await;
}

/// A fleet-wide application fault (every node logs XID 13 at once) must not
/// reach the API server from every node in the same second: the first Normal
/// Event after a quiet period waits a random part of the spread, repeats
/// coalesce into it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normal_events_are_spread() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        normal_event_spread_secs: 2,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    let sink = h.writer().event_sink();
    let mut delays = Vec::new();
    for round in 0..4u64 {
        let t0 = std::time::Instant::now();
        for i in 0..3 {
            sink.send(&xid_event(
                13,
                Action::RestartApp,
                round as u32 % 2,
                1_700_000_000_000_000_000 + (round * 10 + i) * 1_000_000_000,
            ));
        }
        sink.flush(Duration::from_secs(10));
        delays.push(t0.elapsed());
        // A quiet period before the next round.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each round waits less than the 2 s spread, then writes: 5 s leaves a
    // loaded machine 3 s for the writes and still tells apart a wait longer
    // than the spread and a flush that gave up (10 s).
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(5)),
        "{delays:?}"
    );
    assert!(
        delays.iter().any(|d| *d > Duration::from_millis(100)),
        "never spread: {delays:?}"
    );
    let xid13 = h
        .api
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("XID13"))
        .map(|e| e.count.unwrap_or(1))
        .sum::<i32>();
    assert_eq!(xid13, 12, "every occurrence counted");
    h.stop().await;
}

/// A Warning Event is not spread: with a 60 s spread, a Warning after a
/// quiet period is written well inside 10 s. Were it spread, each would wait
/// a random part of the minute: three in a row all inside 10 s is a 1 in 216
/// chance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warning_events_go_at_once() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        normal_event_spread_secs: 60,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    let sink = h.writer().event_sink();
    for gpu in 0..3u32 {
        let t0 = std::time::Instant::now();
        sink.send(&xid_event(
            79,
            Action::RebootNode,
            gpu,
            1_700_000_100_000_000_000,
        ));
        sink.flush(Duration::from_secs(10));
        let took = t0.elapsed();
        let written: i32 = h
            .api
            .events()
            .iter()
            .filter(|e| e.reason.as_deref() == Some("XID79"))
            .map(|e| e.count.unwrap_or(1))
            .sum();
        assert_eq!(written, gpu as i32 + 1, "occurrences after {took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        // A quiet period before the next one.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_writes_are_rate_limited() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        event_burst: 3,
        events_per_minute: 60,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(8, "boot-a"),
    )
    .await;
    let sink = h.writer().event_sink();
    let t0 = Instant::now();
    for code in 100..110 {
        sink.send(&xid_event(
            code,
            Action::Investigate,
            0,
            1_700_000_000_000_000_000,
        ));
    }
    // Burst of 3, then one per second: the fourth about a second after.
    assert!(wait_for(SECS, || h.api.events().len() >= 3).await);
    assert!(wait_for(SECS, || h.api.events().len() >= 4).await);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(900), "4 Events in {took:?}");
    // At most the burst and one a second since the start (a starved wait
    // above may have let more seconds pass than the fourth needed).
    let n = h.api.events().len();
    let since = t0.elapsed();
    assert!(
        n as u64 <= 4 + since.as_secs(),
        "{n} Events after {since:?}"
    );
    h.stop().await;
}

/// A pod crash-looping on XID 13 (a crash every 1/10 s for 4 s against a
/// 10 s dedup window and a 1 s patch interval) costs a few Event writes,
/// counted at the API double: one Pod Event object whose count ends at every
/// crash, created once and patched at doubling intervals (1 and 2 s after
/// the last write), the last repeats in the flush; the Node's Event the
/// same. (The whole 10 minutes at the defaults, decision by decision: the
/// `events` unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_pod_costs_a_handful_of_event_writes_and_one_event() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        event_dedup_window_secs: 10,
        event_patch_interval_secs: 1,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    let crashes = 40u32;
    let start = tokio::time::Instant::now();
    for i in 0..crashes {
        tokio::time::sleep_until(start + Duration::from_millis(u64::from(i) * 100)).await;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let mut ev = xid_event(13, Action::RestartApp, 0, now);
        ev.pid = Some(1000 + i);
        ev.process = "python".into();
        let mut p = gpuwatch_proto::PodRef {
            uid: "u-1".into(),
            name: "trainer-0".into(),
            namespace: "ml".into(),
            container: "main".into(),
            ..Default::default()
        };
        p.set_role(gpuwatch_proto::PodRole::Caused);
        ev.pods = vec![p];
        h.writer().event_sink().send(&ev);
    }
    h.writer().event_sink().flush(SECS);
    let pod_events: Vec<_> = h
        .api
        .events()
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("Pod"))
        .collect();
    assert_eq!(pod_events.len(), 1, "{pod_events:?}");
    assert_eq!(pod_events[0].count, Some(crashes as i32));
    assert_eq!(pod_events[0].reason.as_deref(), Some("GPUApplicationFault"));
    let writes = |ns: &str| {
        h.api
            .requests()
            .iter()
            .filter(|r| {
                r.is_write()
                    && r.resource == "events"
                    && r.path.starts_with(&format!("/api/v1/namespaces/{ns}/"))
            })
            .count()
    };
    let (pod_writes, node_writes) = (writes("ml"), writes("default"));
    // Create, patches at 1 and 3 s, and the flush: 4 (fewer when the queue
    // merged repeats first).
    assert!(
        (2..=4).contains(&pod_writes),
        "{pod_writes} Pod Event writes for {crashes} crashes"
    );
    assert!(
        (2..=4).contains(&node_writes),
        "{node_writes} Node Event writes for {crashes} crashes"
    );
    let node_event = h
        .api
        .events()
        .into_iter()
        .find(|e| e.involved_object.kind.as_deref() == Some("Node"))
        .unwrap();
    assert_eq!(node_event.count, Some(crashes as i32));
    eprintln!("{crashes} crashes: {pod_writes} Pod Event writes, {node_writes} Node Event writes");
    h.stop().await.stop();
}

/// An API server that stops answering while Events are queued: the writer
/// keeps to the deadline it is given (the agent's share of its stop
/// deadline), not a length of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_to_its_deadline_when_the_api_hangs() {
    let health = with_fault(healthy(2, "boot-a"), 1, 79, Action::RebootNode, 1);
    let mut h = Harness::start(node(vec![], &[]), health).await;
    h.until("fault state", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.api.set_delay(Some(Duration::from_secs(30)));
    for i in 0..5 {
        h.writer().event_sink().send(&xid_event(
            79,
            Action::RebootNode,
            1,
            1_700_000_000_000_000_000 + i,
        ));
    }
    let writer = h.writer.take().expect("writer running");
    let t0 = Instant::now();
    writer.shutdown_within(Duration::from_millis(500)).await;
    let took = t0.elapsed();
    // Well below the 30 s the API hangs for; a loaded machine's lateness on
    // the 500 ms deadline stays far inside it.
    assert!(took < Duration::from_secs(10), "stopped after {took:?}");
    h.api.set_delay(None);
}
