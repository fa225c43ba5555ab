//! The fleet quarantine budget end to end: twenty real node writers against one
//! API-server double holding a hundred GPU Nodes, all seeing XID 79 at once.
//! The double answers Leases as kube-apiserver does (create 409
//! AlreadyExists, update 422 without a resourceVersion and 409 with a stale
//! one, delete preconditions; see `gpuwatch_test_support::kube`), and counts
//! after every request how many Nodes carry the fault taint.

use crate::kube_common::{ApiDouble, build, taint_value, wait_for};
use gpuwatch_core::validation::ValidationSettings;
use gpuwatch_kube::{KubeClient, KubeConfig, KubeMetrics, KubeSettings, NodeWriter, WriterHooks};
use gpuwatch_proto::{Action, NodeHealth};
use k8s_openapi::api::core::v1::Node;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

const FAULT_TAINT: &str = "gpuwatch.io/unhealthy";
const FLEET: usize = 100;
const AGENTS: usize = 20;
const BUDGET: usize = 10;

fn name(i: usize) -> String {
    format!("gpu-node-{i:03}")
}

fn gpu_node(i: usize) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name(i));
    n.metadata.uid = Some(format!("uid-{i:03}"));
    n.metadata.labels = Some(BTreeMap::from([(
        "nvidia.com/gpu.present".to_owned(),
        "true".to_owned(),
    )]));
    n
}

/// One GPU, healthy or with an XID 79 that asks for a hardware inspection.
fn health(faulty: bool) -> NodeHealth {
    let h = gpuwatch_test_support::health::healthy("", 1, "boot-a");
    if faulty {
        build::with_fault(h, 0, 79, Action::InspectHardware, 1)
    } else {
        h
    }
}

struct FleetNode {
    health: watch::Sender<Arc<NodeHealth>>,
    writer: NodeWriter,
}

struct WriterFleet {
    api: ApiDouble,
    agents: BTreeMap<String, FleetNode>,
}

impl WriterFleet {
    async fn start(api: ApiDouble) -> WriterFleet {
        api.track_taint(FAULT_TAINT);
        let mut agents = BTreeMap::new();
        for i in 0..AGENTS {
            let (tx, rx) = watch::channel(Arc::new(health(false)));
            let resolved = settings(&api);
            let client = KubeClient::connect(&resolved).await.expect("a client");
            let writer = NodeWriter::start(
                resolved,
                ValidationSettings::default(),
                name(i),
                KubeMetrics::new(),
                rx,
                &client,
                WriterHooks::default(),
            )
            .await
            .expect("writer starts");
            agents.insert(name(i), FleetNode { health: tx, writer });
        }
        WriterFleet { api, agents }
    }

    fn tainted(&self) -> BTreeSet<String> {
        (0..FLEET)
            .map(name)
            .filter(|n| {
                self.api
                    .node_named(n)
                    .is_some_and(|node| taint_value(&node, FAULT_TAINT).is_some())
            })
            .collect()
    }

    fn holders(&self) -> BTreeSet<String> {
        self.api
            .leases("default")
            .into_iter()
            .filter_map(|l| l.spec.and_then(|s| s.holder_identity))
            .collect()
    }

    /// Every agent sees XID 79 in the same instant.
    fn wave(&self) {
        for a in self.agents.values() {
            a.health.send_replace(Arc::new(health(true)));
        }
    }

    async fn settled(&self, what: &str) {
        assert!(
            wait_for(Duration::from_secs(20), || self.tainted().len() == BUDGET).await,
            "{what}: {} tainted",
            self.tainted().len()
        );
    }

    /// The agent stops as a killed process would: it never renews or gives
    /// back its slot.
    async fn kill(&mut self, node: &str) {
        let a = self.agents.remove(node).expect("agent");
        a.writer.shutdown_within(Duration::from_secs(5)).await;
    }

