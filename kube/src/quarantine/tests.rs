//! The protocol against the in-memory API server, many agents at once, on
//! paused time. Each agent's Node carries the fault taint exactly while its
//! status permits it (as the reconciler applies it), and the harness checks the
//! bound after every change.

use super::memory::{Answer, Requests};
use super::*;
use crate::backend::ApiError;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(60);

fn settings(identity: &str, budget: &str) -> Settings {
    Settings {
        budget: Budget::parse(budget).unwrap(),
        floor: 2,
        identity: identity.to_owned(),
        lease_duration: LEASE,
        retry: Duration::from_secs(15),
        recount_every: FLEET_RECOUNT_INTERVAL,
        backoff: (Duration::from_millis(500), Duration::from_secs(30)),
        namespace: "gpuwatch".into(),
    }
}

fn node(i: usize) -> String {
    format!("gpu-node-{i:03}")
}

/// The fleet's taints as the agents' reconcilers would leave them.
#[derive(Debug, Default)]
struct Board {
    tainted: BTreeSet<String>,
    peak: usize,
    statuses: std::collections::BTreeMap<String, Status>,
}

struct SimClaimant {
    need: tokio::sync::watch::Sender<Need>,
    /// The agent process's stop signal, as `run` gets it.
    stop: Shutdown,
    task: JoinHandle<()>,
}

struct ClaimantFleet {
    store: Arc<MemoryLeaseStore>,
    board: Arc<Mutex<Board>>,
    agents: std::collections::BTreeMap<String, SimClaimant>,
    budget: &'static str,
}

impl ClaimantFleet {
    fn new(nodes: usize, budget: &'static str) -> ClaimantFleet {
        let store = MemoryLeaseStore::with_nodes((0..nodes).map(node))
            .with_latency(Duration::from_millis(1), Duration::from_millis(30));
        ClaimantFleet {
            store: Arc::new(store),
            board: Arc::default(),
            agents: Default::default(),
            budget,
        }
    }

    /// Starts the agent of Node `name` (again, after a kill: a restart).
    fn start(&mut self, name: &str, need: bool) {
        let claimant = Claimant::new(self.store.clone(), settings(name, self.budget));
        let (need_tx, need_rx) = tokio::sync::watch::channel(Need {
            slot: need,
            node_uid: format!("uid-of-{name}"),
            reason: "inspect_hardware".into(),
        });
        let stop = Shutdown::new();
        let board = self.board.clone();
        let who = name.to_owned();
        let task = tokio::spawn(agent_loop(claimant, need_rx, stop.clone(), board, who));
        self.agents.insert(
            name.to_owned(),
            SimClaimant {
                need: need_tx,
                stop,
                task,
            },
        );
    }

    /// The Node's faults clear: its reconciler removes the taint, then the
    /// slot is no longer needed.
    fn clear(&self, name: &str) {
        self.board.lock().unwrap().tainted.remove(name);
        self.store.set_tainted(name, false);
        self.agents[name].need.send_modify(|n| n.slot = false);
    }

    /// Kills the agent (no release: the process is gone). Its Node keeps the
    /// taint it had.
    async fn kill(&mut self, name: &str) {
        let a = self.agents.remove(name).unwrap();
        a.task.abort();
        let _ = a.task.await;
    }

    async fn stop_all(self) {
        for (_, a) in self.agents {
            a.stop.trigger();
            let _ = a.task.await;
        }
    }

    fn tainted(&self) -> BTreeSet<String> {
        self.board.lock().unwrap().tainted.clone()
    }

    fn status(&self, name: &str) -> Option<Status> {
        self.board.lock().unwrap().statuses.get(name).cloned()
    }

    fn peak(&self) -> usize {
        self.board.lock().unwrap().peak
    }

    fn count(&self, f: impl Fn(&Status) -> bool) -> usize {
        self.board
            .lock()
            .unwrap()
            .statuses
            .iter()
            .filter(|(n, s)| self.agents.contains_key(*n) && f(s))
            .count()
    }
}

