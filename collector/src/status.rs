//! The agent's status, composed in one place from its three publishers:
//! the threads' flags and heartbeats ([`Liveness`]), the health the engine
//! published last with every input's monitor status ([`Registry`]), and the
//! Kubernetes writer's status (the [`KubeStatus`] watch). Each fact has one
//! publisher: what an input says about itself (the kernel log readable, read
//! to its end) is in the engine's monitor status only, and readiness reads
//! it there. The local API's `/healthz`, `/readyz` and `/v1/health` each
//! read one view of [`AgentStatus`] and only turn it into JSON.

use crate::liveness::{Liveness, LivenessStatus};
use gpuwatch_core::Registry;
use gpuwatch_core::heartbeat::Progress;
use gpuwatch_core::msg::MonitorInput;
use gpuwatch_kube::KubeStatus;
use gpuwatch_proto::{InputState, NodeHealth};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// Where the agent's status is read from (module doc). Clones share it.
#[derive(Clone)]
pub struct AgentStatus {
    registry: Arc<Registry>,
    kube: tokio::sync::watch::Receiver<KubeStatus>,
    liveness: Arc<Liveness>,
    /// The heartbeats of the inputs the input watchdog holds (the NIC
    /// poller, the placement sources, the Node writer); the kernel-log
    /// reader's and NVML's are read from `liveness`, where they register
    /// when they start.
    watched: Vec<(MonitorInput, Arc<Progress>)>,
}

impl std::fmt::Debug for AgentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentStatus")
            .field("liveness", &self.liveness)
            .finish_non_exhaustive()
    }
}

/// Where the kernel-log reader stands, as the engine's monitor status says
/// (the `kmsg` input's state and `kmsg_caught_up`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KmsgProgress {
    /// The reader has not reported yet: the agent just started.
    NotReported,
    /// The reader reads the kernel log but has not read the ring to its end
    /// yet: faults logged before the agent started may still be unread.
    Reading,
    /// The reader read the ring (or the replay file) to its end once.
    CaughtUp,
    /// The reader reported that it cannot read the kernel log (open or read
    /// failed; e.g. the container's device cgroup denies `/dev/kmsg`).
    Unavailable,
}

impl KmsgProgress {
    /// The reader's progress in `health` (the engine's last publication).
    /// A reader that reported a failure is unavailable even if it caught up
    /// before: it cannot see new faults now.
    pub(crate) fn of(health: &NodeHealth) -> KmsgProgress {
        let Some(m) = health.monitor.as_ref() else {
            return KmsgProgress::NotReported;
        };
        let state = m
            .inputs
            .iter()
            .find(|i| i.input == MonitorInput::Kmsg.as_str())
            .map_or(InputState::NotReported, |i| i.state());
        match state {
            InputState::Down => KmsgProgress::Unavailable,
            _ if m.kmsg_caught_up => KmsgProgress::CaughtUp,
            InputState::Up => KmsgProgress::Reading,
            InputState::NotReported => KmsgProgress::NotReported,
        }
    }

    /// The name `/readyz` writes.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            KmsgProgress::NotReported => "not_reported",
            KmsgProgress::Reading => "reading",
            KmsgProgress::CaughtUp => "caught_up",
            KmsgProgress::Unavailable => "unavailable",
        }
    }
}

/// Why the agent is not ready (`/readyz` lists each that holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotReady {
    /// The engine or the kernel-log reader thread does not run.
    ThreadsNotRunning,
    /// The kernel-log reader has not reported yet (the agent just started).
    KmsgNotReported,
    /// The kernel-log reader has not read the ring to its end yet.
    KmsgNotCaughtUp,
    /// The Kubernetes writer's fleet quarantine budget cannot work (a Role
    /// without Leases).
    QuarantineBudgetUnavailable,
}

impl NotReady {
    /// What `/readyz` says for it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NotReady::ThreadsNotRunning => "engine or kernel log thread not running",
            NotReady::KmsgNotReported => "kernel log reader has not reported yet",
            NotReady::KmsgNotCaughtUp => "kernel log not caught up yet",
            NotReady::QuarantineBudgetUnavailable => "quarantine budget unavailable",
        }
    }
}

