//! Helpers shared by the agent's integration tests: the real `/dev/kmsg`
//! (write records, find them again, `printk_devkmsg` handling), a running
//! `gpuwatch run` child process whose stdout (events) and stderr (JSON logs)
//! are captured, and the pieces the other harnesses (`kube_support`,
//! `otlp_support`) build on: captured output [`Lines`], polling, a minimal
//! HTTP GET, `/proc` process states, the nvml-sim library built once.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub(crate) use gpuwatch_test_support::kmsg::{DevKmsg, marker, ring, seq_of};
pub(crate) use gpuwatch_test_support::process::wait_timeout;

/// A distinct PCI domain for a test (events on distinct GPUs are never
/// coalesced by the engine's dedup window).
pub(crate) fn pci_domain(marker: &str) -> u16 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(marker, &mut h);
    0x1000 + (std::hash::Hasher::finish(&h) % 0xe000) as u16
}

/// An XID 79 line for GPU `domain:bus`, tagged with `marker` and `i`.
pub(crate) fn xid_line(marker: &str, domain: u16, bus: u8) -> String {
    format!(
        "NVRM: Xid (PCI:{domain:04x}:{bus:02x}:00): 79, pid=4242, name={marker}-{bus}, GPU has fallen off the bus."
    )
}

/// Captured output lines of a child.
#[derive(Clone, Default)]
pub(crate) struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    /// Appends every line `r` yields, from a background thread.
    pub(crate) fn spawn_reader(&self, r: impl Read + Send + 'static) {
        let lines = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                lines.0.lock().expect("lines lock").push(line);
            }
        });
    }

    /// Snapshot.
    pub(crate) fn get(&self) -> Vec<String> {
        self.0.lock().expect("lines lock").clone()
    }

    /// Lines containing `needle`.
    pub(crate) fn matching(&self, needle: &str) -> Vec<String> {
        self.get()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect()
    }

    /// JSON log lines whose `message` is `message`.
    pub(crate) fn logs(&self, message: &str) -> Vec<serde_json::Value> {
        self.get()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    }

    /// The last `n` lines, joined (for assertion messages).
    pub(crate) fn tail(&self, n: usize) -> String {
        let all = self.get();
        all[all.len().saturating_sub(n)..].join("\n")
    }
}

/// Polls `cond` every `every` until it holds or `timeout` passes; checks once
/// more at the deadline.
pub(crate) fn poll_until(
    timeout: Duration,
    every: Duration,
    mut cond: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(every);
    }
    cond()
}

/// Waits up to `timeout` for `cond`, polling every 50 ms.
pub(crate) fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    poll_until(timeout, Duration::from_millis(50), cond)
}

/// The state letter of a `/proc/.../stat` file (`R`, `S`, `T`, `Z`, ...);
/// `None` when the file cannot be read or parsed.
pub(crate) fn proc_state(stat_path: impl AsRef<Path>) -> Option<char> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
}

/// Builds the nvml-sim cdylib once per test process (a no-op when it is
/// fresh: it cannot be a dependency of this package) and returns its path,
/// `libnvml_sim.so` next to the `gpuwatch` executable.
pub(crate) fn nvml_sim_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        // target/<profile>/gpuwatch → target/<profile>
        let profile_dir = Path::new(env!("CARGO_BIN_EXE_gpuwatch"))
            .parent()
            .expect("target/<profile> directory")
            .to_path_buf();
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(&workspace)
            .args(["build", "-q", "-p", "nvml-sim"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo build -p nvml-sim");
        assert!(
            out.status.success(),
            "cargo build -p nvml-sim failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lib = profile_dir.join("libnvml_sim.so");
        assert!(lib.is_file(), "{} missing after the build", lib.display());
        lib
    })
}

/// Runs `gpuwatch validate --nvml-sim SIM` (the init-container check) with
/// `state_dir = DIR` plus `config` as its settings, an empty kernel log, no
/// node name and no kubeconfig, and `args` after the subcommand's own.
pub(crate) fn run_validate(
    dir: &Path,
    sim: &Path,
    config: &str,
    args: &[&str],
) -> std::process::Output {
    let conf = dir.join("validate.toml");
    std::fs::write(
        &conf,
        format!("state_dir = {:?}\n{config}", dir.display().to_string()),
    )
    .unwrap();
    let empty = dir.join("empty.kmsg");
    std::fs::write(&empty, "").unwrap();
    nvml_sim_lib();
    Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .arg("validate")
        .arg("--config")
        .arg(&conf)
        .arg("--nvml-sim")
        .arg(sim)
        .arg("--kmsg-path")
        .arg(&empty)
        .args(args)
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .output()
        .expect("run gpuwatch validate")
}