/// `run`, with the taint applied as the reconciler does (a status that says
/// nothing yet leaves the taint as it is).
async fn agent_loop(
    mut claimant: Claimant<Arc<MemoryLeaseStore>>,
    mut need: tokio::sync::watch::Receiver<Need>,
    stop: Shutdown,
    board: Arc<Mutex<Board>>,
    who: String,
) {
    loop {
        let n = need.borrow_and_update().clone();
        claimant.set_context(&n.node_uid, &n.reason);
        let step = claimant.step(n.slot).await;
        {
            let mut b = board.lock().unwrap();
            match step.status.permits_taint() {
                Some(true) if n.slot => {
                    b.tainted.insert(who.clone());
                    claimant.store().set_tainted(&who, true);
                }
                Some(false) => {
                    b.tainted.remove(&who);
                    claimant.store().set_tainted(&who, false);
                }
                _ => {}
            }
            b.peak = b.peak.max(b.tainted.len());
            b.statuses.insert(who.clone(), step.status.clone());
        }
        tokio::select! {
            r = need.changed() => if r.is_err() { return },
            () = tokio::time::sleep_until(step.next) => {}
            () = stop.triggered() => return,
        }
    }
}

async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

fn held(s: &Status) -> bool {
    matches!(s, Status::Held { .. })
}

fn deferred(s: &Status) -> bool {
    matches!(s, Status::Deferred { .. })
}

/// Twenty of a hundred Nodes see a fault in the same instant.
async fn wave() -> ClaimantFleet {
    let mut fleet = ClaimantFleet::new(100, "10%");
    for i in 0..20 {
        fleet.start(&node(i), true);
    }
    settle(Duration::from_secs(10)).await;
    fleet
}

#[tokio::test(start_paused = true)]
async fn a_simultaneous_wave_taints_exactly_the_budget_and_never_more() {
    let fleet = wave().await;
    assert_eq!(fleet.tainted().len(), 10);
    assert_eq!(fleet.peak(), 10, "the bound held at every moment");
    assert_eq!(fleet.store.peak_slots(), 10);
    assert_eq!(fleet.count(held), 10);
    assert_eq!(fleet.count(deferred), 10);
    // Still so a few renewals later...
    settle(Duration::from_secs(120)).await;
    assert_eq!(fleet.tainted().len(), 10);
    assert_eq!(fleet.peak(), 10);
    // ...and every deferred Node, having looked again, names the ten holders.
    let holders: BTreeSet<String> = fleet.tainted();
    for i in 0..20 {
        if let Some(Status::Deferred { slots, holders: h }) = fleet.status(&node(i)) {
            assert_eq!(slots, 10);
            assert_eq!(h.iter().cloned().collect::<BTreeSet<_>>(), holders);
        }
    }
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_cleared_holder_hands_its_slot_to_a_deferred_node_within_a_minute() {
    let fleet = wave().await;
    let before = fleet.tainted();
    let holder = before.iter().next().unwrap().clone();
    fleet.clear(&holder);
    let t0 = Instant::now();
    loop {
        settle(Duration::from_secs(1)).await;
        let now = fleet.tainted();
        if now.len() == 10 && !now.contains(&holder) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no deferred Node took the slot"
        );
    }
    assert_eq!(fleet.status(&holder), Some(Status::Idle));
    assert_eq!(fleet.peak(), 10);
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_node_was_deleted_frees_its_slot_within_a_minute() {
    let mut fleet = wave().await;
    let holder = fleet.tainted().into_iter().next().unwrap();
    fleet.kill(&holder).await;
    fleet.store.delete_node(&holder);
    // Its Node is gone, and its taint with it.
    fleet.board.lock().unwrap().tainted.remove(&holder);
    let t0 = Instant::now();
    while fleet.tainted().len() < 10 {
        settle(Duration::from_secs(1)).await;
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the slot of a deleted Node was not taken"
        );
    }
    assert!(fleet.store.slots().iter().all(|s| s.holder != holder));
    assert_eq!(fleet.peak(), 10);
    fleet.stop_all().await;
}