    /// Starts the agent of `node` again (a restarted pod on the same Node).
    async fn restart(&mut self, node: &str, now: NodeHealth) {
        let (tx, rx) = watch::channel(Arc::new(now));
        let resolved = settings(&self.api);
        let client = KubeClient::connect(&resolved).await.expect("a client");
        let writer = NodeWriter::start(
            resolved,
            ValidationSettings::default(),
            node.to_owned(),
            KubeMetrics::new(),
            rx,
            &client,
            WriterHooks::default(),
        )
        .await
        .expect("writer starts");
        self.agents
            .insert(node.to_owned(), FleetNode { health: tx, writer });
    }

    /// Whether `node`'s slot Lease was renewed in the last lease duration.
    fn renewed_by(&self, node: &str) -> bool {
        self.api.leases("default").into_iter().any(|l| {
            let spec = l.spec.unwrap_or_default();
            spec.holder_identity.as_deref() == Some(node)
                && spec.renew_time.is_some_and(|t| {
                    k8s_openapi::jiff::Timestamp::now().duration_since(t.0)
                        < k8s_openapi::jiff::SignedDuration::from_secs(5)
                })
        })
    }

    /// Whether `node` has renewed its slot Lease (a 200 answer to its
    /// update) since `since`.
    fn renewed_by_since(&self, node: &str, since: Instant) -> bool {
        self.api.requests().iter().any(|r| {
            r.resource == "leases"
                && r.verb == "update"
                && r.status == 200
                && r.at >= since
                && r.body["spec"]["holderIdentity"] == node
        })
    }

    fn leases_held_by(&self, node: &str) -> usize {
        self.api
            .leases("default")
            .into_iter()
            .filter(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(node))
            .count()
    }

    async fn stop(self) {
        for (_, a) in self.agents {
            a.writer.shutdown_within(Duration::from_secs(5)).await;
        }
    }
}

fn settings(api: &ApiDouble) -> KubeSettings {
    config(api).resolve().unwrap()
}

fn config(api: &ApiDouble) -> KubeConfig {
    KubeConfig {
        quarantine_budget: "10%".into(),
        // Test-sized: a deferred Node looks again every 0.5–1.5 s, a silent
        // holder's slot is free after 15 s.
        quarantine_retry_secs: 1,
        quarantine_lease_duration_secs: 15,
        // Tests wait for the startup gate only where they ask for it.
        startup_gate: false,
        ..api.kube_config()
    }
}

async fn fleet_double() -> ApiDouble {
    let api = ApiDouble::start(gpu_node(0)).await;
    for i in 1..FLEET {
        api.add_node(gpu_node(i));
    }
    api
}

fn deferral_events(api: &ApiDouble) -> BTreeSet<String> {
    api.events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("QuarantineBudgetExhausted"))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.involved_object.name)
        .collect()
}

/// Each of the ten deferred Nodes says why it is not tainted, naming the
/// full budget.
async fn assert_deferred_nodes_say_why(fleet: &WriterFleet) {
    let deferred: BTreeSet<String> = fleet
        .agents
        .keys()
        .filter(|n| !fleet.tainted().contains(*n))
        .cloned()
        .collect();
    assert_eq!(deferred.len(), AGENTS - BUDGET);
    assert!(
        wait_for(Duration::from_secs(10), || deferral_events(&fleet.api)
            == deferred)
        .await,
        "deferral Events on {:?}, deferred {deferred:?}",
        deferral_events(&fleet.api)
    );
    let ev = fleet
        .api
        .events()
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("QuarantineBudgetExhausted"))
        .unwrap();
    let msg = ev.message.unwrap_or_default();
    assert!(msg.contains("10 of 10 slots held by"), "{msg}");
}

/// An operator clears one holder (`gpuwatch clear`): its faults go, its
/// taint goes, its slot goes to a deferred Node within a minute.
async fn cleared_holders_slot_goes_to_a_deferred_node(fleet: &WriterFleet) {
    let cleared = fleet.tainted().into_iter().next().unwrap();
    fleet.agents[&cleared]
        .health
        .send_replace(Arc::new(health(false)));
    let t1 = Instant::now();
    assert!(
        wait_for(Duration::from_secs(60), || {
            let t = fleet.tainted();
            t.len() == BUDGET && !t.contains(&cleared)
        })
        .await,
        "no deferred Node took the cleared slot"
    );
    eprintln!("quarantine: cleared slot taken after {:?}", t1.elapsed());
    assert_eq!(fleet.api.taint_peak(), BUDGET);
}

