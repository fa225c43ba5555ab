//! The NIC monitor through the agent: the real sysfs reader over a fake
//! tree, the engine, `/v1/health`, `/metrics` and the stdout records. A
//! port down past the grace is `NICPortDown`, three flaps are
//! `NICPortFlapping` until a quiet window passes, and counters that read
//! high from the start count nothing.

use crate::common::{TestAgent, http_get, wait_until};
use gpuwatch_test_support::sysfs::FakeSysfs;
use std::time::Duration;

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
    let cfg = config(dir.path(), &sysfs);
    let agent = TestAgent::start(
        &dir.path().join("state"),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--sysfs-root",
            sysfs.root().to_str().unwrap(),
            "--kmsg-path",
            "/dev/null",
            "--prometheus",
        ],
    );
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
