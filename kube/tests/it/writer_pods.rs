//! The pod listing (list and watch of the Node's pods) and the Pod Events it
//! makes possible, end to end against the API-server double.

use crate::kube_common::build::pod_on;
use crate::writer_harness::*;

/// The latest pod listing handed over.
fn latest_pods(h: &Harness) -> Option<Arc<gpuwatch_core::placement::PodDirectory>> {
    h.placements
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|u| match u {
            PlacementUpdate::Pods(d) => Some(d.clone()),
            _ => None,
        })
}

/// The pods bound to the Node are listed and watched (and only they); a
/// fault that names a pod writes a Warning Event on that Pod, in its
/// namespace, in words for the pod's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pods_are_listed_and_a_named_pod_gets_a_warning_event() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.put_pod(&pod_on(NODE, "ml", "trainer-0", "u-1", &[("main", "c1")]));
    api.put_pod(&pod_on("other-node", "ml", "elsewhere", "u-9", &[]));
    let h = Harness::with_listing(api, healthy(8, "boot-a")).await;
    let latest = latest_pods;
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-1")))
        .await
    );
    let d = latest(&h).unwrap();
    assert!(
        !d.by_uid.contains_key("u-9"),
        "a pod of another node: {d:?}"
    );
    assert_eq!(
        d.by_uid["u-1"].containers,
        vec![("c1".to_owned(), "main".to_owned())]
    );
    // Changes arrive through the watch.
    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);
    h.api
        .put_pod(&pod_on(NODE, "ml", "trainer-1", "u-2", &[("main", "c2")]));
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-2")))
        .await
    );
    assert!(h.api.delete_pod("ml", "trainer-1"));
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| !d.by_uid.contains_key("u-2")))
        .await
    );

    let mut ev = xid_event(13, Action::RestartApp, 2, 1_700_000_000_000_000_000);
    ev.pid = Some(7101);
    ev.process = "python".into();
    let mut p = gpuwatch_proto::PodRef {
        uid: "u-1".into(),
        name: "trainer-0".into(),
        namespace: "ml".into(),
        container: "main".into(),
        container_id: "c1".into(),
        ..Default::default()
    };
    p.set_role(gpuwatch_proto::PodRole::Caused);
    ev.pods = vec![p];
    h.writer().event_sink().send(&ev);
    let pod_event = |h: &Harness| {
        h.api
            .events()
            .into_iter()
            .find(|e| e.involved_object.kind.as_deref() == Some("Pod"))
    };
    assert!(
        wait_for(SECS, || pod_event(&h).is_some()).await,
        "{:?}",
        h.api.events()
    );
    let e = pod_event(&h).unwrap();
    assert_eq!(e.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(e.involved_object.name.as_deref(), Some("trainer-0"));
    assert_eq!(e.involved_object.uid.as_deref(), Some("u-1"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reason.as_deref(), Some("GPUApplicationFault"));
    assert_eq!(e.reporting_instance.as_deref(), Some(NODE));
    let msg = e.message.unwrap_or_default();
    assert!(
        msg.contains("python (pid 7101) in container main hit XID 13")
            && msg.contains("illegal memory access or out-of-range address in your kernel")
            && msg.contains("The GPU itself is fine"),
        "{msg}"
    );
    // The Node's own Event names the pod.
    let node_event = |h: &Harness| {
        h.api
            .events()
            .into_iter()
            .find(|e| e.involved_object.kind.as_deref() == Some("Node"))
    };
    assert!(wait_for(SECS, || node_event(&h).is_some()).await);
    let m = node_event(&h).unwrap().message.unwrap_or_default();
    assert!(m.contains("; pod ml/trainer-0 (container main)"), "{m}");
    // A repeat updates the Pod's Event (at the latest when flushed), it does
    // not add one.
    h.writer().event_sink().send(&ev);
    h.writer().event_sink().flush(SECS);
    assert!(wait_for(SECS, || pod_event(&h).is_some_and(|e| e.count == Some(2))).await);
    assert_eq!(
        h.api
            .events()
            .iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("Pod"))
            .count(),
        1
    );
    h.api.assert_requests_declared();
    h.stop().await.stop();
}

