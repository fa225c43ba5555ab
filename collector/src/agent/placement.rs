//! Which pods hold which GPUs: the agent's two placement sources, decided,
//! started and stopped together.
//!
//! - the listing of the pods bound to this Node (list and watch on the API
//!   server, [`gpuwatch_kube::PodListing`]), on the Kubernetes client the
//!   node writer shares; it runs when `[kube]` is enabled and the run is no
//!   `--kube-dry-run`;
//! - the kubelet's PodResources poller
//!   ([`podresources::poll`]), when `[kubelet] pod_resources_socket` is set.
//!
//! Both feed the engine, so together they are one of the agent's inputs: they
//! stop with the other sources, before the engine drains. [`PlacementPlan`]
//! decides which run before anything starts and makes the wake-ups the
//! engine asks them with for a fresh listing; a source that will not run
//! gets none, so no fault record waits for it. [`PlacementPlan::start`]
//! starts them as [`PlacementSources`].

use super::{Prepared, RunError, StillRunning, StopBudget};
use crate::attribution::podresources::{self, KubeletSettings};
use crate::input::InputContext;
use crossbeam_channel::Sender;
use gpuwatch_core::engine::{Ask, PlacementAsks};
use gpuwatch_core::heartbeat::Watched;
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_core::{Registry, Shutdown};
use gpuwatch_kube::{KubeClient, KubeSettings, PlacementCallback, PodListing};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// Stop budget of each source (a request in flight is abandoned then).
const SOURCE_STOP: Duration = Duration::from_secs(1);

/// The pod listing, planned: where it lists from and its wake-up.
#[derive(Debug)]
struct PodsPlan {
    client: KubeClient,
    settings: KubeSettings,
    node_name: String,
    ask: Arc<Notify>,
}

/// The kubelet poller, planned: its settings and its wake-up.
#[derive(Debug)]
struct DevicesPlan {
    settings: KubeletSettings,
    ask: Arc<Notify>,
}

/// The placement sources that will run (module doc), not started yet.
#[derive(Debug)]
pub(super) struct PlacementPlan {
    pods: Option<PodsPlan>,
    devices: Option<DevicesPlan>,
}

impl PlacementPlan {
    /// The pods are listed through `client` (the node writer's; `None` when
    /// the writer does not run) when `[kube]` is enabled and `client` is not
    /// a dry run's; the kubelet is asked when its socket is set.
    pub(super) fn new(prepared: &Prepared, client: Option<&KubeClient>) -> PlacementPlan {
        let pods = client
            .filter(|c| prepared.kube().enabled() && !c.is_dry_run())
            .map(|c| PodsPlan {
                client: c.clone(),
                settings: prepared.kube().clone(),
                node_name: prepared.node_name().to_owned(),
                ask: Arc::default(),
            });
        let kubelet = prepared.kubelet();
        let devices = (!kubelet.socket.as_os_str().is_empty()).then(|| DevicesPlan {
            settings: kubelet.clone(),
            ask: Arc::default(),
        });
        PlacementPlan { pods, devices }
    }

    /// What the engine asks the sources with: a wake-up for each source
    /// that will run.
    pub(super) fn asks(&self) -> PlacementAsks {
        let wake = |n: &Arc<Notify>| -> Ask {
            let n = n.clone();
            Arc::new(move || n.notify_one())
        };
        PlacementAsks {
            pods: self.pods.as_ref().map(|p| wake(&p.ask)),
            devices: self.devices.as_ref().map(|d| wake(&d.ask)),
        }
    }

    /// Starts the planned sources on `rt` with `ctx`: the kubelet poller
    /// takes it whole, the pod listing feeds the engine through its channel.
    /// [`PlacementSources::stop`] triggers its shutdown.
    pub(super) fn start(
        self,
        rt: &tokio::runtime::Runtime,
        ctx: InputContext,
        registry: &Arc<Registry>,
    ) -> Result<PlacementSources, RunError> {
        let shutdown = ctx.shutdown().clone();
        let devices = self.devices.map(|d| {
            let watched = ctx.watched(MonitorInput::PodResources, d.settings.stall_deadline());
            let task = rt.spawn(podresources::poll(
                d.settings,
                registry.clone(),
                d.ask,
                ctx.clone(),
            ));
            KubeletPoller {
                task,
                watched: Some(watched),
            }
        });
        // The listing holds the engine's sender weakly, as the writer holds
        // its own: dropping this one at the stop lets the engine's channel
        // drain even while a listing task is still winding down.
        let engine = Arc::new(ctx.out().clone());
        drop(ctx);
        let pods = match self.pods {
            Some(p) => PodListing::start(
                &p.client,
                &p.settings,
                &p.node_name,
                forward_pods(Arc::downgrade(&engine)),
                p.ask,
                &shutdown,
                rt.handle(),
            )
            .map_err(RunError::Kube)?,
            None => None,
        };
        Ok(PlacementSources {
            shutdown,
            engine,
            pods,
            devices,
        })
    }
}