/// A holder dies with its machine (Node deleted): its slot is taken within a
/// minute.
async fn deleted_holders_slot_is_taken(fleet: &mut WriterFleet) {
    let gone = fleet.tainted().into_iter().next().unwrap();
    fleet.kill(&gone).await;
    assert!(fleet.api.delete_node(&gone));
    let t2 = Instant::now();
    assert!(
        wait_for(Duration::from_secs(60), || fleet.tainted().len() == BUDGET
            && !fleet.holders().contains(&gone))
        .await,
        "the slot of a deleted Node was not taken"
    );
    eprintln!(
        "quarantine: deleted holder's slot taken after {:?}",
        t2.elapsed()
    );
    assert_eq!(fleet.api.taint_peak(), BUDGET);
}

/// A holder's agent dies (kill -9, a crash loop) and its pod starts again on
/// the same Node while the Node keeps the fault taint: it adopts its own
/// slot, no second one, and the count stays at the budget. (That a dead
/// holder's tainted Node keeps its slot past the Lease duration is
/// `Claimant::step`'s decision, shown on paused time in the crate's unit
/// tests.)
async fn restarted_holder_adopts_its_own_slot(fleet: &mut WriterFleet) {
    let silent = fleet.tainted().into_iter().next().unwrap();
    fleet.kill(&silent).await;
    assert!(
        fleet.holders().contains(&silent),
        "the dead holder's tainted Node lost its slot"
    );
    fleet.restart(&silent, health(true)).await;
    let t3 = Instant::now();
    assert!(
        wait_for(Duration::from_secs(30), || fleet.renewed_by(&silent)).await,
        "the restarted agent did not take its slot back"
    );
    eprintln!(
        "quarantine: restarted holder renewed its slot after {:?}",
        t3.elapsed()
    );
    assert_eq!(fleet.leases_held_by(&silent), 1, "no second slot");
    assert_eq!(fleet.tainted().len(), BUDGET);
    assert_eq!(fleet.api.taint_peak(), BUDGET);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_over_a_hundred_nodes_taints_ten_and_hands_slots_on() {
    let mut fleet = WriterFleet::start(fleet_double().await).await;
    let t0 = Instant::now();
    fleet.wave();
    fleet.settled("the wave").await;
    eprintln!(
        "quarantine: wave settled at 10 tainted in {:?}",
        t0.elapsed()
    );
    assert_eq!(fleet.api.taint_peak(), BUDGET, "never more than the budget");
    assert_eq!(
        fleet.holders(),
        fleet.tainted(),
        "every tainted Node holds a slot"
    );
    // Ten deferred Nodes look again every 0.5–1.5 s (retry 1 s here, twice
    // that after a few rounds): a few Lease lists a second, not a spin. The
    // rate is taken over the rest of the test (the pacing itself is
    // `Claimant::step`'s, on paused time in the crate's unit tests).
    let lists_before = lease_lists(&fleet.api);
    let t_lists = Instant::now();
    assert_deferred_nodes_say_why(&fleet).await;
    cleared_holders_slot_goes_to_a_deferred_node(&fleet).await;
    deleted_holders_slot_is_taken(&mut fleet).await;
    restarted_holder_adopts_its_own_slot(&mut fleet).await;
    let listed = lease_lists(&fleet.api) - lists_before;
    let secs = t_lists.elapsed().as_secs_f64();
    eprintln!("quarantine: {listed} Lease lists in {secs:.1} s from the deferred Nodes");
    assert!(
        listed as f64 <= 24.0 * secs.max(1.0),
        "{listed} Lease lists in {secs:.1} s: more than a few a second"
    );
    fleet.api.assert_requests_declared();
    fleet.stop().await;
}

/// Lease lists the double has answered.
fn lease_lists(api: &ApiDouble) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.resource == "leases" && r.verb == "list")
        .count()
}

