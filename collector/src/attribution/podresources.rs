//! Which pods hold which GPUs: the kubelet's PodResources API (v1, `List`)
//! on its unix socket, asked every `interval_ms` and whenever the engine asks
//! (a fault of a GPU read after the last call waits for a fresh answer, at
//! most [`MIN_ASK_GAP`] apart), and handed to the health engine as
//! [`PlacementUpdate::Devices`] whenever the answer changes and
//! [`PlacementUpdate::DevicesCurrent`] after every answer, so a fault of a GPU
//! (XID 79, uncorrectable ECC, a lost GPU) names the pods that held it,
//! including one placed a moment before. Device ids are what the device plugin gave the kubelet, under the
//! resources `gpu_resources` names (`nvidia.com/gpu`, `nvidia.com/mig-*` and
//! any the device plugin's configuration renamed them to); their shapes
//! ([`DeviceShape`]: GPU UUIDs, replicas of a shared GPU, MIG UUIDs old and
//! new) are read into the GPU or MIG device they name, and an id of any other
//! shape is skipped and counted.
//!
//! The client is generated (in gpuwatch-proto) from the kubelet's own
//! `api.proto`, as is the server half the tests' kubelet stand-in is built
//! from. Each call
//! has its own timeout, and answers up to [`MAX_ANSWER_BYTES`] are read (a
//! node with many pods and devices exceeds tonic's 4 MiB default).
//!
//! A kubelet that cannot be asked (no socket: not a Kubernetes node, or the
//! socket not mounted; a timeout) blocks nothing: the engine is told, keeps
//! the last answer and says the pods on a GPU are unknown or may be stale.

use crate::input::InputContext;
use gpuwatch_core::heartbeat;
use gpuwatch_core::msg::Input;
use gpuwatch_core::placement::{
    DeviceHolder, DeviceHolders, DeviceShape, PlacementUpdate, is_gpu_resource,
};
use gpuwatch_core::registry::Tally;
use gpuwatch_proto::podresources as v1;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use v1::pod_resources_lister_client::PodResourcesListerClient;

/// The socket the kubelet serves PodResources on.
pub(crate) const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The largest `List` answer read, bytes.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// `[kubelet]`: where and how often the kubelet is asked.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct KubeletConfig {
    /// The PodResources socket. Empty: never asked (faults of a GPU name no
    /// pods). Default `/var/lib/kubelet/pod-resources/kubelet.sock`.
    pub pod_resources_socket: PathBuf,
    /// How often `List` is called, milliseconds. Default 10000.
    pub pod_resources_interval_ms: u64,
    /// The longest one call may take, milliseconds. Default 2000.
    pub pod_resources_timeout_ms: u64,
    /// The extended resources whose devices are GPUs or MIG devices: names,
    /// or prefixes ending in `*`. Default `nvidia.com/gpu`,
    /// `nvidia.com/mig-*`; add the names a device plugin configuration
    /// renames them to (`nvidia.com/gpu.shared`).
    pub gpu_resources: Vec<String>,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            pod_resources_socket: PathBuf::from(DEFAULT_SOCKET),
            pod_resources_interval_ms: 10_000,
            pod_resources_timeout_ms: 2_000,
            gpu_resources: vec!["nvidia.com/gpu".into(), "nvidia.com/mig-*".into()],
        }
    }
}

/// `[kubelet]` resolved ([`KubeletConfig::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletSettings {
    /// The PodResources socket; empty: never asked.
    pub socket: PathBuf,
    /// Pause between two `List` calls.
    pub interval: Duration,
    /// The longest one call may take.
    pub timeout: Duration,
    /// Resource names (or `*` prefixes) whose devices are GPUs or MIG devices.
    pub gpu_resources: Vec<String>,
}

impl KubeletSettings {
    /// How long the poller may make no progress before it counts as stuck:
    /// three intervals plus a call's timeout (it beats at every call's start
    /// and end, and sleeps an interval in between), at least 30 s.
    pub(crate) fn stall_deadline(&self) -> Duration {
        heartbeat::deadline(self.interval, 3, Duration::from_secs(30)) + self.timeout
    }
}

