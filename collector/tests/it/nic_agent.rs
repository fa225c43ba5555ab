//! The NIC monitor through the agent: the real sysfs reader over a fake
//! tree, the engine, `/v1/health`, `/metrics` and the stdout records. A
//! port down past the grace is `NICPortDown`, three flaps are
//! `NICPortFlapping` until a quiet window passes, and counters that read
//! high from the start count nothing. A counter read that does not return
//! makes the network Unknown (the monitor down, naming the file) until it
//! returns, and does not hold up the agent's stop.

use crate::common::{TestAgent, http_get, wait_until};
use gpuwatch_test_support::sysfs::FakeSysfs;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn config(dir: &std::path::Path, sysfs: &FakeSysfs) -> std::path::PathBuf {
    let path = dir.join("gpuwatch.toml");
    std::fs::write(
        &path,
        format!(
            "[network]\nsysfs_root = {:?}\npoll_interval_ms = 100\ndown_grace_secs = 1\n\
             flap_threshold = 3\nflap_window_secs = 60\nflap_quiet_secs = 3\n",
            sysfs.root()
        ),
    )
    .unwrap();
    path
}

/// The agent over `sysfs` (no kernel log, no NVML), state and config in `dir`.
fn start(dir: &std::path::Path, sysfs: &FakeSysfs) -> TestAgent {
    let cfg = config(dir, sysfs);
    TestAgent::start(
        &dir.join("state"),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--sysfs-root",
            sysfs.root().to_str().unwrap(),
            "--kmsg-path",
            "/dev/null",
            "--prometheus",
        ],
    )
}

fn network(addr: &str) -> serde_json::Value {
    http_get(addr, "/v1/health")
        .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
        .map(|h| h["network"].clone())
        .unwrap_or_default()
}

fn wait_reason(addr: &str, reason: &str) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            last = network(addr);
            last["reason"] == reason
        }),
        "network never {reason}: {last:#}"
    );
    last
}

fn flap(sysfs: &FakeSysfs) {
    sysfs.set_port_down("mlx5_1", 1);
    std::thread::sleep(Duration::from_millis(300));
    sysfs.set_port_up("mlx5_1", 1);
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_port_goes_down_then_flaps_then_quiets_and_the_gpus_never_hear_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = FakeSysfs::node_of(2);
    // A healthy H100 node can read 15 here for ever (the 4-bit maximum).
    sysfs.set_counter("mlx5_0", 1, "excessive_buffer_overrun_errors", 15);
    let agent = start(dir.path(), &sysfs);
    let addr = agent.api_addr().expect("API address logged");
    let n = wait_reason(&addr, "NICHealthy");
    assert_eq!(n["ports"].as_array().map(Vec::len), Some(2), "{n:#}");
    assert_eq!(n["problem"], false);

    // Down past the grace.
    sysfs.set_port_down("mlx5_1", 1);
    let n = wait_reason(&addr, "NICPortDown");
    assert!(n["message"].as_str().unwrap().contains("mlx5_1/1"), "{n:#}");
    assert!(
        agent.wait_events("NICPortDown", 1, T),
        "{}",
        agent.stdout.tail(5)
    );
    let ev = &agent.events("NICPortDown")[0];
    assert_eq!(ev["kind"], "nic");
    assert_eq!(ev["attributes"]["rdma_device"], "mlx5_1");
    assert_eq!(ev["attributes"]["netdev"], "eth1");
    // The GPU side never hears of it: no GPU or node fault.
    let health: serde_json::Value =
        serde_json::from_str(&http_get(&addr, "/v1/health").unwrap().1).unwrap();
    assert!(
        health["node_faults"].as_array().is_none_or(Vec::is_empty),
        "{health:#}"
    );
    assert_ne!(health["reason"], "NICPortDown");

    // Back up, then three quick flaps: flapping, until the quiet window.
    sysfs.set_port_up("mlx5_1", 1);
    wait_reason(&addr, "NICHealthy");
    assert!(agent.wait_events("NICPortRecovered", 1, T));
    for _ in 0..3 {
        flap(&sysfs);
    }
    let n = wait_reason(&addr, "NICPortFlapping");
    let port = n["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["device"] == "mlx5_1")
        .unwrap()
        .clone();
    assert!(port["flaps_total"].as_u64().unwrap() >= 4, "{port:#}");
    let n = wait_reason(&addr, "NICHealthy");
    assert_eq!(n["problem"], false);

    // Metrics: both ports up, the flaps counted, and the saturated overrun
    // counter never counted as errors.
    let (_, metrics) = http_get(&addr, "/metrics").unwrap();
    let up: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("hw_network_up{"))
        .collect();
    assert_eq!(up.len(), 2, "{metrics}");
    assert!(up.iter().all(|l| l.ends_with(" 1")), "{up:?}");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpuwatch_network_flaps_total{") && l.contains("mlx5_1/1")),
        "{metrics}"
    );
    assert!(
        !metrics.lines().any(|l| l.starts_with("hw_errors_total{")),
        "{metrics}"
    );
    agent.stop();
}