/// A holder killed for good (OOM, a crash loop) leaves its fault taint on
/// its Node: that Node still counts against the budget, so its slot is not
/// handed on however long its Lease goes unrenewed.
#[tokio::test(start_paused = true)]
async fn a_killed_holder_whose_node_keeps_the_taint_keeps_its_slot() {
    let mut fleet = wave().await;
    let holder = fleet.tainted().into_iter().next().unwrap();
    let gets_before = fleet.store.requests.node_gets.load(Ordering::Relaxed);
    fleet.kill(&holder).await;
    settle(LEASE * 5).await;
    assert!(
        fleet.store.slots().iter().any(|s| s.holder == holder),
        "the dead holder's tainted Node lost its slot"
    );
    assert_eq!(fleet.tainted().len(), 10, "{:?}", fleet.tainted());
    assert_eq!(fleet.peak(), 10, "never an eleventh taint");
    assert_eq!(fleet.store.peak_slots(), 10);
    // Ten deferred Nodes look the dead holder's Node up about once per lease
    // duration each, not on every claim round.
    let gets = fleet.store.requests.node_gets.load(Ordering::Relaxed) - gets_before;
    assert!(gets <= 10 * 6, "{gets} Node reads in five lease durations");
    fleet.stop_all().await;
}

/// An operator takes the taint off a dead agent's Node (`gpuwatch
/// node-cleanup`): its slot frees once the Lease has gone a whole lease
/// duration without renewal, and a deferred Node takes it.
#[tokio::test(start_paused = true)]
async fn a_dead_holder_whose_taint_was_removed_frees_its_slot_after_the_lease_duration() {
    let mut fleet = wave().await;
    let holder = fleet.tainted().into_iter().next().unwrap();
    fleet.kill(&holder).await;
    settle(LEASE * 2).await;
    fleet.board.lock().unwrap().tainted.remove(&holder);
    fleet.store.set_tainted(&holder, false);
    let t0 = Instant::now();
    loop {
        settle(Duration::from_secs(1)).await;
        if fleet.store.slots().iter().all(|s| s.holder != holder) && fleet.tainted().len() == 10 {
            break;
        }
        assert!(t0.elapsed() < LEASE * 2, "the freed slot was not taken");
    }
    assert_eq!(fleet.peak(), 10);
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_adopts_its_own_slot() {
    let mut fleet = wave().await;
    let holder = fleet.tainted().into_iter().next().unwrap();
    let slot_before: Vec<u32> = fleet
        .store
        .slots()
        .iter()
        .filter(|s| s.holder == holder)
        .map(|s| s.index)
        .collect();
    fleet.kill(&holder).await;
    // Dead for longer than its lease: its tainted Node keeps the slot.
    settle(LEASE * 3).await;
    fleet.start(&holder, true);
    settle(Duration::from_secs(5)).await;
    assert!(
        matches!(fleet.status(&holder), Some(Status::Held { slot, .. }) if slot_before == [slot])
    );
    assert_eq!(
        fleet.store.slots().len(),
        10,
        "no second slot for the same Node"
    );
    assert_eq!(fleet.tainted().len(), 10);
    assert_eq!(fleet.peak(), 10);
    fleet.stop_all().await;
}

/// The errors last half a lease duration: a claim unanswered for a whole one
/// fails open by design (an eleventh taint, asserted on its own in
/// `a_claim_unanswered_for_a_lease_duration_fails_open`), and three hundred
/// scripted answers can last longer than that once most agents are deferred
/// and ask only every 15 to 30 s.
#[tokio::test(start_paused = true)]
async fn api_errors_during_the_claims_never_pass_the_budget() {
    let mut fleet = ClaimantFleet::new(100, "10%");
    // Every kind of failure the API server and the network produce, one
    // request in three, answered to whoever asks next.
    fleet.store.script((0..300).map(|i| {
        match (i % 3, i / 3 % 6) {
            (0 | 1, _) => Answer::Normal,
            (_, 0) => Answer::Fail(ApiError::Conflict("the object has been modified".into())),
            // A lone 422 is followed by normal answers here; a refusal
            // that repeats is the budget failing open (tested below).
            (_, 1) => Answer::Fail(ApiError::Transient(
                "etcdserver: request timed out (500 InternalError)".into(),
            )),
            (_, 2) => Answer::Fail(ApiError::Throttled {
                message: "Too many requests".into(),
                retry_after: Duration::from_secs(1),
            }),
            (_, 3) => Answer::Fail(ApiError::Transient("500 Internal Server Error".into())),
            (_, 4) => Answer::Lost,
            _ => Answer::Fail(ApiError::AlreadyExists("already exists".into())),
        }
    }));
    for i in 0..30 {
        fleet.start(&node(i), true);
    }
    settle(LEASE / 2).await;
    fleet.store.end_script();
    settle(Duration::from_secs(120) - LEASE / 2).await;
    assert_eq!(fleet.peak(), 10);
    assert_eq!(fleet.tainted().len(), 10);
    assert_eq!(fleet.store.peak_slots(), 10);
    // A dropped answer left no Node with two slots.
    let holders: Vec<String> = fleet.store.slots().into_iter().map(|s| s.holder).collect();
    let distinct: BTreeSet<&String> = holders.iter().collect();
    assert_eq!(distinct.len(), holders.len());
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_create_whose_answer_was_lost_is_adopted() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    let mut c = Claimant::new(store.clone(), settings("gpu-node-001", "10%"));
    // The list is answered; the create of slot 0 takes effect but its answer
    // is lost.
    store.script([Answer::Normal, Answer::Lost]);
    let first = c.step(true).await;
    assert_ne!(first.status.permits_taint(), Some(true));
    let mut st = first;
    for _ in 0..10 {
        tokio::time::sleep_until(st.next).await;
        st = c.step(true).await;
        if matches!(st.status, Status::Held { .. }) {
            break;
        }
    }
    assert!(matches!(st.status, Status::Held { .. }), "{:?}", st.status);
    let slots = c.store().slots();
    assert_eq!(slots.len(), 1, "{slots:?}");
    assert_eq!(slots[0].holder, "gpu-node-001");
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_api_server_changes_nothing() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    let mut holder = Claimant::new(store.clone(), settings("gpu-node-000", "10%"));
    assert!(matches!(
        holder.step(true).await.status,
        Status::Held { .. }
    ));
    store.script((0..50).map(|_| Answer::Fail(ApiError::Transient("connection refused".into()))));
    let mut newcomer = Claimant::new(store.clone(), settings("gpu-node-001", "10%"));
    let s = newcomer.step(true).await;
    assert_eq!(s.status, Status::Pending);
    assert_eq!(
        s.status.permits_taint(),
        None,
        "no taint added, none removed"
    );
    tokio::time::advance(LEASE).await;
    let h = holder.step(true).await;
    assert!(
        matches!(h.status, Status::Held { .. }),
        "a holder keeps its slot"
    );
}

#[tokio::test(start_paused = true)]
async fn claimants_past_the_floor_wait_for_the_fleet_count() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..100).map(node)));
    // The first claimant's list and its create of slot 0 are answered, its
    // fleet count fails: slot 0's holder has no count to write.
    store.script([
        Answer::Normal,
        Answer::Normal,
        Answer::Fail(ApiError::Transient("500".into())),
    ]);
    let mut agents: Vec<Claimant<Arc<MemoryLeaseStore>>> = (0..5)
        .map(|i| Claimant::new(store.clone(), settings(&node(i), "10%")))
        .collect();
    let mut held_now = 0;
    for a in &mut agents {
        if matches!(a.step(true).await.status, Status::Held { .. }) {
            held_now += 1;
        }
    }
    assert!(
        held_now <= 2,
        "only the floor's slots before a count: {held_now}"
    );
    // Once slot 0 carries the count, the others get the budget's slots.
    for _ in 0..20 {
        tokio::time::advance(Duration::from_secs(3)).await;
        for a in &mut agents {
            a.step(true).await;
        }
    }
    let slot0 = store.slots().into_iter().find(|s| s.index == 0).unwrap();
    assert_eq!(slot0.fleet_nodes, Some(100));
    assert_eq!(
        agents
            .iter()
            .filter(|a| matches!(a.status(), Status::Held { .. }))
            .count(),
        5
    );
}