impl KubeletConfig {
    /// Checks the settings and types them in one pass: the settings, or
    /// every problem (keys relative to `[kubelet]`).
    pub(crate) fn resolve(&self) -> Result<KubeletSettings, Vec<String>> {
        let mut p = Vec::new();
        // A few calls a second at most.
        if self.pod_resources_interval_ms < 500 {
            p.push(format!(
                "pod_resources_interval_ms: at least 500, got {}",
                self.pod_resources_interval_ms
            ));
        }
        if self.pod_resources_timeout_ms == 0 {
            p.push("pod_resources_timeout_ms: must be above 0".into());
        }
        if !p.is_empty() {
            return Err(p);
        }
        Ok(KubeletSettings {
            socket: self.pod_resources_socket.clone(),
            interval: Duration::from_millis(self.pod_resources_interval_ms),
            timeout: Duration::from_millis(self.pod_resources_timeout_ms),
            gpu_resources: self.gpu_resources.clone(),
        })
    }
}

/// A failed `List`, in words.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ListError {
    /// The socket could not be reached.
    #[error("cannot connect to the kubelet at {path}: {message}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What the connection said.
        message: String,
    },
    /// The kubelet answered with a gRPC error.
    #[error("kubelet PodResources List failed: {0}")]
    Status(String),
    /// No answer within the timeout.
    #[error("kubelet PodResources List timed out after {0:?}")]
    Timeout(Duration),
}

/// Asks the kubelet at `socket` once: every device id to the containers
/// that hold it.
pub(crate) async fn list(
    socket: &Path,
    timeout: Duration,
    gpu_resources: &[String],
) -> Result<DeviceHolders, ListError> {
    let call = async {
        let path = socket.to_path_buf();
        // The URI is not used: every connection goes to the socket.
        let channel = tonic::transport::Endpoint::from_static("http://kubelet.sock")
            .connect_timeout(timeout)
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| ListError::Connect {
                path: socket.to_path_buf(),
                message: source_chain(&e),
            })?;
        let mut client =
            PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES);
        let resp = client
            .list(v1::ListPodResourcesRequest {})
            .await
            .map_err(|s| ListError::Status(format!("{} ({:?})", s.message(), s.code())))?;
        Ok(holders(resp.into_inner(), gpu_resources))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| ListError::Timeout(timeout))?
}

/// The error and its causes, joined (tonic's own message is generic).
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Device to holders, from one `List` answer (module doc).
fn holders(resp: v1::ListPodResourcesResponse, gpu_resources: &[String]) -> DeviceHolders {
    let mut by_device: HashMap<String, Vec<DeviceHolder>> = HashMap::new();
    let mut unknown_ids = 0;
    for pod in resp.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                if !is_gpu_resource(&d.resource_name, gpu_resources) {
                    continue;
                }
                for id in &d.device_ids {
                    let Some(shape) = DeviceShape::parse(id) else {
                        tracing::debug!(id = %id, resource = %d.resource_name, "Device id of no known shape; skipped.");
                        unknown_ids += 1;
                        continue;
                    };
                    let held = by_device.entry(shape.key()).or_default();
                    // Two replicas of one GPU in one container: one holder.
                    if held.iter().any(|h| {
                        h.namespace == pod.namespace && h.pod == pod.name && h.container == c.name
                    }) {
                        continue;
                    }
                    held.push(DeviceHolder {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                        resource: d.resource_name.clone(),
                    });
                }
            }
        }
    }
    DeviceHolders {
        by_device,
        unknown_ids,
    }
}

/// Asks answered at most this often (the kubelet rate-limits its
/// PodResources socket at 100 calls a second, shared by every client on the
/// node; a storm of faults on many GPUs costs at most four calls a second).
pub(crate) const MIN_ASK_GAP: Duration = Duration::from_millis(250);