fn network_up_metric(addr: &str) -> Option<String> {
    let (_, metrics) = http_get(addr, "/metrics")?;
    metrics
        .lines()
        .find(|l| l.starts_with("gpuwatch_monitor_up{") && l.contains("input=\"network\""))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

const STUCK: &str =
    "An input is stuck; what it covers is reported as unknown until it makes progress again.";
const READS_AGAIN: &str = "An input that was stuck makes progress again.";

/// A FIFO in a counter's place blocks the poller in its `open`, as a hung
/// firmware command blocks an mlx5 `hw_counters` read. Within the deadline
/// (3 poll intervals, at least 5 s) the monitor is down, naming the file,
/// logged once, `gpuwatch_monitor_up{input="network"}` 0; when the read
/// returns, the real verdict is back (logged once). Stuck again, the agent
/// still stops at once on SIGTERM.
#[test]
fn a_stuck_counter_read_makes_the_network_unknown_until_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = FakeSysfs::node_of(2);
    let agent = start(dir.path(), &sysfs);
    let addr = agent.api_addr().expect("API address logged");
    let mut last = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            last = network(&addr);
            last["monitor_ok"] == true && last["ports"].as_array().map(Vec::len) == Some(2)
        }),
        "no first scan: {last:#}"
    );
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");
    assert_eq!(network_up_metric(&addr).as_deref(), Some("1"));

    // The reader opens the files at their resolved paths (under
    // /sys/devices), and names them so.
    let resolved = |p: std::path::PathBuf| std::fs::canonicalize(&p).unwrap();
    let fifo = resolved(sysfs.make_counter_blocking("mlx5_1", 1, "hw_counters/out_of_buffer"));
    let stuck_at = Instant::now();
    assert!(
        wait_until(T, || {
            last = network(&addr);
            last["monitor_ok"] == false
        }),
        "the monitor never went down: {last:#}"
    );
    let waited = stuck_at.elapsed();
    // Not before the deadline (less the poll interval the read may have
    // started early), and not long after it.
    assert!(waited >= Duration::from_millis(4800), "{waited:?}");
    assert!(waited < Duration::from_secs(12), "{waited:?}");
    let message = last["monitor_message"].as_str().unwrap();
    assert!(
        message.contains(&format!("reading {} has not returned for", fifo.display())),
        "{message}"
    );
    assert_eq!(last["problem"], false, "a blind monitor is no verdict");
    assert_eq!(network_up_metric(&addr).as_deref(), Some("0"));
    // Several watchdog ticks later: still one warning.
    std::thread::sleep(Duration::from_millis(1500));
    let warned = agent.logs(STUCK);
    assert_eq!(warned.len(), 1, "{}", agent.stderr.tail(10));
    assert_eq!(warned[0]["level"], "WARN");
    assert!(
        warned[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains(fifo.to_str().unwrap())),
        "{}",
        warned[0]
    );
    assert!(agent.logs(READS_AGAIN).is_empty());

    // The read returns: the real verdict is back, by itself.
    sysfs.unblock_counter("mlx5_1", 1, "hw_counters/out_of_buffer", 7);
    assert!(
        wait_until(T, || {
            last = network(&addr);
            last["monitor_ok"] == true
        }),
        "the monitor never came back: {last:#}"
    );
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");
    assert_eq!(last["monitor_message"], "", "{last:#}");
    assert_eq!(network_up_metric(&addr).as_deref(), Some("1"));
    assert!(wait_until(T, || agent.logs(READS_AGAIN).len() == 1));
    assert_eq!(agent.logs(STUCK).len(), 1);

    // Stuck again (another counter): SIGTERM does not wait for the read.
    let fifo = resolved(sysfs.make_counter_blocking("mlx5_0", 1, "symbol_error"));
    assert!(
        wait_until(T, || {
            last = network(&addr);
            last["monitor_ok"] == false
        }),
        "the monitor never went down again: {last:#}"
    );
    assert!(
        last["monitor_message"]
            .as_str()
            .unwrap()
            .contains(fifo.to_str().unwrap()),
        "{last:#}"
    );
    let stopping = Instant::now();
    let (code, _, stderr) = agent.stop();
    let took = stopping.elapsed();
    assert_eq!(code, Some(0), "{}", stderr.tail(10));
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");
    assert!(
        stderr
            .logs("A thread did not stop in time; abandoning it so that gpuwatch exits.")
            .iter()
            .any(|l| l["thread"] == "NIC poller"),
        "{}",
        stderr.tail(10)
    );
}