#[tokio::test(start_paused = true)]
async fn an_off_budget_permits_the_taint_without_asking() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    let mut c = Claimant::new(store.clone(), settings("gpu-node-000", "off"));
    assert_eq!(c.step(true).await.status, Status::Off);
    assert_eq!(Status::Off.permits_taint(), Some(true));
    assert_eq!(store.requests.total(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_count_budget_is_the_count_whatever_the_fleet() {
    let mut fleet = ClaimantFleet::new(100, "3");
    for i in 0..8 {
        fleet.start(&node(i), true);
    }
    settle(Duration::from_secs(10)).await;
    assert_eq!(fleet.tainted().len(), 3);
    assert_eq!(fleet.peak(), 3);
    fleet.stop_all().await;
}

/// Requests per second of simulated time, by kind, between two snapshots.
fn rates(before: &[u64; 6], after: &[u64; 6], secs: f64) -> [f64; 6] {
    let mut out = [0.0; 6];
    for i in 0..6 {
        out[i] = (after[i] - before[i]) as f64 / secs;
    }
    out
}

fn snapshot(r: &Requests) -> [u64; 6] {
    use std::sync::atomic::Ordering::Relaxed;
    [
        r.lists.load(Relaxed),
        r.creates.load(Relaxed),
        r.replaces.load(Relaxed),
        r.deletes.load(Relaxed),
        r.node_gets.load(Relaxed),
        r.node_lists.load(Relaxed),
    ]
}

/// What the budget costs the API server at 5,000 GPU Nodes (budget 10 %, 500
/// slots): `faulty` Nodes have a fault at once; the first minute is the wave,
/// the next nine the steady state. Only faulty Nodes send anything (a healthy
/// Node needs no slot and asks nothing). Prints the rates per second.
async fn fleet_cost(faulty: usize) -> ([f64; 6], [f64; 6], usize) {
    const NODES: usize = 5000;
    let mut fleet = ClaimantFleet::new(NODES, "10%");
    for i in 0..faulty {
        fleet.start(&node(i), true);
    }
    let s0 = snapshot(&fleet.store.requests);
    settle(Duration::from_secs(60)).await;
    let s1 = snapshot(&fleet.store.requests);
    settle(Duration::from_secs(540)).await;
    let s2 = snapshot(&fleet.store.requests);
    let wave = rates(&s0, &s1, 60.0);
    let steady = rates(&s1, &s2, 540.0);
    let held = fleet.count(held);
    let line = |r: &[f64; 6]| {
        format!(
            "lease lists {:.1}/s, claims (creates) {:.1}/s, renewals+takeovers {:.1}/s, releases {:.1}/s, node gets {:.2}/s, node list pages {:.3}/s",
            r[0], r[1], r[2], r[3], r[4], r[5]
        )
    };
    eprintln!("fleet budget cost, {NODES} nodes, {faulty} with a fault ({held} hold a slot):");
    eprintln!("  first minute: {}", line(&wave));
    eprintln!("  steady state: {}", line(&steady));
    assert!(fleet.peak() <= 500, "peak {}", fleet.peak());
    fleet.stop_all().await;
    (wave, steady, held)
}

#[tokio::test(start_paused = true)]
async fn fleet_cost_at_5000_nodes_with_one_percent_quarantined() {
    let (_, steady, held) = fleet_cost(50).await;
    assert_eq!(held, 50);
    // Renewals: one per holder per third of the lease duration (20 s).
    assert!((steady[2] - 50.0 / 20.0).abs() < 0.5, "{steady:?}");
    // Nobody is deferred: no lists in the steady state.
    assert!(steady[0] < 0.1, "{steady:?}");
}

#[tokio::test(start_paused = true)]
async fn fleet_cost_at_5000_nodes_with_ten_percent_quarantined_and_a_wave_past_it() {
    // 500 hold every slot; a further 500 are deferred.
    let (_, steady, held) = fleet_cost(1000).await;
    assert_eq!(held, 500);
    assert!((steady[2] - 500.0 / 20.0).abs() < 3.0, "{steady:?}");
    // Deferred Nodes look again every 15–45 s: at most 500 / 7.5 lists a second.
    assert!(steady[0] < 500.0 / 7.5, "{steady:?}");
}

/// Steps `c` at its own pace until `done` holds or `limit` passes.
async fn step_until(
    c: &mut Claimant<Arc<MemoryLeaseStore>>,
    need: bool,
    limit: Duration,
    done: impl Fn(&Status) -> bool,
) -> Status {
    let t0 = Instant::now();
    loop {
        let st = c.step(need).await;
        if done(&st.status) || t0.elapsed() >= limit {
            return st.status;
        }
        tokio::time::sleep_until(st.next.min(Instant::now() + Duration::from_secs(5))).await;
    }
}

fn unavailable(s: &Status) -> bool {
    matches!(s, Status::Unavailable { .. })
}

/// Every Lease request answered 403 (a Role without `leases`): the budget
/// is unavailable within seconds, says so with the API's answer and the
/// rule to add, and permits the fault taint; once allowed, a slot is taken.
#[tokio::test(start_paused = true)]
async fn a_role_without_leases_fails_open_and_says_what_is_missing() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    for verb in ["get", "list", "create", "update", "delete"] {
        store.deny(verb, "leases", true);
    }
    let mut c = Claimant::new(store.clone(), settings("gpu-node-000", "10%"));
    let t0 = Instant::now();
    let st = step_until(&mut c, true, Duration::from_secs(60), unavailable).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let Status::Unavailable { refused, message } = &st else {
        panic!("{st:?}");
    };
    assert!(*refused);
    assert!(
        message.contains(
            "RBAC denies get leases, list leases, create leases, update leases, delete leases"
        ),
        "{message}"
    );
    assert!(
        message.contains("leases (coordination.k8s.io): get, list, create, update, delete"),
        "{message}"
    );
    assert!(message.contains("\"gpuwatch\""), "{message}");
    assert_eq!(st.permits_taint(), Some(true), "fails open");
    // Still refused on every round after: still unavailable, now quoting the
    // API server's own 403.
    let st = c.step(true).await.status;
    let Status::Unavailable { message, .. } = &st else {
        panic!("{st:?}");
    };
    assert!(
        message.contains("cannot list resource \"leases\""),
        "{message}"
    );
    for verb in ["get", "list", "create", "update", "delete"] {
        store.deny(verb, "leases", false);
    }
    let st = step_until(&mut c, true, Duration::from_secs(60), |s| {
        matches!(s, Status::Held { .. })
    })
    .await;
    assert!(matches!(st, Status::Held { .. }), "{st:?}");
}

/// A Role that lacks one verb is found at start, before any fault; once
/// fixed, the idle agent notices without a fault.
#[tokio::test(start_paused = true)]
async fn the_startup_check_finds_a_missing_verb_before_any_fault() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    store.deny("delete", "leases", true);
    let mut c = Claimant::new(store.clone(), settings("gpu-node-000", "10%"));
    let st = c.step(false).await;
    let Status::Unavailable {
        refused: true,
        message,
    } = &st.status
    else {
        panic!("{:?}", st.status);
    };
    assert!(message.contains("RBAC denies delete leases"), "{message}");
    assert_eq!(store.requests.access_reviews.load(Ordering::Relaxed), 7);
    store.deny("delete", "leases", false);
    let st = step_until(&mut c, false, Duration::from_secs(120), |s| {
        *s == Status::Idle
    })
    .await;
    assert_eq!(st, Status::Idle);
}

