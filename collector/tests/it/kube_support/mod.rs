//! Harness for `kube_e2e.rs`: the real `gpuwatch run` binary as a child
//! process, writing to the in-process Kubernetes API-server double
//! (`gpuwatch_test_support::kube`, shared with `kube/tests`), reading its kernel log from a
//! FIFO the test writes kmsg-format records into, and NVML from the nvml-sim
//! cdylib driven by `collector/tests/data/kube-*.toml`.
//!
//! One [`KubeWorld`] per test: a tokio runtime serving the double, a temporary
//! directory with the state dir, the boot-id file, the FIFO and the config.
//! The FIFO is held open read-write by the rig for its whole life, so the
//! agent never sees end-of-file between restarts and wakes on every write.
#![allow(dead_code)]

use crate::common::{Lines, nvml_sim_lib, poll_until, proc_state, wait_timeout};
pub(crate) use crate::kube_common::build::taint;
pub(crate) use crate::kube_common::taint_keys;
use crate::kube_common::{ApiDouble, Recorded, build, condition, taint_value};
use k8s_openapi::api::core::v1::{Event, Node, NodeCondition, Taint};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

pub(crate) use crate::common::{data, http_get};

/// The Node the double serves and the agent writes.
pub(crate) const NODE: &str = "kube-e2e-node";
/// gpuwatch's readiness condition.
pub(crate) const READY: &str = "AcceleratedHardwareReady";
/// gpuwatch's problem condition.
pub(crate) const PROBLEM: &str = "GPUProblem";
/// gpuwatch's fault taint key.
pub(crate) const FAULT_TAINT: &str = "gpuwatch.io/unhealthy";
/// The startup taint key (cluster-autoscaler convention).
pub(crate) const STARTUP_TAINT: &str =
    "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready";
/// Generous bound for things that should take a second or two.
pub(crate) const T: Duration = Duration::from_secs(15);

/// Builds nvml-sim once per test process (a no-op when it is fresh), so that
/// `--nvml-sim` finds `libnvml_sim.so` next to the `gpuwatch` executable.
pub(crate) fn ensure_nvml_sim() {
    nvml_sim_lib();
}

/// A Node named [`NODE`] with these taints, on a p5.48xlarge whose device
/// plugin advertises the board's 8 GPUs.
pub(crate) fn node(taints: Vec<Taint>) -> Node {
    build::node(
        NODE,
        taints,
        &[("node.kubernetes.io/instance-type", "p5.48xlarge")],
    )
}

/// Polls `cond` every 2 ms until it holds or `timeout` passes.
pub(crate) fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    poll_until(timeout, Duration::from_millis(2), cond)
}

/// Where the agent reads NVML from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Nvml<'a> {
    /// `--nvml-sim collector/tests/data/<file>`.
    Sim(&'a str),
    /// `--no-nvml`.
    Off,
}

/// The API-server double serving `node`, on a runtime of its own (drop the
/// double before the runtime).
pub(crate) fn serve_api_double(node: Node) -> (tokio::runtime::Runtime, ApiDouble) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let api = rt.block_on(ApiDouble::start(node));
    (rt, api)
}

/// The double serving a bare Node `name` (no labels, no capacity).
pub(crate) fn bare_api_double(name: &str) -> (tokio::runtime::Runtime, ApiDouble) {
    let node: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("a Node");
    serve_api_double(node)
}

/// One test's world: the API double, the kernel-log FIFO, the boot id, the
/// state directory.
pub(crate) struct KubeWorld {
    /// The API-server double (dropped before the runtime that serves it).
    pub api: ApiDouble,
    /// Serves the double.
    pub rt: tokio::runtime::Runtime,
    /// Holds the FIFO open read-write (a writer always exists).
    fifo: std::fs::File,
    next_seq: u64,
    /// Temporary directory (state, boot id, FIFO, configs).
    pub dir: tempfile::TempDir,
}

impl KubeWorld {
    /// Starts the double serving `node`; creates the FIFO and the boot-id file
    /// (`boot-a`).
    pub(crate) fn new(node: Node) -> KubeWorld {
        ensure_nvml_sim();
        let (rt, api) = serve_api_double(node);
        let dir = tempfile::tempdir().expect("temporary directory");
        let fifo_path = dir.path().join("kmsg.fifo");
        nix::unistd::mkfifo(&fifo_path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        // O_RDWR on a FIFO does not block and counts as a writer.
        let fifo = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo_path)
            .expect("open the FIFO read-write");
        let rig = KubeWorld {
            api,
            rt,
            fifo,
            next_seq: 1,
            dir,
        };
        rig.set_boot_id("boot-a");
        rig
    }