/// Hands every pod listing to the engine while its sender lives.
fn forward_pods(engine: Weak<Sender<Input>>) -> PlacementCallback {
    Arc::new(move |update| {
        let Some(tx) = engine.upgrade() else {
            return;
        };
        if let Err(e) = tx.try_send(Input::Placement(update)) {
            tracing::debug!(error = %e, "Pod listing not handed to the engine.");
        }
    })
}

/// The kubelet PodResources poller task.
#[derive(Debug)]
struct KubeletPoller {
    task: tokio::task::JoinHandle<()>,
    /// Its heartbeat, until the watchdog takes it.
    watched: Option<Watched>,
}

/// The running placement sources (module doc).
#[derive(Debug)]
pub(super) struct PlacementSources {
    /// Stops the kubelet poller and the pod listing.
    shutdown: Shutdown,
    /// The sender the pod listing holds weakly.
    engine: Arc<Sender<Input>>,
    pods: Option<PodListing>,
    devices: Option<KubeletPoller>,
}

impl PlacementSources {
    /// The sources' heartbeats, for the input watchdog (taken once).
    pub(super) fn take_watched(&mut self) -> Vec<Watched> {
        let pods = self.pods.as_ref().map(PodListing::watched);
        let devices = self.devices.as_mut().and_then(|d| d.watched.take());
        pods.into_iter().chain(devices).collect()
    }

    /// Tells both sources to stop and waits for each within its share; a
    /// pod listing still busy then is aborted, a kubelet call left behind.
    pub(super) fn stop(
        self,
        budget: &StopBudget,
        rt: &tokio::runtime::Runtime,
        left: &mut StillRunning,
    ) {
        drop(self.engine);
        self.shutdown.trigger();
        if let Some(pods) = self.pods
            && !rt.block_on(pods.stop_within(budget.share(SOURCE_STOP)))
        {
            left.push("pod listing");
        }
        if let Some(d) = self.devices {
            let limit = budget.share(SOURCE_STOP);
            if rt
                .block_on(async { tokio::time::timeout(limit, d.task).await })
                .is_err()
            {
                left.push("kubelet PodResources");
            }
        }
    }