/// A namespace that does not exist: a create is 404 (a list there is empty).
#[tokio::test(start_paused = true)]
async fn a_missing_namespace_fails_open() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    store.script((0..20).flat_map(|_| {
        [
            Answer::Normal,
            Answer::Fail(ApiError::NotFound(
                "namespaces \"gpuwatch\" not found (404 NotFound)".into(),
            )),
        ]
    }));
    let mut c = Claimant::new(store.clone(), settings("gpu-node-000", "10%"));
    let st = step_until(&mut c, true, Duration::from_secs(60), unavailable).await;
    let Status::Unavailable {
        refused: true,
        message,
    } = &st
    else {
        panic!("{st:?}");
    };
    assert!(
        message.contains("namespaces \"gpuwatch\" not found"),
        "{message}"
    );
}

/// One 422 (a webhook's hiccup) is retried, not taken for a broken setup.
#[tokio::test(start_paused = true)]
async fn a_single_refusal_is_retried() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    store.script([Answer::Fail(ApiError::Rejected(
        "admission webhook \"leases.example.com\" denied the request (422 Invalid)".into(),
    ))]);
    let mut c = Claimant::new(store.clone(), settings("gpu-node-000", "10%"));
    let first = c.step(true).await;
    assert_eq!(first.status, Status::Pending);
    tokio::time::sleep_until(first.next).await;
    assert!(matches!(c.step(true).await.status, Status::Held { .. }));
}