/// Asks the kubelet every interval, and when the engine asks (`ask`: a
/// fault of a GPU read after the last call), until `ctx`'s shutdown,
/// telling the engine through `ctx` what changed and, after every answer,
/// that its device assignments are current as of the call (module doc).
/// Each call is an activity of `ctx`'s heartbeat (for the agent's input
/// watchdog, held to [`KubeletSettings::stall_deadline`]).
pub(crate) async fn poll(
    cfg: KubeletSettings,
    registry: std::sync::Arc<gpuwatch_core::Registry>,
    ask: Arc<tokio::sync::Notify>,
    ctx: InputContext,
) {
    let mut last: Option<DeviceHolders> = None;
    let call = format!("List on {}", cfg.socket.display());
    let mut failing = false;
    let (tx, progress) = (ctx.out(), ctx.progress());
    loop {
        if ctx.is_stopping() {
            return;
        }
        // This call answers every ask made until now.
        let _ = futures::FutureExt::now_or_never(ask.notified());
        let sent_at = std::time::Instant::now();
        let answer = {
            let _call = progress.begin(std::ffi::OsStr::new(&call));
            list(&cfg.socket, cfg.timeout, &cfg.gpu_resources).await
        };
        let ok = answer.is_ok();
        let update = match answer {
            Ok(now) => {
                registry.set_tally(Tally::PodResourcesUnknownDevices, now.unknown_ids);
                if failing {
                    tracing::info!("The kubelet answers PodResources again.");
                }
                failing = false;
                (last.as_ref() != Some(&now)).then(|| {
                    last = Some(now.clone());
                    PlacementUpdate::Devices(Arc::new(now))
                })
            }
            Err(e) => {
                registry.count(Tally::PodResourcesFailures, 1);
                let first = !failing;
                failing = true;
                first.then(|| unavailable(&cfg, &e))
            }
        };
        let mut delivered = true;
        if let Some(u) = update
            && tx.try_send(Input::Placement(u)).is_err()
        {
            // Full or gone: the next change (or the next failure) is sent
            // again; an unchanged answer is resent after a full channel.
            last = None;
            delivered = false;
        }
        // Current only when the engine has the answer: after a lost update
        // it would mark an older listing current.
        if ok && delivered {
            let _ = tx.try_send(Input::Placement(PlacementUpdate::DevicesCurrent(sent_at)));
        }
        if !wait_for_next(&cfg, &ask, &ctx, sent_at).await {
            return;
        }
    }
}

/// The engine's word for an unanswered `List` (logged once per failure run).
fn unavailable(cfg: &KubeletSettings, e: &ListError) -> PlacementUpdate {
    let missing = matches!(e, ListError::Connect { .. }) && !cfg.socket.exists();
    if missing {
        tracing::info!(socket = %cfg.socket.display(), "No kubelet PodResources socket: faults of a GPU name no pods.");
    } else {
        tracing::warn!(error = %e, "Cannot ask the kubelet which pods hold the GPUs; retrying.");
    }
    PlacementUpdate::DevicesUnavailable(e.to_string())
}

