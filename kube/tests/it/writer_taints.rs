//! The fault taint end to end against the API-server double: lost races
//! on the taint list, and the write pacing under a storm of health changes.

use crate::writer_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_lost_races_in_a_row_land_the_fault_taint_without_backing_off() {
    let api = ApiDouble::start(node(vec![taint("dedicated", Some("gpu"))], &[])).await;
    // An error backoff far longer than any wait of a loaded machine: a lost
    // race retried after it (instead of the short jittered pause) shows.
    let backoff = Duration::from_secs(10);
    let cfg = KubeConfig {
        backoff_initial_ms: backoff.as_millis() as u64,
        backoff_max_ms: backoff.as_millis() as u64,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    // Running and watching, its first writes done.
    h.until("healthy", |n| {
        status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    // Another writer changes the Node between every read and write, six times.
    h.api.concurrent_taint_edits(6);
    h.set(with_fault(
        healthy(2, "boot-a"),
        1,
        79,
        Action::RebootNode,
        1,
    ));
    h.until("fault taint", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    // Every foreign taint, the six added during the races included, is kept.
    let mut want = vec!["dedicated".to_owned()];
    want.extend((0..6).rev().map(|i| format!("other.example.com/edit-{i}")));
    want.push(FAULT_TAINT.to_owned());
    assert_eq!(taint_keys(&h.api.node()), want);
    let reqs = h.api.requests();
    let taint_patches: Vec<&Recorded> = reqs
        .iter()
        .filter(|r| r.resource == "nodes" && r.verb == "patch")
        .collect();
    let statuses: Vec<u16> = taint_patches.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [409, 409, 409, 409, 409, 409, 200]);
    let last_race = taint_patches[5].at;
    let landed = taint_patches[6].at;
    eprintln!(
        "six races: 409s over {:?}, taint landed {:?} after the last race",
        last_race - taint_patches[0].at,
        landed - last_race
    );
    // Each retry waited a jittered pause (at least 25 ms), not the error
    // backoff (at least 10 s), and re-read.
    for w in taint_patches.windows(2) {
        let gap = w[1].at - w[0].at;
        assert!(
            gap >= Duration::from_millis(25) && gap < backoff,
            "retried {gap:?} after a lost race"
        );
    }
    for r in &taint_patches {
        assert_eq!(r.content_type, "application/merge-patch+json");
        assert!(
            r.body["metadata"]["resourceVersion"].is_string(),
            "{}",
            r.body
        );
    }
    let gets_between = reqs
        .iter()
        .filter(|r| r.verb == "get" && r.at > taint_patches[0].at && r.at < landed)
        .count();
    assert_eq!(gets_between, 6, "one fresh read per lost race");
    // The writer counts its write once the API server's answer is back, which can
    // be after the server already shows the taint.
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::Taint, WriteResult::Ok)
            >= 1)
        .await,
        "the landed taint write was never counted"
    );
    assert_eq!(
        h.metrics
            .kube_writes(KubeObject::Taint, WriteResult::Conflict),
        6
    );
    assert_eq!(h.metrics.kube_writes(KubeObject::Taint, WriteResult::Ok), 1);
    // The conflict is in what the metric outputs collect from the writer
    // (their rendering of `gpuwatch.kube.writes` is gpuwatch-sinks' test).
    let mut batch = gpuwatch_core::metric_source::MetricBatch::default();
    gpuwatch_core::metric_source::MetricSource::collect(&*h.metrics, &mut batch);
    let conflicts: Vec<_> = batch
        .points("gpuwatch.kube.writes")
        .iter()
        .filter(|p| {
            let attr = |key: &str| {
                p.attrs
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.to_label().into_owned())
            };
            attr("object").as_deref() == Some("taint")
                && attr("result").as_deref() == Some("conflict")
        })
        .map(|p| p.value.as_u64())
        .collect();
    assert_eq!(conflicts, [6]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_health_changes_is_paced_to_one_write_per_second() {
    let h = Harness::start(
        node(vec![], &[]),
        with_fault(healthy(8, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("first state", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    let start_writes = h.api.requests().iter().filter(|r| r.is_write()).count();
    let t0 = Instant::now();
    // 1000 health changes over ~3 s, every one with a different message.
    for i in 0..1000u64 {
        h.set(with_fault(
            healthy(8, "boot-a"),
            (i % 8) as usize,
            48,
            Action::ResetGpu,
            i + 2,
        ));
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    // The last change: count 1001 on GPU 7 (999 % 8).
    h.until("last state", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.starts_with("GPU 7 ") && m.contains("seen 1000+ times"))
    })
    .await;
    let total = t0.elapsed().as_secs_f64();
    let writes = h.api.requests().iter().filter(|r| r.is_write()).count() - start_writes;
    eprintln!("storm: 1000 health changes in {secs:.1}s -> {writes} node writes in {total:.1}s");
    assert!(
        (writes as f64) <= total.ceil() + 1.0,
        "{writes} writes in {total:.1}s (storm {secs:.1}s)"
    );
    assert!(writes >= 2, "the writer should keep converging: {writes}");
    h.stop().await;
}