/// 5xx and 429 keep the claim pending with backoff; past a lease duration
/// without an answer the budget is unavailable and the taint goes on.
#[tokio::test(start_paused = true)]
async fn a_claim_unanswered_for_a_lease_duration_fails_open() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..10).map(node)));
    store.script((0..500).map(|i| {
        Answer::Fail(if i % 2 == 0 {
            ApiError::Transient("503 Service Unavailable".into())
        } else {
            ApiError::Throttled {
                message: "Too many requests".into(),
                retry_after: Duration::from_secs(1),
            }
        })
    }));
    let mut c = Claimant::new(store.clone(), settings("gpu-node-000", "10%"));
    let t0 = Instant::now();
    let first = c.step(true).await;
    assert_eq!(first.status, Status::Pending);
    assert_eq!(first.status.permits_taint(), None);
    let st = step_until(&mut c, true, LEASE * 3, unavailable).await;
    let took = t0.elapsed();
    assert!(
        took >= LEASE && took < LEASE + Duration::from_secs(35),
        "{took:?}"
    );
    let Status::Unavailable {
        refused: false,
        message,
    } = &st
    else {
        panic!("{st:?}");
    };
    assert!(message.contains("no answer for"), "{message}");
    assert_eq!(st.permits_taint(), Some(true));
    let lists = store.requests.lists.load(Ordering::Relaxed);
    assert!(
        (3..=30).contains(&lists),
        "{lists} claim rounds: retried with backoff"
    );
}

