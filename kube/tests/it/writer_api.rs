//! The writer against an API server that fails: an outage, a missing Node,
//! throttling, server errors, and its Node watch expiring, bookmarked and
//! closed by the server.

use crate::writer_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_outage_then_converges() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.set_down(true);
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    // The writer keeps retrying through the outage (how often: the backoff,
    // `missing_node_is_retried_until_it_exists`).
    assert!(
        wait_for(SECS, || h.api.requests().len() >= 4).await,
        "writer should keep retrying"
    );
    // Retrying through an outage is progress, never a stuck writer: its
    // heartbeat moves with every reconcile attempt. The requests counted
    // above also come from the Node watch, which may retry twice while the
    // reconcile loop sits in its backoff, so wait for the beat itself.
    let beat = h.progress.last_beat_ms();
    assert!(beat > 0, "the loop beats");
    assert!(
        wait_for(SECS, || h.progress.last_beat_ms() > beat).await,
        "a retry during the outage beats"
    );
    assert!(
        h.api.requests().iter().all(|r| r.status == 503),
        "the outage still holds, so the beat came from a failed attempt"
    );
    let during = h.api.requests().len();
    assert!(taint_value(&h.api.node(), FAULT_TAINT).is_none());
    h.api.set_down(false);
    h.until("converged after the outage", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
            && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    assert!(
        h.api.requests()[..during].iter().all(|r| r.status == 503),
        "every request during the outage failed"
    );
    // The watch came back too: a removed taint is restored without a resync.
    h.api.edit_node(|n| {
        n["spec"]["taints"] = serde_json::json!([]);
    });
    h.until("taint restored", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.stop().await;
}

/// The Node is missing (404) at first: reported and retried with backoff,
/// never given up; once it exists the writer converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_node_is_retried_until_it_exists() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.set_node_missing(true);
    let t0 = Instant::now();
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    let gets = |h: &Harness| h.api.requests().iter().filter(|r| r.verb == "get").count();
    assert!(wait_for(SECS, || gets(&h) >= 6).await, "still trying");
    // At most two loops read it (reconcile, watch), each backing off from 50
    // ms doubling: six reads take at least 50 + 100 ms in each, where
    // retrying at once takes a few milliseconds.
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(150), "6 reads in {took:?}");
    let during = h.api.requests();
    assert!(
        during
            .iter()
            .filter(|r| r.verb == "get")
            .all(|r| r.status == 404)
    );
    h.api.set_node_missing(false);
    h.until("converged", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    h.stop().await;
}

/// 429 from the API server's load shedding: the writer waits at least the
/// `Retry-After` second before the same request again, then converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_requests_wait_for_retry_after() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.inject(&[429, 429, 429]);
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("converged after throttling", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    let reqs = h.api.requests();
    let throttled: Vec<&Recorded> = reqs.iter().filter(|r| r.status == 429).collect();
    assert_eq!(throttled.len(), 3);
    // Two loops read the Node (reconcile, watch); without Retry-After each would
    // retry within 100 ms. Within the second after a 429, at most the other
    // loop's request of the same kind follows.
    for t in throttled {
        let soon = reqs
            .iter()
            .filter(|r| {
                r.at > t.at
                    && r.at - t.at < Duration::from_millis(990)
                    && r.verb == t.verb
                    && r.resource == t.resource
            })
            .count();
        assert!(
            soon <= 1,
            "{} {} retried {soon} times within a second of a 429",
            t.verb,
            t.resource
        );
    }
    h.stop().await;
}

/// 500 and 503 answers: retried with jittered exponential backoff, then the
/// writer converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_back_off_then_converge() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.inject(&[500, 503, 500, 503, 500, 503]);
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("converged after server errors", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    let reqs = h.api.requests();
    assert_eq!(reqs.iter().filter(|r| r.status >= 500).count(), 6);
    assert_paced(&reqs, "nodes");
    h.stop().await;
}

