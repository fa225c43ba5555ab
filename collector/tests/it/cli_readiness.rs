//! The agent binary when it cannot read the kernel log, and its log output
//! when stderr is not a terminal.
//!
//! An unprivileged container whose device cgroup denies `/dev/kmsg` cannot open
//! it; a path that does not exist fails the same `open(2)` the same way for the
//! agent. The agent must still become ready, and say that the kernel log input
//! is down everywhere an operator looks: `/v1/health` (the `kmsg` input
//! `down`, verdict `unknown`, never `unhealthy`), `/metrics`
//! (`gpuwatch_monitor_up{input="kmsg"} 0`) and `/readyz`'s body.

use crate::common::{TestAgent, http_get, monitor_input, wait_until};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

#[test]
fn an_unreadable_kernel_log_is_reported_and_does_not_hold_readiness_back() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-kmsg-here");
    let agent = TestAgent::start(
        &dir.path().join("state"),
        &["--kmsg-path", missing.to_str().unwrap(), "--prometheus"],
    );
    let addr = agent.api_addr().expect("API address logged");

    let mut last = None;
    assert!(
        wait_until(T, || {
            last = http_get(&addr, "/readyz");
            last.as_ref().is_some_and(|(code, _)| *code == 200)
        }),
        "never ready: {last:?}\n{:#?}",
        agent.stderr.get()
    );
    let (_, body) = last.unwrap();
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["kmsg"], "unavailable", "{body}");
    assert_eq!(ready["not_ready"], serde_json::json!([]), "{body}");

    // The engine's health says why: the kernel log input is down, so the
    // node's verdict is unknown (not a hardware verdict).
    let mut health = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            health = http_get(&addr, "/v1/health")
                .and_then(|(_, b)| serde_json::from_str(&b).ok())
                .unwrap_or_default();
            monitor_input(&health, "kmsg")["state"] == "down" && health["verdict"] == "unknown"
        }),
        "{health:#}"
    );
    assert_eq!(health["reason"], "MonitorUnavailable", "{health:#}");
    let message = health["monitor"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no-kmsg-here"), "{health:#}");

    let (code, metrics) = http_get(&addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    let up = metrics
        .lines()
        .find(|l| l.starts_with("gpuwatch_monitor_up{") && l.contains("input=\"kmsg\""))
        .unwrap_or_else(|| panic!("no kmsg monitor gauge in {metrics}"));
    assert!(up.ends_with(" 0"), "{up}");

    assert!(
        !agent
            .logs("Kernel log input is unavailable; retrying.")
            .is_empty(),
        "{:#?}",
        agent.stderr.get()
    );
    let (status, _, _) = agent.stop();
    assert_eq!(status, Some(0), "clean exit on SIGTERM");
}

/// Text logs to a pipe (kubectl logs, journald) carried ANSI
/// colour codes.
#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let replay = dir.path().join("replay.kmsg");
    std::fs::write(
        &replay,
        "4,1,100,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["run", "--no-nvml", "--exit-at-eof", "--log-format", "text"])
        .args(["--api-listen", "127.0.0.1:0", "--node-name", "n1"])
        .arg("--kmsg-path")
        .arg(&replay)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("gpuwatch started."), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "escape sequences in piped logs: {stderr:?}"
    );
}

/// CPU seconds (user + system) the process has used, from `/proc/PID/stat`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// Some container runtimes map `/dev/null` over `/dev/kmsg`: a character
/// device that returns end of file at once. That is reported as the kernel
/// log being unavailable and retried after the retry interval, not read in a
/// busy loop; readiness is not held back and SIGTERM ends the agent.
#[test]
fn dev_null_as_the_kernel_log_is_reported_without_a_busy_loop() {
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(&dir.path().join("state"), &["--kmsg-path", "/dev/null"]);
    let addr = agent.api_addr().expect("API address logged");
    let mut body = String::new();
    assert!(
        wait_until(T, || {
            body = http_get(&addr, "/v1/health")
                .map(|r| r.1)
                .unwrap_or_default();
            body.contains("end of file")
        }),
        "not reported: {body}"
    );
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(monitor_input(&health, "kmsg")["state"], "down", "{body}");
    assert_ne!(health["verdict"], "unhealthy", "{body}");
    assert!(wait_until(T, || http_get(&addr, "/readyz").is_some_and(|r| r.0 == 200)));
    let before = cpu_secs(agent.child.id());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_secs(agent.child.id()) - before;
    assert!(used < 0.3, "{used:.2} CPU seconds in 3 s: a busy loop");
    let started = std::time::Instant::now();
    let (status, _, _) = agent.stop();
    assert_eq!(status, Some(0));
    assert!(started.elapsed() < Duration::from_secs(10));
}