/// The pod listing (kube-runtime's watcher) through an outage and a
/// compaction: while the API server is away the engine is told once that the
/// listing is unavailable; a pod deleted meanwhile is missing from the next
/// listing and remembered as gone; a watch whose version was compacted (410)
/// lists again without calling the listing unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_listing_survives_an_outage_and_a_compaction() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.put_pod(&pod_on(NODE, "ml", "trainer-0", "u-1", &[("main", "c1")]));
    let h = Harness::with_listing(api, healthy(8, "boot-a")).await;
    let latest = latest_pods;
    let unavailable = |h: &Harness| {
        h.placements
            .lock()
            .unwrap()
            .iter()
            .filter(|u| matches!(u, PlacementUpdate::PodsUnavailable(_)))
            .count()
    };
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-1")))
        .await
    );
    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);

    h.api.set_down(true);
    assert!(h.api.delete_pod("ml", "trainer-0"));
    assert!(
        wait_for(SECS, || unavailable(&h) == 1).await,
        "{:?}\n{:?}",
        h.placements.lock().unwrap(),
        h.api
            .requests()
            .iter()
            .filter(|r| r.resource == "pods")
            .map(|r| format!("{} {}?{} {}", r.verb, r.path, r.query, r.status))
            .collect::<Vec<_>>()
    );
    h.api.set_down(false);
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(
                |d| !d.by_uid.contains_key("u-1") && d.gone.contains("u-1")
            ))
        .await,
        "{:?}",
        latest(&h)
    );
    assert_eq!(unavailable(&h), 1, "said once per outage");

    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);
    h.api.compact();
    h.api
        .put_pod(&pod_on(NODE, "ml", "trainer-1", "u-2", &[("main", "c2")]));
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-2")))
        .await
    );
    assert_eq!(unavailable(&h), 1, "a 410 is no outage");
    h.stop().await;
}

/// The engine asks for a fresh list when a fault names a pod the listing
/// does not know. With the watch lagging behind the API server (a watch
/// cache behind etcd), the asked-for list finds the pod, the engine gets it
/// and then the word that its listing is current as of when the list was
/// sent; a burst of asks costs one list per `MIN_LIST_GAP`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asked_for_list_finds_a_pod_the_lagging_watch_has_not_shown() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let h = Harness::with_listing(api, healthy(8, "boot-a")).await;
    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);
    h.api.lag_pod_watches(true);
    h.api.put_pod(&pod_on(
        NODE,
        "ml",
        "trainer-new",
        "u-new",
        &[("main", "c9")],
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        latest_pods(&h).is_none_or(|d| !d.by_uid.contains_key("u-new")),
        "the watch lags"
    );
    let lists = |h: &Harness| {
        h.api
            .requests()
            .iter()
            .filter(|r| r.resource == "pods" && r.verb == "list")
            .count()
    };
    let listed_before = lists(&h);
    let asked_at = std::time::Instant::now();
    for _ in 0..20 {
        h.pods_ask.notify_one();
    }
    let current = |h: &Harness| {
        h.placements
            .lock()
            .unwrap()
            .iter()
            .filter_map(|u| match u {
                PlacementUpdate::PodsCurrent(t) => Some(*t),
                _ => None,
            })
            .max()
    };
    assert!(wait_for(SECS, || current(&h).is_some_and(|t| t >= asked_at)).await);
    assert!(latest_pods(&h).is_some_and(|d| d.by_uid["u-new"].name == "trainer-new"));
    // Twenty asks at once cost one list (two when some arrive while the
    // first is under way); one more ask later costs one more (joined with
    // the burst's second when that was still waiting for its gap). Each
    // answered list tells when the listing sent it: those times are counted
    // and spaced, not when the double answered.
    let asked_again = std::time::Instant::now();
    h.pods_ask.notify_one();
    assert!(
        wait_for(SECS, || current(&h).is_some_and(|t| t >= asked_again)).await,
        "the second ask was never answered"
    );
    let sent: Vec<std::time::Instant> = h
        .placements
        .lock()
        .unwrap()
        .iter()
        .filter_map(|u| match u {
            PlacementUpdate::PodsCurrent(t) if *t >= asked_at => Some(*t),
            _ => None,
        })
        .collect();
    let burst = sent.iter().filter(|t| **t < asked_again).count();
    let later = sent.len() - burst;
    assert!((1..=2).contains(&burst), "burst lists sent at {sent:?}");
    assert_eq!(later, 1, "lists sent at {sent:?}");
    assert_eq!(lists(&h) - listed_before, sent.len());
    for pair in sent.windows(2) {
        assert!(
            pair[1].duration_since(pair[0]) >= gpuwatch_kube::MIN_LIST_GAP,
            "{sent:?}"
        );
    }
    // The watch catches up: the pod stays, nothing is listed twice.
    h.api.lag_pod_watches(false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(latest_pods(&h).unwrap().by_uid.len(), 1);
}
