//! The child agent: `gpuwatch run` started as the demo needs it (stdout JSON
//! sink, the nvml-sim library driven by a scenario, a temporary state
//! directory, the Kubernetes writer in dry-run, NVML polled every second, the
//! demo's NIC tree as its sysfs),
//! what it prints read on two threads, its local API, and a clean stop with
//! SIGTERM.

use crate::DemoError;
use crate::kernel_log::{KernelLog, KernelLogKind};
use crate::narrate::Narrator;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// NVML poll interval of the demo agent at speed 1.
pub(crate) const POLL_MS: u64 = 1000;
/// Consecutive clean samples before an NVML-condition fault clears (the
/// engine default, stated here so the narration can name it).
pub(crate) const CLEAR_SAMPLES: u32 = 3;
/// How long the agent may take to report its API address.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the agent may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// The NVML poll interval at `speed` (at least 50 ms).
pub(crate) fn poll_ms(speed: u32) -> u64 {
    (POLL_MS / u64::from(speed.max(1))).max(50)
}

/// The demo agent's configuration file: NVML polled every `POLL_MS / speed`,
/// and the NIC monitor's timings (`crate::nic::timings`).
pub(crate) fn agent_config(speed: u32) -> String {
    let poll = poll_ms(speed);
    format!(
        "# Written by `gpuwatch demo`.\n[nvml]\npoll_interval_ms = {poll}\nretry_interval_ms = {poll}\n\n[engine]\ncondition_clear_samples = {CLEAR_SAMPLES}\n\n{}",
        crate::nic::timings(speed).config_table()
    )
}

/// The agent binary: `--agent`, else `gpuwatch` in this program's directory.
/// Taken once: a rebuild that replaces this program while the demo runs leaves
/// `/proc/self/exe` pointing at "… (deleted)".
pub(crate) fn gpuwatch_exe(agent: Option<&Path>) -> Result<PathBuf, DemoError> {
    if let Some(a) = agent {
        return Ok(a.to_path_buf());
    }
    let me =
        std::env::current_exe().map_err(crate::setup_err("cannot find this executable".into()))?;
    let text = me.to_string_lossy();
    let me = match text.strip_suffix(" (deleted)") {
        Some(live) => PathBuf::from(live),
        None => me,
    };
    let exe = me.with_file_name("gpuwatch");
    if exe.is_file() {
        Ok(exe)
    } else {
        Err(DemoError::Input(format!(
            "no gpuwatch binary at {} (build it: cargo build --release -p gpuwatch; or pass --agent)",
            exe.display()
        )))
    }
}

/// Active faults recorded in the engine's state file.
pub(crate) fn state_file_faults(state: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(state.join(gpuwatch_core::engine::STATE_FILE)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let gpus: usize = v["gpus"]
        .as_array()?
        .iter()
        .map(|g| g["faults"].as_array().map_or(0, Vec::len))
        .sum();
    Some(gpus + v["node_faults"].as_array().map_or(0, Vec::len))
}

/// The body of `GET path` from the agent's API.
pub(crate) fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split("\r\n\r\n").nth(1).map(str::to_string)
}

/// What one agent run needs.
pub(crate) struct Phase<'a> {
    pub exe: &'a Path,
    pub scenario: &'a Path,
    pub script: &'a [crate::script::ScriptedLine],
    pub duration: Duration,
    pub boot_id_path: &'a Path,
    pub config: &'a Path,
    /// The demo's NIC tree (`--sysfs-root`).
    pub sysfs: &'a gpuwatch_test_support::sysfs::FakeSysfs,
    /// The agent's `[network]` timings, which the flap narration waits by.
    pub net: &'a crate::nic::NetworkTimings,
}

/// Kills the agent on drop (error paths).
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A running agent: its events (stdout) and JSON log lines (stderr), each
/// parsed on a thread of its own.
pub(crate) struct AgentProcess {
    child: ChildGuard,
    events: mpsc::Receiver<Value>,
    logs: mpsc::Receiver<Value>,
    started: Instant,
}

/// Sends each JSON line `out` prints to `tx` until the pipe closes.
fn read_json_lines(out: impl std::io::Read + Send + 'static, tx: mpsc::Sender<Value>) {
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&l) {
                let _ = tx.send(v);
            }
        }
    });
}