/// What `/readyz` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Readiness {
    /// The threads' flags at the moment of the read.
    pub(crate) liveness: LivenessStatus,
    /// The kernel-log reader's progress, from the engine's monitor status.
    pub(crate) kmsg: KmsgProgress,
    /// The Kubernetes writer's fleet quarantine budget cannot work (a Role
    /// without Leases).
    pub(crate) quarantine_budget_unavailable: bool,
}

impl Readiness {
    /// Why the agent is not ready; empty: ready. Ready needs the threads
    /// running (the engine loads its persisted state before its thread
    /// starts), the kernel-log reader caught up or reported unavailable, and
    /// a quarantine budget that works.
    ///
    /// An agent that cannot read the kernel log still serves NVML health and
    /// reports the kernel log input as down (the `kmsg` input down in
    /// `/v1/health`, `gpuwatch_monitor_up{input="kmsg"} 0`, verdict
    /// `unknown`); holding readiness back for it would only hide that
    /// report. A budget that cannot work fails readiness, so a DaemonSet
    /// rollout of a broken Role stops at its first nodes instead of reaching
    /// the fleet.
    pub(crate) fn not_ready(&self) -> Vec<NotReady> {
        let mut out = Vec::new();
        if !self.liveness.threads_running() {
            out.push(NotReady::ThreadsNotRunning);
        }
        match self.kmsg {
            KmsgProgress::NotReported => out.push(NotReady::KmsgNotReported),
            KmsgProgress::Reading => out.push(NotReady::KmsgNotCaughtUp),
            KmsgProgress::CaughtUp | KmsgProgress::Unavailable => {}
        }
        if self.quarantine_budget_unavailable {
            out.push(NotReady::QuarantineBudgetUnavailable);
        }
        out
    }

    /// Ready: nothing in [`Readiness::not_ready`].
    pub(crate) fn ready(&self) -> bool {
        self.not_ready().is_empty()
    }
}

impl AgentStatus {
    /// The status of an agent whose engine publishes to `registry`, whose
    /// Kubernetes writer publishes to `kube` (without a writer, a receiver
    /// of the default status) and whose threads report to `liveness`.
    pub fn new(
        registry: Arc<Registry>,
        kube: tokio::sync::watch::Receiver<KubeStatus>,
        liveness: Arc<Liveness>,
    ) -> AgentStatus {
        AgentStatus {
            registry,
            kube,
            liveness,
            watched: Vec::new(),
        }
    }

    /// Also reports the last progress of `watched` (the inputs the input
    /// watchdog holds) in `/v1/health`.
    pub(crate) fn with_watched(
        mut self,
        watched: Vec<(MonitorInput, Arc<Progress>)>,
    ) -> AgentStatus {
        self.watched = watched;
        self
    }

    /// `/healthz`: the threads' liveness at `now_unix_secs`.
    pub(crate) fn liveness(&self, now_unix_secs: u64) -> LivenessStatus {
        self.liveness.status(now_unix_secs)
    }

    /// `/readyz`: readiness at `now_unix_secs`.
    pub(crate) fn readiness(&self, now_unix_secs: u64) -> Readiness {
        Readiness {
            liveness: self.liveness.status(now_unix_secs),
            kmsg: KmsgProgress::of(&self.registry.health()),
            quarantine_budget_unavailable: self.kube.borrow().quarantine_unavailable,
        }
    }

    /// `/v1/health`: the health the engine published last, with each
    /// input's last progress (`last_progress_unix_ms`, read now from its
    /// heartbeat) and the Kubernetes writer's view beside it (the quarantine
    /// budget, the conditions it holds in their problem status and until
    /// when, the devices a DeviceTaintRule isolates instead of the Node
    /// taint, and why device isolation cannot work where it cannot).
    pub(crate) fn health(&self) -> Arc<NodeHealth> {
        let mut h = self.registry.health();
        let progress: Vec<_> = self
            .liveness
            .progress()
            .into_iter()
            .chain(self.watched.iter().cloned())
            .collect();
        if !progress.is_empty() && h.monitor.is_some() {
            let (now, now_unix_ms) = (Instant::now(), unix_ms(SystemTime::now()));
            let m = Arc::make_mut(&mut h)
                .monitor
                .as_mut()
                .expect("checked above");
            for i in &mut m.inputs {
                i.last_progress_unix_ms =
                    last_progress_unix_ms(&progress, &i.input, now, now_unix_ms);
            }
        }
        let kube = self.kube.borrow();
        if let Some(q) = &kube.quarantine {
            Arc::make_mut(&mut h).quarantine = Some(q.clone());
        }
        if !kube.condition_holds.is_empty() {
            Arc::make_mut(&mut h).condition_holds = kube.condition_holds.clone();
        }
        if !kube.isolated_devices.is_empty() {
            Arc::make_mut(&mut h).isolated_devices = kube.isolated_devices.clone();
        }
        if let Some(why) = &kube.device_isolation_unavailable {
            Arc::make_mut(&mut h).device_isolation_unavailable = why.clone();
        }
        h
    }
}