    /// The FIFO given to `--kmsg-path`.
    pub(crate) fn fifo_path(&self) -> PathBuf {
        self.dir.path().join("kmsg.fifo")
    }

    /// The state directory (same for every agent of this rig).
    pub(crate) fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The file given to `--boot-id-path`.
    pub(crate) fn boot_id_path(&self) -> PathBuf {
        self.dir.path().join("boot_id")
    }

    /// Simulates a boot: the next agent reads this boot id.
    pub(crate) fn set_boot_id(&self, id: &str) {
        std::fs::write(self.boot_id_path(), format!("{id}\n")).expect("write boot id");
    }

    /// Writes the config file: fast test pacing for NVML, the engine and the
    /// writer's retries; the writer's write coalescing
    /// (`min_write_interval_ms`) stays at its production default. `extra` is
    /// appended (more `[validation]`/`[kube]` keys go in `kube_extra` and
    /// `validation` so sections are not repeated).
    pub(crate) fn config(&self, kube_extra: &str, validation: &str) -> PathBuf {
        let text = format!(
            r#"node_name = "{NODE}"

[nvml]
poll_interval_ms = 100
retry_interval_ms = 200

[engine]
tick_interval_ms = 100
persist_interval_ms = 100

[kube]
enabled = true
api_server_url = "{url}"
backoff_initial_ms = 50
backoff_max_ms = 400
validation_interval_secs = 1
request_timeout_secs = 2
watch_timeout_secs = 30
normal_event_spread_secs = 0
{kube_extra}

[validation]
{validation}
"#,
            url = self.api.url,
        );
        let path = self.dir.path().join("gpuwatch.toml");
        std::fs::write(&path, text).expect("write config");
        path
    }

    /// Starts `gpuwatch run` with `config` (from [`KubeWorld::config`]), this rig's
    /// FIFO, boot id and state dir, plus `extra` flags.
    pub(crate) fn start(&self, config: &Path, nvml: Nvml<'_>, extra: &[&str]) -> KubeAgent {
        let (fifo, boot_id, state_dir) = (self.fifo_path(), self.boot_id_path(), self.state_dir());
        let mut flags = vec![
            "--config",
            utf8(config),
            "--kmsg-path",
            utf8(&fifo),
            "--accept-user-facility",
            "--boot-id-path",
            utf8(&boot_id),
            "--state-dir",
            utf8(&state_dir),
            "--api-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ];
        let scenario;
        match nvml {
            Nvml::Sim(s) => {
                scenario = data(s);
                flags.extend(["--nvml-sim", utf8(&scenario)]);
            }
            Nvml::Off => flags.push("--no-nvml"),
        }
        let mut cmd = crate::common::run_command(&flags, extra);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start gpuwatch");
        let stderr = Lines::default();
        stderr.spawn_reader(child.stderr.take().expect("piped stderr"));
        let agent = KubeAgent {
            child,
            stderr,
            started: Instant::now(),
        };
        assert!(
            wait_until(T, || !agent.logs("gpuwatch started.").is_empty()
                || agent.exited()),
            "agent did not start: {:#?}",
            agent.stderr.get()
        );
        assert!(
            !agent.exited(),
            "agent exited at start: {:#?}",
            agent.stderr.get()
        );
        agent
    }

    /// Writes one kmsg-format record (facility user, level warning) into the
    /// FIFO; returns when the write returned.
    pub(crate) fn write_kmsg(&mut self, message: &str) {
        let ts_usec = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000)
            .unwrap_or(0);
        // PRI = facility user (1) * 8 + level warning (4).
        let record = format!("12,{},{ts_usec},-;{message}\n", self.next_seq);
        self.next_seq += 1;
        self.fifo
            .write_all(record.as_bytes())
            .expect("write the kmsg FIFO");
    }

    /// The Node as stored by the double.
    pub(crate) fn node(&self) -> Node {
        self.api.node()
    }