/// A claimant whose rounds all fail for two lease durations, every other one
/// with a 409: the API server answers, so the budget is not unavailable and
/// the Node takes no eleventh taint while ten others hold the budget (a 409
/// used to count as no answer: after a lease duration of 503s and 409s the
/// claimant failed open).
#[tokio::test(start_paused = true)]
async fn errors_the_api_server_answers_do_not_fail_the_budget_open() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..100).map(node)));
    for i in 0..10 {
        let mut holder = Claimant::new(store.clone(), settings(&node(i), "10"));
        assert!(held(&holder.step(true).await.status));
        store.set_tainted(&node(i), true);
    }
    store.script((0..100).map(|i| {
        Answer::Fail(if i % 2 == 0 {
            ApiError::Transient("503 Service Unavailable".into())
        } else {
            ApiError::Conflict("the object has been modified".into())
        })
    }));
    let mut c = Claimant::new(store.clone(), settings(&node(10), "10"));
    let st = step_until(&mut c, true, LEASE * 2, |s| s.permits_taint() == Some(true)).await;
    assert_eq!(st, Status::Pending, "an eleventh taint");
    assert!(store.requests.lists.load(Ordering::Relaxed) >= 20);
    store.end_script();
    let st = step_until(&mut c, true, LEASE, deferred).await;
    assert!(deferred(&st), "{st:?}");
}