/// The JSON report of a `gpuwatch validate --json` run (panics with its
/// output when there is none).
pub(crate) fn validation_report(out: &std::process::Output) -> gpuwatch_proto::ValidationReport {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A file under `collector/tests/data/`.
pub(crate) fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// `gpuwatch run` made hermetic, the base of every helper that starts the
/// agent: whatever this machine has, the agent sees no RDMA NIC (unless
/// `extra` names its own `--sysfs-root`), no Kubernetes node or kubeconfig
/// from the developer's shell, and no `OTEL_*` redirection of its export.
/// The arguments are `run`, then `flags`, then `extra` (a test's own flags,
/// last as on a command line).
pub(crate) fn run_command(flags: &[&str], extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuwatch"));
    cmd.arg("run");
    if !flags.contains(&"--sysfs-root") && !extra.contains(&"--sysfs-root") {
        cmd.arg("--sysfs-root").arg(data("sysfs-without-rdma"));
    }
    cmd.args(flags)
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .stdin(Stdio::null());
    cmd
}

/// A running `gpuwatch run`.
pub(crate) struct TestAgent {
    pub child: Child,
    pub stdout: Lines,
    pub stderr: Lines,
    pub state_dir: PathBuf,
}

impl TestAgent {
    /// Starts `gpuwatch run --sink stdout --no-nvml --state-dir DIR
    /// --api-listen 127.0.0.1:0 --log-format json` plus `extra`.
    pub(crate) fn start(state_dir: &Path, extra: &[&str]) -> TestAgent {
        TestAgent::spawn(state_dir, &["--no-nvml"], extra, None)
    }

    /// Starts `gpuwatch run --sink stdout --nvml-sim SCENARIO --state-dir DIR
    /// --api-listen 127.0.0.1:0 --log-format json` plus `extra`, with the
    /// nvml-sim library built by [`nvml_sim_lib`].
    pub(crate) fn start_nvml_sim(state_dir: &Path, scenario: &Path, extra: &[&str]) -> TestAgent {
        let scenario = scenario.to_str().expect("UTF-8 scenario path");
        TestAgent::spawn(
            state_dir,
            &["--nvml-sim", scenario],
            extra,
            Some(nvml_sim_lib()),
        )
    }

    /// Adds the common flags to a `gpuwatch run` command, starts it and waits
    /// for "gpuwatch started.".
    fn spawn(
        state_dir: &Path,
        input: &[&str],
        extra: &[&str],
        sim_lib: Option<&Path>,
    ) -> TestAgent {
        let state_dir_arg = state_dir.to_str().expect("UTF-8 state dir");
        let mut flags = input.to_vec();
        flags.extend([
            "--sink",
            "stdout",
            "--log-format",
            "json",
            "--api-listen",
            "127.0.0.1:0",
            "--node-name",
            "e2e-node",
            "--state-dir",
            state_dir_arg,
        ]);
        let mut cmd = run_command(&flags, extra);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(lib) = sim_lib {
            cmd.env("GPUWATCH_NVML_SIM_LIB", lib);
        }
        let mut child = cmd.spawn().expect("start gpuwatch");
        let stdout = Lines::default();
        let stderr = Lines::default();
        stdout.spawn_reader(child.stdout.take().unwrap());
        stderr.spawn_reader(child.stderr.take().unwrap());
        let agent = TestAgent {
            child,
            stdout,
            stderr,
            state_dir: state_dir.to_path_buf(),
        };
        assert!(
            wait_until(Duration::from_secs(20), || !agent
                .stderr
                .matching("gpuwatch started.")
                .is_empty()),
            "agent did not start: {:#?}",
            agent.stderr.get()
        );
        agent
    }

    /// The API address the agent logged.
    pub(crate) fn api_addr(&self) -> Option<String> {
        self.stderr
            .matching("API listening.")
            .first()
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .and_then(|v| v["addr"].as_str().map(str::to_string))
    }

    /// Event JSON objects (stdout) whose text contains `needle`.
    pub(crate) fn events(&self, needle: &str) -> Vec<serde_json::Value> {
        self.stdout
            .matching(needle)
            .iter()
            .map(|l| serde_json::from_str(l).expect("stdout line is one JSON event"))
            .collect()
    }

    /// Waits until `n` events contain `needle`.
    pub(crate) fn wait_events(&self, needle: &str, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.events(needle).len() >= n)
    }

    /// JSON log lines (stderr) with this message.
    pub(crate) fn logs(&self, message: &str) -> Vec<serde_json::Value> {
        self.stderr.logs(message)
    }

    /// The kernel-log position in the saved state (`kmsg.last_seq`).
    pub(crate) fn cursor_seq(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.state_dir.join("health.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["kmsg"]["last_seq"].as_u64()
    }

    /// Sends a signal.
    pub(crate) fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig)
            .expect("signal the agent");
        if sig == nix::sys::signal::Signal::SIGSTOP {
            // kill(2) returns before the target has stopped: wait until every
            // thread is in state T, so nothing is read after this returns.
            self.wait_all_threads_stopped();
        }
    }

    fn wait_all_threads_stopped(&self) {
        let tasks = format!("/proc/{}/task", self.child.id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let all_stopped = std::fs::read_dir(&tasks)
                .map(|dir| {
                    dir.flatten().all(|t| {
                        proc_state(t.path().join("stat"))
                            .is_some_and(|state| state == 'T' || state == 't')
                    })
                })
                .unwrap_or(false);
            if all_stopped {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "agent threads did not stop after SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM and wait; returns the exit status code.
    pub(crate) fn stop(mut self) -> (Option<i32>, Lines, Lines) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = wait_timeout(&mut self.child, Duration::from_secs(20));
        (status, self.stdout.clone(), self.stderr.clone())
    }

    /// SIGKILL and reap.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        // A test that failed midway must not leave the agent running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of `input` in a `/v1/health` JSON body (`monitor.inputs`);
/// `Null` when it is not listed.
pub(crate) fn monitor_input(health: &serde_json::Value, input: &str) -> serde_json::Value {
    health["monitor"]["inputs"]
        .as_array()
        .and_then(|inputs| inputs.iter().find(|i| i["input"] == input))
        .cloned()
        .unwrap_or_default()
}

/// Minimal HTTP/1.1 GET (status, body); understands chunked bodies.
pub(crate) fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.get(9..12)?.parse().ok()?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}