    /// Whether the pod listing and the kubelet poller run.
    #[cfg(test)]
    fn running(&self) -> (bool, bool) {
        (self.pods.is_some(), self.devices.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RunOptions, prepare, resolve};
    use super::*;
    use gpuwatch_core::placement::PlacementUpdate;
    use gpuwatch_test_support::kube::{ApiDouble, build};
    use gpuwatch_test_support::kubelet::Kubelet;
    use std::time::Instant;

    const NODE: &str = "placement-node";

    /// The settings a run reads: `[kube]` pointing at `api` (enabled or
    /// not), `[kubelet]` at `socket` ("" for none).
    fn prepared(api: &ApiDouble, kube: bool, socket: &std::path::Path) -> Prepared {
        let node = crate::Overrides {
            node_name: Some(NODE.into()),
            ..crate::Overrides::default()
        };
        let mut cfg = resolve(None, &node).unwrap();
        cfg.kube = api.kube_config();
        cfg.kube.enabled = kube;
        cfg.kubelet.pod_resources_socket = socket.to_path_buf();
        prepare(cfg).unwrap()
    }

    /// What reached the engine within `wait`, until `done` says enough.
    fn collect(
        rx: &crossbeam_channel::Receiver<Input>,
        wait: Duration,
        done: impl Fn(&[PlacementUpdate]) -> bool,
    ) -> Vec<PlacementUpdate> {
        let end = Instant::now() + wait;
        let mut seen = Vec::new();
        while !done(&seen) {
            match rx.recv_deadline(end) {
                Ok(Input::Placement(u)) => seen.push(u),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        seen
    }

    fn listed_pod(seen: &[PlacementUpdate]) -> bool {
        seen.iter().any(
            |u| matches!(u, PlacementUpdate::Pods(d) if d.by_uid.get("u-1").is_some_and(|p| p.name == "trainer-0")),
        )
    }

    fn devices_answered(seen: &[PlacementUpdate]) -> bool {
        seen.iter()
            .any(|u| matches!(u, PlacementUpdate::DevicesCurrent(_)))
    }

    /// Pod lists the double has answered.
    fn pod_lists(api: &ApiDouble) -> usize {
        api.requests()
            .iter()
            .filter(|r| r.resource == "pods" && r.verb == "list")
            .count()
    }

    /// The engine's asks wake the running sources (`want`: pods, devices): a
    /// fresh pod list, one more kubelet call (its interval is 10 s), each
    /// reported current after the ask.
    fn assert_asks_wake_the_sources(
        api: &ApiDouble,
        kubelet: &Kubelet,
        asks: &PlacementAsks,
        rx: &crossbeam_channel::Receiver<Input>,
        want: (bool, bool),
        case: &str,
    ) {
        let lists = pod_lists(api);
        let calls = kubelet.list_calls();
        let asked_at = Instant::now();
        for ask in [&asks.pods, &asks.devices].into_iter().flatten() {
            ask();
        }
        let seen = collect(rx, Duration::from_secs(5), |s| {
            let current = |f: fn(&PlacementUpdate) -> Option<Instant>| {
                s.iter().filter_map(f).any(|t| t >= asked_at)
            };
            (!want.0
                || current(|u| match u {
                    PlacementUpdate::PodsCurrent(t) => Some(*t),
                    _ => None,
                }))
                && (!want.1
                    || current(|u| match u {
                        PlacementUpdate::DevicesCurrent(t) => Some(*t),
                        _ => None,
                    }))
        });
        if want.0 {
            assert!(
                pod_lists(api) > lists,
                "{case}: the ask sent no list: {seen:?}"
            );
        }
        if want.1 {
            assert!(kubelet.list_calls() > calls, "{case}: the ask made no call");
        }
    }

    /// Stopped, no source holds an engine sender any more: the channel drains
    /// and disconnects.
    fn assert_stopped_sources_hold_no_sender(
        sources: PlacementSources,
        rt: &tokio::runtime::Runtime,
        rx: &crossbeam_channel::Receiver<Input>,
        case: &str,
    ) {
        let mut left = Vec::new();
        sources.stop(&StopBudget::new(Duration::from_secs(5)), rt, &mut left);
        assert!(left.is_empty(), "{case}: {left:?}");
        while rx.try_recv().is_ok() {}
        assert!(
            matches!(
                rx.recv_timeout(Duration::from_secs(1)),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected)
            ),
            "{case}: an engine sender is still held"
        );
    }

    /// Which sources start follows `[kube]`, `--kube-dry-run` and the
    /// kubelet socket; each running source reaches the engine, is woken by
    /// the engine's ask, and holds no engine sender once stopped.
    #[test]
    fn the_settings_decide_which_sources_run_and_the_engine_asks_each() {
        let rt = super::super::runtime().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let api = rt.block_on(ApiDouble::start(build::node(NODE, vec![], &[])));
        api.put_pod(&build::pod_on(
            NODE,
            "ml",
            "trainer-0",
            "u-1",
            &[("main", "c1")],
        ));
        let kubelet = rt.block_on(Kubelet::start(dir.path()));
        let none = std::path::Path::new("");
        // ([kube] enabled, --kube-dry-run, socket) → (pods listed, kubelet asked)
        let cases = [
            (false, false, none, (false, false)),
            (true, false, none, (true, false)),
            (true, true, kubelet.socket.as_path(), (false, true)),
            (false, true, none, (false, false)),
            (true, false, kubelet.socket.as_path(), (true, true)),
        ];
        for (kube, dry_run, socket, want) in cases {
            let case = format!("[kube] enabled {kube}, dry run {dry_run}, socket {socket:?}");
            let prepared = prepared(&api, kube, socket);
            let opts = RunOptions {
                kube_dry_run: dry_run,
            };
            let client = prepared.kube_client(&opts, &rt).unwrap();
            assert_eq!(
                client.is_some(),
                kube || dry_run,
                "{case}: the writer's client"
            );
            let plan = PlacementPlan::new(&prepared, client.as_ref());
            let asks = plan.asks();
            assert_eq!(
                (asks.pods.is_some(), asks.devices.is_some()),
                want,
                "{case}"
            );
            let (tx, rx) = crossbeam_channel::unbounded();
            let ctx = InputContext::new(Shutdown::new(), tx);
            let sources = plan.start(&rt, ctx, &Registry::new()).unwrap();
            assert_eq!(sources.running(), want, "{case}");
            let seen = collect(&rx, Duration::from_secs(5), |s| {
                (!want.0 || listed_pod(s)) && (!want.1 || devices_answered(s))
            });
            assert_eq!(listed_pod(&seen), want.0, "{case}: {seen:?}");
            assert_eq!(devices_answered(&seen), want.1, "{case}: {seen:?}");
            assert_asks_wake_the_sources(&api, &kubelet, &asks, &rx, want, &case);
            assert_stopped_sources_hold_no_sender(sources, &rt, &rx, &case);
        }
        kubelet.stop();
    }
}