    /// One of the Node's conditions.
    pub(crate) fn cond(&self, type_: &str) -> Option<NodeCondition> {
        condition(&self.node(), type_)
    }

    /// `(status, reason)` of a condition, `("", "")` when absent.
    pub(crate) fn cond_status(&self, type_: &str) -> (String, String) {
        self.cond(type_)
            .map(|c| (c.status, c.reason.unwrap_or_default()))
            .unwrap_or_default()
    }

    /// Value of the taint with `key` (`Some("")` for a taint without value).
    pub(crate) fn taint(&self, key: &str) -> Option<String> {
        taint_value(&self.node(), key)
    }

    /// Events the double holds.
    pub(crate) fn events(&self) -> Vec<Event> {
        self.api.events()
    }

    /// Requests the double received.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.api.requests()
    }

    /// Write requests (anything but GET) received so far.
    pub(crate) fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    /// Waits until no write reached the double for `quiet` (the writer's
    /// coalescing interval has passed), up to `timeout`.
    pub(crate) fn wait_quiet(&self, quiet: Duration, timeout: Duration) -> bool {
        wait_until(timeout, || {
            self.writes().last().is_none_or(|r| r.at.elapsed() >= quiet)
        })
    }
}

/// A running `gpuwatch run`.
pub(crate) struct KubeAgent {
    child: Child,
    /// JSON log lines.
    pub stderr: Lines,
    /// When it was spawned.
    pub started: Instant,
}

impl KubeAgent {
    /// Whether the process has exited.
    pub(crate) fn exited(&self) -> bool {
        // try_wait needs &mut; /proc tells without reaping.
        proc_state(format!("/proc/{}/stat", self.child.id()))
            .is_none_or(|state| state == 'Z' || state == 'X')
    }

    /// JSON log lines whose `message` is `message`.
    pub(crate) fn logs(&self, message: &str) -> Vec<Value> {
        self.stderr.logs(message)
    }

    /// Every JSON log line at WARN or ERROR.
    pub(crate) fn warnings(&self) -> Vec<Value> {
        self.stderr
            .get()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["level"] == "WARN" || v["level"] == "ERROR")
            .collect()
    }

    /// The local API address the agent logged.
    pub(crate) fn api_addr(&self) -> String {
        self.logs("API listening.")
            .first()
            .and_then(|v| v["addr"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no API address in {:#?}", self.stderr.get()))
    }

    /// `GET /v1/health` as JSON.
    pub(crate) fn health(&self) -> Value {
        let (code, body) = http_get(&self.api_addr(), "/v1/health")
            .unwrap_or_else(|| panic!("GET /v1/health failed: {:#?}", self.stderr.get()));
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("/v1/health is JSON")
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, sig).expect("signal the agent");
    }

    /// SIGTERM; waits for the exit; returns the exit code (None: killed after 20 s).
    pub(crate) fn stop(mut self) -> Option<i32> {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        wait_timeout(&mut self.child, Duration::from_secs(20))
    }

    /// SIGKILL and reap.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for KubeAgent {
    fn drop(&mut self) {
        // A test that failed midway must not leave the agent running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The condition bodies of every server-side apply among `reqs`:
/// `type → [(status, reason)]` in request order.
pub(crate) fn applied_conditions(reqs: &[Recorded]) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for r in reqs
        .iter()
        .filter(|r| r.resource == "nodes/status" && r.verb == "patch")
    {
        for c in r.body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            out.entry(c["type"].as_str().unwrap_or_default().to_owned())
                .or_default()
                .push((
                    c["status"].as_str().unwrap_or_default().to_owned(),
                    c["reason"].as_str().unwrap_or_default().to_owned(),
                ));
        }
    }
    out
}

/// The taint lists that the taint merge patches among `reqs` set on the Node
/// (an absent or `null` list is the empty list).
pub(crate) fn patched_taint_lists(reqs: &[Recorded]) -> Vec<Vec<Value>> {
    reqs.iter()
        .filter(|r| r.resource == "nodes" && r.verb == "patch")
        .filter(|r| r.body["spec"].get("taints").is_some())
        .map(|r| {
            r.body["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// `path` as a command-line argument (test paths are UTF-8).
fn utf8(path: &Path) -> &str {
    path.to_str().expect("UTF-8 test path")
}