/// Lease requests the double answered with `status` since `since`.
fn lease_requests_since(api: &ApiDouble, since: Instant, status: u16) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.resource == "leases" && r.at >= since && r.status == status)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_during_a_wave_never_pass_the_budget() {
    let fleet = WriterFleet::start(fleet_double().await).await;
    // The first claims meet throttling, server errors and an unavailable
    // server, interleaved with answers.
    fleet
        .api
        .inject(&[429, 500, 503, 429, 500, 503, 429, 500, 503, 429, 500, 503]);
    fleet.wave();
    fleet.settled("the wave with API errors").await;
    assert_eq!(fleet.api.taint_peak(), BUDGET);
    assert_eq!(fleet.holders(), fleet.tainted());
    let holders = fleet.holders();
    // The API server goes away while the deferred Nodes ask again (each
    // of the ten is refused at least once; they retry every 0.5–1.5 s),
    // then comes back and answers them: nothing changes.
    let down_at = Instant::now();
    fleet.api.set_down(true);
    assert!(
        wait_for(Duration::from_secs(20), || lease_requests_since(
            &fleet.api, down_at, 503
        ) >= AGENTS - BUDGET)
        .await,
        "the claimants did not ask while the server was down"
    );
    assert_eq!(fleet.tainted().len(), BUDGET);
    let up_at = Instant::now();
    fleet.api.set_down(false);
    assert!(
        wait_for(Duration::from_secs(20), || lease_requests_since(
            &fleet.api, up_at, 200
        ) >= AGENTS - BUDGET
            && holders.iter().all(|h| fleet.renewed_by_since(h, up_at)))
        .await,
        "the claimants did not ask again, or a holder did not renew, once the server was back"
    );
    assert_eq!(fleet.tainted().len(), BUDGET);
    assert_eq!(fleet.holders(), holders);
    assert_eq!(fleet.api.taint_peak(), BUDGET);
    fleet.stop().await;
}

/// The Event reason and message of every `QuarantineBudgetUnavailable` Warning
/// on `node`.
fn unavailable_events(api: &ApiDouble, node: &str) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("QuarantineBudgetUnavailable"))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| e.involved_object.name.as_deref() == Some(node))
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

/// Starts the writer of Node `node` alone, with `cfg`, reporting into
/// `metrics`.
async fn start_one_writer(
    cfg: KubeConfig,
    node: &str,
    metrics: &Arc<KubeMetrics>,
    rx: watch::Receiver<Arc<NodeHealth>>,
) -> NodeWriter {
    let resolved = cfg.resolve().unwrap();
    let client = KubeClient::connect(&resolved).await.expect("a client");
    NodeWriter::start(
        resolved,
        ValidationSettings::default(),
        node.to_owned(),
        metrics.clone(),
        rx,
        &client,
        WriterHooks::default(),
    )
    .await
    .expect("writer starts")
}

/// One `QuarantineBudgetUnavailable` Event object on `node`: first the
/// startup check's verdict, then the API server's own 403 from the claim.
async fn assert_one_event_quotes_the_403(api: &ApiDouble, node: &str) {
    assert!(
        wait_for(Duration::from_secs(10), || !unavailable_events(api, node)
            .is_empty())
        .await,
        "no QuarantineBudgetUnavailable Event"
    );
    assert!(
        wait_for(Duration::from_secs(10), || unavailable_events(api, node)
            .iter()
            .any(|m| m.contains("403")))
        .await,
        "{:?}",
        unavailable_events(api, node)
    );
    let events = unavailable_events(api, node);
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].contains("forbidden"), "{}", events[0]);
    assert!(
        events[0].contains("leases (coordination.k8s.io)"),
        "{}",
        events[0]
    );
}