impl AgentProcess {
    /// Starts `gpuwatch run` for `phase`, reading `kmsg`, with its state in
    /// `state`.
    pub(crate) fn start(
        phase: &Phase<'_>,
        kmsg: &KernelLog,
        state: &Path,
    ) -> Result<AgentProcess, DemoError> {
        let mut agent = Command::new(phase.exe);
        agent.args(["run", "--sink", "stdout", "--kube-dry-run"]);
        if kmsg.kind == KernelLogKind::Device {
            // The demo's lines land as facility user in the real kernel log, and
            // by default only kernel records may raise faults.
            agent.arg("--accept-user-facility");
        }
        let mut child = agent
            .args([
                "--api-listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--node-name",
                "demo-node",
            ])
            .arg("--config")
            .arg(phase.config)
            .arg("--kmsg-path")
            .arg(&kmsg.path)
            .arg("--nvml-sim")
            .arg(phase.scenario)
            .arg("--state-dir")
            .arg(state)
            .arg("--boot-id-path")
            .arg(phase.boot_id_path)
            .arg("--sysfs-root")
            .arg(phase.sysfs.root())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| DemoError::Agent(format!("cannot start {}: {e}", phase.exe.display())))?;
        let (ev_tx, events) = mpsc::channel::<Value>();
        let (log_tx, logs) = mpsc::channel::<Value>();
        if let Some(out) = child.stdout.take() {
            read_json_lines(out, ev_tx);
        }
        if let Some(err) = child.stderr.take() {
            read_json_lines(err, log_tx);
        }
        Ok(AgentProcess {
            child: ChildGuard(Some(child)),
            events,
            logs,
            started: Instant::now(),
        })
    }

    /// How long ago the agent was started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits for the API address the agent logs; narrates what it logs
    /// meanwhile.
    pub(crate) fn wait_for_api(&mut self, n: &mut Narrator) -> Result<String, DemoError> {
        let mut api = None;
        while api.is_none() && self.started.elapsed() < START_TIMEOUT {
            match self.logs.recv_timeout(Duration::from_millis(100)) {
                Ok(v) if v["message"] == "API listening." => {
                    api = v["addr"].as_str().map(str::to_string);
                }
                Ok(v) => n.log(&v),
                Err(_) => {}
            }
            if let Some(Ok(Some(st))) = self.child.0.as_mut().map(|c| c.try_wait()) {
                return Err(DemoError::Agent(format!("exited early with {st}")));
            }
        }
        api.ok_or_else(|| DemoError::Agent("did not report its API address".into()))
    }

    /// Narrates the events and log lines read so far.
    pub(crate) fn drain(&self, n: &mut Narrator) {
        while let Ok(ev) = self.events.try_recv() {
            n.event(&ev);
        }
        while let Ok(v) = self.logs.try_recv() {
            n.log(&v);
        }
    }

    /// Stops the agent cleanly: SIGTERM, it drains and flushes its state.
    /// Returns its exit status (`None`: killed after `STOP_TIMEOUT`), after
    /// narrating what the reader threads still hold.
    pub(crate) fn stop(mut self, n: &mut Narrator) -> Option<ExitStatus> {
        let mut status = None;
        if let Some(c) = self.child.0.as_mut() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if let Ok(Some(st)) = c.try_wait() {
                    status = Some(st);
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        }
        if status.is_some() {
            self.child.0 = None;
        }
        // The reader threads end with the pipes; what they still hold is narrated.
        std::thread::sleep(Duration::from_millis(50));
        self.drain(n);
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_config_is_a_valid_gpuwatch_config() {
        for speed in [1, 4, 20] {
            let text = agent_config(speed);
            // The demo gives its agent the node name with `--node-name`.
            let node = format!("node_name = \"demo-node\"\n{text}");
            let settings = gpuwatch::Config::parse(Path::new("demo-agent.toml"), &node)
                .unwrap_or_else(|e| panic!("{e}\n{text}"))
                .resolve()
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(
                settings.nvml().poll_interval,
                Duration::from_millis((POLL_MS / u64::from(speed)).max(50))
            );
            assert_eq!(settings.engine().condition_clear_samples, CLEAR_SAMPLES);
            let nic = crate::nic::timings(speed);
            let net = settings.network();
            assert!(net.enabled);
            assert_eq!(
                net.poll_interval,
                Duration::from_millis(nic.poll_interval_ms)
            );
            assert_eq!(net.flap_threshold, crate::nic::FLAPS);
            assert_eq!(net.flap_quiet, Duration::from_secs(nic.flap_quiet_secs));
            // A flap's down half is shorter than the grace: flaps, not a port down.
            assert!(nic.half_flap < net.down_grace, "{nic:?}");
        }
    }
}