/// A Node deferred by a spent budget whose claims then go unanswered for
/// three lease durations stays deferred: silence frees no slot.
#[tokio::test(start_paused = true)]
async fn a_deferred_claimant_stays_deferred_while_the_api_server_is_silent() {
    let store = Arc::new(MemoryLeaseStore::with_nodes((0..100).map(node)));
    for i in 0..10 {
        let mut holder = Claimant::new(store.clone(), settings(&node(i), "10"));
        assert!(held(&holder.step(true).await.status));
        store.set_tainted(&node(i), true);
    }
    let mut c = Claimant::new(store.clone(), settings(&node(10), "10"));
    assert!(deferred(&c.step(true).await.status));
    store.script(
        (0..200).map(|_| Answer::Fail(ApiError::Transient("503 Service Unavailable".into()))),
    );
    let lists = store.requests.lists.load(Ordering::Relaxed);
    let st = step_until(&mut c, true, LEASE * 3, |s| s.permits_taint() == Some(true)).await;
    assert!(deferred(&st), "an eleventh taint: {st:?}");
    assert!(store.requests.lists.load(Ordering::Relaxed) - lists >= 20);
}

/// Holders killed in the middle of a wave and after it (their Nodes keep
/// their taints), then restarted on the same Nodes: the fleet never carries
/// more fault taints than the budget, and each restarted agent holds its own
/// slot again.
#[tokio::test(start_paused = true)]
async fn holders_killed_during_and_after_a_wave_never_push_taints_past_the_budget() {
    let mut fleet = ClaimantFleet::new(100, "10%");
    for i in 0..20 {
        fleet.start(&node(i), true);
    }
    // Mid-wave: kill slot 0's holder (the one that counts the fleet) as
    // soon as its claim lands, and any other holder by then.
    let slot0 = loop {
        let holder = fleet.store.slots().into_iter().find(|s| s.index == 0);
        match holder {
            Some(s) if fleet.tainted().contains(&s.holder) => break s.holder,
            _ => settle(Duration::from_millis(5)).await,
        }
    };
    let mut early: Vec<String> = vec![slot0.clone()];
    early.extend(fleet.tainted().into_iter().filter(|n| *n != slot0).take(1));
    assert!(
        !early.is_empty() && fleet.tainted().len() < 10,
        "not mid-wave: {:?}",
        fleet.tainted()
    );
    for n in &early {
        fleet.kill(n).await;
    }
    settle(Duration::from_secs(10)).await;
    let late: Vec<String> = fleet
        .tainted()
        .into_iter()
        .filter(|n| !early.contains(n))
        .take(3)
        .collect();
    for n in &late {
        fleet.kill(n).await;
    }
    settle(LEASE * 4).await;
    assert_eq!(fleet.peak(), 10, "the bound held at every moment");
    assert_eq!(fleet.tainted().len(), 10);
    assert_eq!(fleet.store.peak_slots(), 10);
    for n in early.iter().chain(&late) {
        fleet.start(n, true);
    }
    settle(Duration::from_secs(30)).await;
    for n in early.iter().chain(&late) {
        assert!(
            matches!(fleet.status(n), Some(Status::Held { .. })),
            "{n}: {:?}",
            fleet.status(n)
        );
    }
    assert_eq!(fleet.peak(), 10);
    assert_eq!(fleet.store.slots().len(), 10, "no second slot for any Node");
    fleet.stop_all().await;
}