/// Once Leases are allowed again the agent holds exactly one slot and the
/// gauge behind `/readyz` clears.
async fn assert_one_slot_once_leases_are_allowed(
    api: &ApiDouble,
    node: &str,
    metrics: &KubeMetrics,
) {
    for verb in ["get", "list", "create", "update", "delete"] {
        api.unforbid(verb, "leases");
    }
    assert!(
        wait_for(Duration::from_secs(60), || metrics
            .quarantine()
            .is_some_and(|q| q.state == "held"))
        .await,
        "no slot once Leases were allowed: {:?}",
        metrics.quarantine()
    );
    assert!(!metrics.status().quarantine_unavailable);
    assert_eq!(
        api.leases("default")
            .iter()
            .filter(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(node))
            .count(),
        1
    );
}

/// A Role without `leases` (every Lease request answered 403): the budget
/// fails open and loud — the faulty Node is tainted, a Warning Event quotes
/// the 403, the gauge behind `/readyz` says unavailable — and once Leases
/// are allowed again the agent takes a slot and the gauge clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_leases_taints_anyway_and_says_why() {
    let api = fleet_double().await;
    api.track_taint(FAULT_TAINT);
    for verb in ["get", "list", "create", "update", "delete"] {
        api.forbid(verb, "leases");
    }
    let node = name(0);
    let metrics = KubeMetrics::new();
    let (tx, rx) = watch::channel(Arc::new(health(false)));
    let cfg = KubeConfig {
        // A changed Event is patched at once here, not after a minute.
        event_patch_interval_secs: 1,
        ..config(&api)
    };
    let writer = start_one_writer(cfg, &node, &metrics, rx).await;
    // The startup check finds the broken Role before any fault.
    assert!(
        wait_for(Duration::from_secs(10), || metrics
            .status()
            .quarantine_unavailable)
        .await,
        "the startup access check did not report the Role"
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.resource == "selfsubjectaccessreviews")
    );
    let t0 = Instant::now();
    tx.send_replace(Arc::new(health(true)));
    assert!(
        wait_for(Duration::from_secs(60), || api
            .node_named(&node)
            .is_some_and(|n| taint_value(&n, FAULT_TAINT).is_some()))
        .await,
        "the faulty Node was not tainted without the budget"
    );
    eprintln!(
        "quarantine: tainted without the budget after {:?}",
        t0.elapsed()
    );
    assert_one_event_quotes_the_403(&api, &node).await;
    let q = metrics.quarantine().expect("quarantine status");
    assert_eq!(q.state, "unavailable_refused", "{q:?}");
    assert_one_slot_once_leases_are_allowed(&api, &node, &metrics).await;
    api.assert_requests_declared();
    writer.shutdown_within(Duration::from_secs(5)).await;
}

/// The Leases' namespace does not exist (a create there is 404): the same
/// fail-open path, quoting the 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_taints_anyway_and_says_why() {
    let api = fleet_double().await;
    api.set_namespace_missing("default", true);
    let node = name(0);
    let metrics = KubeMetrics::new();
    let (_tx, rx) = watch::channel(Arc::new(health(true)));
    let resolved = settings(&api);
    let client = KubeClient::connect(&resolved).await.expect("a client");
    let writer = NodeWriter::start(
        resolved,
        ValidationSettings::default(),
        node.clone(),
        metrics.clone(),
        rx,
        &client,
        WriterHooks::default(),
    )
    .await
    .expect("writer starts");
    assert!(
        wait_for(Duration::from_secs(60), || api
            .node_named(&node)
            .is_some_and(|n| taint_value(&n, FAULT_TAINT).is_some()))
        .await,
        "the faulty Node was not tainted without the budget: {:?}",
        metrics.quarantine()
    );
    assert!(
        wait_for(Duration::from_secs(10), || unavailable_events(&api, &node)
            .iter()
            .any(|m| m.contains("namespaces \"default\" not found")))
        .await,
        "{:?}",
        unavailable_events(&api, &node)
    );
    writer.shutdown_within(Duration::from_secs(5)).await;
}