/// Waits until the next call is due: the interval after `sent_at`, or an
/// ask, answered no sooner than [`MIN_ASK_GAP`] after `sent_at` (asks
/// meanwhile are one). False at `ctx`'s shutdown.
async fn wait_for_next(
    cfg: &KubeletSettings,
    ask: &tokio::sync::Notify,
    ctx: &InputContext,
    sent_at: std::time::Instant,
) -> bool {
    let next_poll = tokio::time::Instant::from_std(sent_at + cfg.interval);
    tokio::select! {
        () = ctx.stopped() => return false,
        () = tokio::time::sleep_until(next_poll) => return true,
        () = ask.notified() => {}
    }
    let earliest = tokio::time::Instant::from_std(sent_at + MIN_ASK_GAP);
    tokio::select! {
        () = ctx.stopped() => false,
        () = tokio::time::sleep_until(earliest) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G1: &str = "GPU-6b1c2d3e-4f50-4a61-8b72-93a4b5c6d7e1";
    const G2: &str = "GPU-6b1c2d3e-4f50-4a61-8b72-93a4b5c6d7e2";

    #[test]
    fn every_device_of_every_container_is_indexed() {
        let resp = v1::ListPodResourcesResponse {
            pod_resources: vec![v1::PodResources {
                name: "trainer-0".into(),
                namespace: "ml".into(),
                containers: vec![v1::ContainerResources {
                    name: "main".into(),
                    devices: vec![v1::ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec![G1.into(), G2.into()],
                        topology: None,
                    }],
                    ..Default::default()
                }],
            }],
        };
        let h = holders(resp, &KubeletConfig::default().gpu_resources);
        assert_eq!(h.by_device.len(), 2);
        assert_eq!(h.by_device[G2][0].pod, "trainer-0");
        assert_eq!(h.by_device[G2][0].resource, "nvidia.com/gpu");
        assert_eq!(h.unknown_ids, 0);
    }

    #[test]
    fn replicas_renamed_resources_and_unknown_shapes() {
        let devices = |resource: &str, ids: &[&str]| v1::ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            topology: None,
        };
        let resp = v1::ListPodResourcesResponse {
            pod_resources: vec![v1::PodResources {
                name: "nb-2".into(),
                namespace: "research".into(),
                containers: vec![v1::ContainerResources {
                    name: "main".into(),
                    devices: vec![
                        devices(
                            "nvidia.com/gpu.shared",
                            &[&format!("{G1}::0"), &format!("{G1}::3")],
                        ),
                        devices("nvidia.com/mig-1g.10gb", &["0:1"]),
                        devices("rdma/hca", &["mlx5_0"]),
                    ],
                    ..Default::default()
                }],
            }],
        };
        let mut names = KubeletConfig::default().gpu_resources;
        // Not configured: the renamed resource is not read.
        let h = holders(resp.clone(), &names);
        assert!(h.by_device.is_empty());
        assert_eq!(h.unknown_ids, 1, "the index-shaped MIG id");
        names.push("nvidia.com/gpu.shared".into());
        let h = holders(resp, &names);
        assert_eq!(h.by_device.len(), 1);
        assert_eq!(h.by_device[G1].len(), 1, "two replicas, one holder");
        assert_eq!(h.by_device[G1][0].pod, "nb-2");
        assert_eq!(h.unknown_ids, 1);
    }

    /// The poll loop counts what the metrics export: a failed call while the
    /// socket is missing, then, once the kubelet answers, the device ids of
    /// a shape that names no GPU (an index-shaped id here).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn failed_calls_and_unknown_device_ids_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = KubeletSettings {
            socket: dir.path().join("kubelet.sock"),
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(500),
            gpu_resources: KubeletConfig::default().gpu_resources,
        };
        let (tx, rx) = crossbeam_channel::bounded(16);
        let registry = gpuwatch_core::Registry::new();
        let shutdown = gpuwatch_core::Shutdown::new();
        let ask = Arc::new(tokio::sync::Notify::new());
        let ctx = InputContext::new(shutdown.clone(), tx);
        let progress = ctx.progress().clone();
        let task = tokio::spawn(poll(cfg, registry.clone(), ask, ctx));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while registry.tally(Tally::PodResourcesFailures) == 0 {
            assert!(std::time::Instant::now() < deadline, "no failure counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A failed call is progress too: the poller beat and is not stuck in it.
        assert!(progress.last_beat_ms() > 0);
        assert!(matches!(
            rx.try_recv(),
            Ok(Input::Placement(PlacementUpdate::DevicesUnavailable(_)))
        ));
        let kubelet = gpuwatch_test_support::kubelet::Kubelet::start(dir.path()).await;
        kubelet.set_pods(vec![gpuwatch_test_support::kubelet::PodDevices {
            namespace: "ml".into(),
            name: "trainer-0".into(),
            containers: vec![(
                "main".into(),
                vec![(
                    "nvidia.com/gpu".into(),
                    vec![
                        "GPU-3f6c5b1e-8a2d-4c7b-9e1f-0a2b3c4d5e6f".into(),
                        "3".into(),
                    ],
                )],
            )],
        }]);
        while registry.tally(Tally::PodResourcesUnknownDevices) != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "unknown ids: {}, failures: {}, calls: {}",
                registry.tally(Tally::PodResourcesUnknownDevices),
                registry.tally(Tally::PodResourcesFailures),
                kubelet.list_calls()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.trigger();
        task.await.unwrap();
        kubelet.stop();
    }

    /// A call a minute apart, and an ask between: the ask is answered by a
    /// call sent after it, and the engine is told its device assignments
    /// are current as of that call (after the changed answer itself). Asks
    /// made before a call is sent are answered by it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn an_ask_is_answered_by_a_call_and_marked_current() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = gpuwatch_test_support::kubelet::Kubelet::start(dir.path()).await;
        let cfg = KubeletSettings {
            socket: kubelet.socket.clone(),
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(2),
            gpu_resources: KubeletConfig::default().gpu_resources,
        };
        let (tx, rx) = crossbeam_channel::bounded(16);
        let ask = Arc::new(tokio::sync::Notify::new());
        let shutdown = gpuwatch_core::Shutdown::new();
        let task = tokio::spawn(poll(
            cfg,
            gpuwatch_core::Registry::new(),
            ask.clone(),
            InputContext::new(shutdown.clone(), tx),
        ));
        let next = || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Input::Placement(u)) = rx.try_recv() {
                    return u;
                }
                assert!(std::time::Instant::now() < deadline, "nothing sent");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        assert!(matches!(next(), PlacementUpdate::Devices(_)));
        assert!(matches!(next(), PlacementUpdate::DevicesCurrent(_)));
        assert_eq!(kubelet.list_calls(), 1);
        kubelet.set_pods(vec![gpuwatch_test_support::kubelet::PodDevices {
            namespace: "ml".into(),
            name: "trainer-0".into(),
            containers: vec![(
                "main".into(),
                vec![("nvidia.com/gpu".into(), vec![G1.into()])],
            )],
        }]);
        let asked_at = std::time::Instant::now();
        for _ in 0..5 {
            ask.notify_one();
        }
        let PlacementUpdate::Devices(d) = next() else {
            panic!("the new answer first");
        };
        assert_eq!(d.by_device[G1][0].pod, "trainer-0");
        let PlacementUpdate::DevicesCurrent(at) = next() else {
            panic!("then current");
        };
        assert!(at >= asked_at);
        tokio::time::sleep(MIN_ASK_GAP * 2).await;
        // One call, or two when the task woke between the asks.
        let calls = kubelet.list_calls();
        assert!((2..=3).contains(&calls), "five asks, {calls} calls in all");
        // Unchanged answers only say they are current.
        ask.notify_one();
        assert!(matches!(next(), PlacementUpdate::DevicesCurrent(_)));
        shutdown.trigger();
        task.await.unwrap();
        kubelet.stop();
    }

    #[test]
    fn settings_are_resolved_with_the_problems_validate_reports() {
        let s = KubeletConfig::default().resolve().unwrap();
        assert_eq!(s.interval, Duration::from_secs(10));
        assert_eq!(s.timeout, Duration::from_secs(2));
        let bad = KubeletConfig {
            pod_resources_interval_ms: 100,
            pod_resources_timeout_ms: 0,
            ..KubeletConfig::default()
        };
        let problems = bad.resolve().unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("kubelet.sock");
        let e = list(&sock, Duration::from_millis(500), &[])
            .await
            .unwrap_err();
        assert!(matches!(e, ListError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("kubelet.sock"), "{e}");
    }
}