/// The watch's version is compacted away: the server sends ERROR 410 Expired;
/// the writer lists its Node again and watches from the list's version, so a
/// later removal of our taint is still seen (and undone) without a resync.
/// Other objects changed after the Node did, so the Node's own version is older
/// than the compaction: a watch from it would be 410 again, every time (a quiet
/// Node on a busy cluster); the list's version is the server's current one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_watch_relists_and_resumes_from_the_read_version() {
    let h = Harness::start(
        node(vec![], &[]),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("fault taint", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    let before = h.api.requests().len();
    let node_rv: u64 = h
        .api
        .node()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    h.api.advance_version();
    h.api.advance_version();
    h.api.compact();
    // The wait ends as soon as the watch is back; the bound is generous
    // because the rest of the suite (a hundred-node quarantine wave) can
    // starve this runtime for seconds on two cores.
    assert!(
        wait_for(SECS * 6, || h.api.watchers() >= 1).await,
        "watch restarted"
    );
    let after: Vec<Recorded> = h.api.requests()[before..].to_vec();
    let list = after
        .iter()
        .position(|r| r.verb == "list" && r.resource == "nodes")
        .expect("the Node is listed again");
    assert!(
        after[list].query.contains("fieldSelector=metadata.name%3D"),
        "{}",
        after[list].query
    );
    let watch = after[list..]
        .iter()
        .find(|r| r.verb == "watch")
        .expect("then watched");
    let from: u64 = watch
        .query
        .split('&')
        .find_map(|kv| kv.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
        .expect("a resourceVersion");
    assert!(
        from >= node_rv + 2,
        "watched from {from}, the Node's own version is {node_rv}"
    );
    let watches = after.iter().filter(|r| r.verb == "watch").count();
    assert_eq!(watches, 1, "one watch after the relist, no 410 loop");
    h.api
        .edit_node(|n| n["spec"]["taints"] = serde_json::json!([]));
    h.until("taint restored through the new watch", |n| {
        taint_value(n, FAULT_TAINT).is_some()
    })
    .await;
    h.stop().await;
}

/// A server that answers 410 to every watch, even from the version it just
/// listed: the writer backs off between tries instead of asking again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_expires_every_time_backs_off() {
    let h = Harness::start(node(vec![], &[]), healthy(2, "boot-a")).await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    let before = h.api.requests().len();
    h.api.expire_every_watch();
    let t0 = Instant::now();
    let watches = || {
        h.api.requests()[before..]
            .iter()
            .filter(|r| r.verb == "watch")
            .count()
    };
    assert!(wait_for(SECS, || watches() >= 5).await, "it keeps watching");
    // The double's backoff (50 ms doubling to 400 ms): five tries take at
    // least 50 + 100 + 200 ms; a tight loop makes hundreds in that time.
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(300), "5 watches in {took:?}");
    h.stop().await;
}

/// Watches ask for bookmarks; a BOOKMARK moves the version the next watch
/// starts from; a watch the server closes at `timeoutSeconds` is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_and_server_timeouts_keep_the_watch_current() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.watch_timeout_secs = 1;
    let h = Harness::with(
        api,
        cfg,
        ValidationSettings::default(),
        healthy(2, "boot-a"),
    )
    .await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    // The writer's own writes are done once the healthy conditions are on
    // the Node (no taint to write); then a bookmark moves the version.
    h.until("healthy conditions", |n| {
        status_of(n, READY).as_deref() == Some("True")
            && status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    let bookmark = h.api.bookmark();
    let since = h.api.requests().len();
    let watches = || -> Vec<Recorded> {
        h.api.requests()[since..]
            .iter()
            .filter(|r| r.verb == "watch")
            .cloned()
            .collect()
    };
    assert!(
        wait_for(SECS, || !watches().is_empty()).await,
        "the server's timeout ends the watch and the writer watches again"
    );
    let next = &watches()[0];
    assert!(
        next.query.contains("allowWatchBookmarks=true"),
        "{}",
        next.query
    );
    assert!(
        next.query.contains(&format!("resourceVersion={bookmark}")),
        "{}",
        next.query
    );
    h.stop().await;
}