/// Milliseconds since the Unix epoch at `t`.
fn unix_ms(t: SystemTime) -> u64 {
    gpuwatch_core::clock::unix_nanos(t) / 1_000_000
}

/// The last progress of the input named `input` among `progress` in Unix
/// milliseconds, `now` being `now_unix_ms`: the staler beat of an input with
/// several heartbeats (NVML's poller and event source), so that one thread
/// stuck shows; 0 when it has none, or one of them has not started.
fn last_progress_unix_ms(
    progress: &[(MonitorInput, Arc<Progress>)],
    input: &str,
    now: Instant,
    now_unix_ms: u64,
) -> u64 {
    let mut beats = progress
        .iter()
        .filter(|(i, _)| i.as_str() == input)
        .map(|(_, p)| p.last_beat_at())
        .peekable();
    if beats.peek().is_none() {
        return 0;
    }
    let mut oldest = u64::MAX;
    for beat in beats {
        let Some(at) = beat else {
            return 0;
        };
        let ago = u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(u64::MAX);
        oldest = oldest.min(now_unix_ms.saturating_sub(ago));
    }
    oldest
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_core::msg::Input;
    use gpuwatch_test_support::engine::Rig;

    /// Readiness takes the kernel-log reader's reports from the health the
    /// engine published, and tells "not reported yet" (just started) from
    /// "reported down" by the input's typed state, not by a message.
    #[test]
    fn readiness_reads_the_kernel_log_from_the_engine_s_monitor_status() {
        let mut rig = Rig::new(None, "b1");
        let liveness = Liveness::new();
        let kube = gpuwatch_kube::KubeMetrics::new();
        let status = AgentStatus::new(rig.registry.clone(), kube.subscribe(), liveness.clone());
        let _engine = liveness.engine_running();
        let _kmsg = liveness.kmsg_running();
        let mut feed = |input: Input| {
            rig.engine.handle(input);
            rig.registry.set_health(rig.engine.health());
        };
        let kmsg = |ok: bool| Input::MonitorStatus {
            input: MonitorInput::Kmsg,
            ok,
            message: if ok {
                "reading /dev/kmsg"
            } else {
                "open /dev/kmsg: EPERM"
            }
            .into(),
        };
        let at = |status: &AgentStatus| {
            let r = status.readiness(0);
            (r.kmsg, r.not_ready())
        };

        // Nothing published yet, then the engine's first health: no report.
        assert_eq!(
            at(&status),
            (KmsgProgress::NotReported, vec![NotReady::KmsgNotReported])
        );
        feed(Input::Tick);
        assert_eq!(
            at(&status),
            (KmsgProgress::NotReported, vec![NotReady::KmsgNotReported])
        );
        assert_eq!(
            NotReady::KmsgNotReported.as_str(),
            "kernel log reader has not reported yet"
        );

        feed(kmsg(true));
        assert_eq!(
            at(&status),
            (KmsgProgress::Reading, vec![NotReady::KmsgNotCaughtUp])
        );
        assert_eq!(
            NotReady::KmsgNotCaughtUp.as_str(),
            "kernel log not caught up yet"
        );

        // Reported down: ready, the failure is reported instead.
        feed(kmsg(false));
        assert_eq!(at(&status), (KmsgProgress::Unavailable, vec![]));
        assert!(status.readiness(0).ready());

        feed(kmsg(true));
        assert_eq!(
            at(&status),
            (KmsgProgress::Reading, vec![NotReady::KmsgNotCaughtUp])
        );
        feed(Input::KmsgCaughtUp);
        assert_eq!(at(&status), (KmsgProgress::CaughtUp, vec![]));
        assert!(status.readiness(0).ready());

        // Down after the first pass: still ready, and it says so.
        feed(kmsg(false));
        assert_eq!(at(&status), (KmsgProgress::Unavailable, vec![]));

        kube.publish(|s| s.quarantine_unavailable = true);
        assert_eq!(
            status.readiness(0).not_ready(),
            vec![NotReady::QuarantineBudgetUnavailable]
        );
    }

    /// The threads' part of readiness: a thread that does not run is a
    /// reason of its own.
    #[test]
    fn threads_not_running_hold_readiness_back() {
        let rig = Rig::new(None, "b1");
        let liveness = Liveness::new();
        let kube = gpuwatch_kube::KubeMetrics::new();
        let status = AgentStatus::new(rig.registry.clone(), kube.subscribe(), liveness.clone());
        assert_eq!(
            status.readiness(0).not_ready(),
            vec![NotReady::ThreadsNotRunning, NotReady::KmsgNotReported]
        );
    }

    /// An input's last progress is its heartbeat's, in Unix milliseconds;
    /// of an input with several heartbeats, the staler one; 0 when it has
    /// none or one has not started.
    #[test]
    fn last_progress_is_the_staler_heartbeat_in_unix_ms() {
        use std::time::Duration;
        let t0 = Instant::now();
        let (poller, events, idle) = (Progress::new(), Progress::new(), Progress::new());
        poller.beat_at(t0 + Duration::from_secs(1));
        events.beat_at(t0 + Duration::from_secs(4));
        let now = t0 + Duration::from_secs(6);
        let now_unix_ms = 1_700_000_000_000;
        let nvml = [
            (MonitorInput::Nvml, poller.clone()),
            (MonitorInput::Nvml, events.clone()),
        ];
        let got = last_progress_unix_ms(&nvml, "nvml", now, now_unix_ms);
        // Five seconds before now (the beat is kept to the millisecond).
        assert!(
            (now_unix_ms - 5_001..=now_unix_ms - 4_999).contains(&got),
            "{got}"
        );
        assert_eq!(last_progress_unix_ms(&nvml, "kmsg", now, now_unix_ms), 0);
        let not_started = [(MonitorInput::Nvml, poller), (MonitorInput::Nvml, idle)];
        assert_eq!(
            last_progress_unix_ms(&not_started, "nvml", now, now_unix_ms),
            0
        );
    }

    /// `/v1/health` lists each input with its last progress: from the
    /// heartbeats `/healthz` watches (the kernel-log reader) and those of
    /// the input watchdog (the NIC poller); an input without a heartbeat
    /// (NVML here) says 0.
    #[test]
    fn v1_health_shows_how_stale_each_input_is() {
        use gpuwatch_core::heartbeat::Watched;
        let mut rig = Rig::new(None, "b1");
        for input in [
            MonitorInput::Kmsg,
            MonitorInput::Nvml,
            MonitorInput::Network,
        ] {
            rig.engine.handle(Input::MonitorStatus {
                input,
                ok: true,
                message: String::new(),
            });
        }
        rig.registry.set_health(rig.engine.health());
        let liveness = Liveness::new();
        let kmsg = Progress::new();
        liveness.watch(Watched::new(
            MonitorInput::Kmsg,
            kmsg.clone(),
            crate::liveness::PROGRESS_DEADLINE,
        ));
        let network = Progress::new();
        network.beat();
        let kube = gpuwatch_kube::KubeMetrics::new();
        let before = unix_ms(SystemTime::now());
        let status = AgentStatus::new(rig.registry.clone(), kube.subscribe(), liveness)
            .with_watched(vec![(MonitorInput::Network, network)]);
        let h = status.health();
        let m = h.monitor.as_ref().expect("a monitor status");
        let at = |input: &str| m.input(input).expect(input).last_progress_unix_ms;
        // Both beat at most a moment before `before` (1 s of slack).
        assert!(at("kmsg") + 1_000 >= before && at("kmsg") <= before + 1_000);
        assert!(at("network") + 1_000 >= before && at("network") <= before + 1_000);
        assert_eq!(at("nvml"), 0);
        let json = serde_json::to_value(&*h).unwrap();
        assert!(json["monitor"]["inputs"][0]["last_progress_unix_ms"].is_u64());
        assert_eq!(
            rig.registry.health().monitor.as_ref().unwrap().inputs[0].last_progress_unix_ms,
            0,
            "the engine's own publication is left as it is"
        );
    }
}
