//! The NIC monitor through the agent: the real sysfs reader over a fake
//! tree, the engine, `/v1/health`, `/metrics` and the stdout records. A
//! port down past the grace is `NICPortDown`, three flaps are
//! `NICPortFlapping` until a quiet window passes; counters that read high
//! from the start count nothing, one raised to its maximum is saturated and
//! a steady one is not. A counter read that does not return
//! makes the network Unknown (the monitor down, naming the file) until it
//! returns, and does not hold up the agent's stop. AWS EFA devices are
//! never "up": healthy in words that say what was read, `NICErrorRate` when
//! a counter rises over its bucket (and back after the quiet time),
//! `NICPortDown` when a device leaves sysfs.

use crate::common::{TestAgent, http_get, wait_until};
use gpuwatch_test_support::sysfs::FakeSysfs;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn config(dir: &std::path::Path, sysfs: &FakeSysfs, extra: &str) -> std::path::PathBuf {
    let path = dir.join("gpuwatch.toml");
    std::fs::write(
        &path,
        format!(
            "[network]\nsysfs_root = {:?}\npoll_interval_ms = 100\ndown_grace_secs = 1\n\
             flap_threshold = 3\nflap_window_secs = 60\nflap_quiet_secs = 3\n{extra}",
            sysfs.root()
        ),
    )
    .unwrap();
    path
}

/// The agent over `sysfs` (no kernel log, no NVML), state and config in `dir`.
fn start(dir: &std::path::Path, sysfs: &FakeSysfs) -> TestAgent {
    start_with(dir, sysfs, "")
}

/// As [`start`], with more `[network]` lines.
fn start_with(dir: &std::path::Path, sysfs: &FakeSysfs, extra: &str) -> TestAgent {
    let cfg = config(dir, sysfs, extra);
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

/// The `/v1/health` entry of the port of `device`.
fn port_health(network: &serde_json::Value, device: &str) -> serde_json::Value {
    network["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["device"] == device))
        .cloned()
        .unwrap_or_else(|| panic!("no port of {device}: {network:#}"))
}

/// A port's `saturated_counters` (absent when none).
fn saturated(port: &serde_json::Value) -> Vec<String> {
    port["saturated_counters"]
        .as_array()
        .map(|a| a.iter().map(|c| c.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The `/metrics` lines of `name` (`hw_errors_total`) whose labels include
/// every one of `labels`.
fn metric_lines(addr: &str, name: &str, labels: &[&str]) -> Vec<String> {
    let (_, metrics) = http_get(addr, "/metrics").expect("/metrics answers");
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_port_goes_down_then_flaps_then_quiets_and_the_gpus_never_hear_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = FakeSysfs::node_of(2);
    let agent = start(dir.path(), &sysfs);
    let addr = agent.api_addr().expect("API address logged");
    // Once the first scan is in (the reason alone has read NICHealthy
    // before both ports were there).
    let mut n = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            n = network(&addr);
            n["ports"].as_array().map(Vec::len) == Some(2)
        }),
        "no first scan: {n:#}"
    );
    assert_eq!(n["reason"], "NICHealthy", "{n:#}");
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

    // Back up (the first flap), then three flaps quicker than the poll,
    // seen only in `carrier_changes` (the state files never show them):
    // flapping, until the quiet window.
    sysfs.set_port_up("mlx5_1", 1);
    wait_reason(&addr, "NICHealthy");
    assert!(agent.wait_events("NICPortRecovered", 1, T));
    for _ in 0..3 {
        sysfs.flap_port("mlx5_1", 1);
    }
    let n = wait_reason(&addr, "NICPortFlapping");
    let port = port_health(&n, "mlx5_1");
    assert_eq!(port["flaps_total"], 4, "{port:#}");
    let n = wait_reason(&addr, "NICHealthy");
    assert_eq!(n["problem"], false);

    // Metrics: both ports up, the flaps counted.
    let up = metric_lines(&addr, "hw_network_up", &[]);
    assert_eq!(up.len(), 2, "{up:?}");
    assert!(up.iter().all(|l| l.ends_with(" 1")), "{up:?}");
    assert_eq!(
        metric_lines(&addr, "gpuwatch_network_flaps_total", &["mlx5_1/1"]).len(),
        1
    );
    agent.stop();
}

/// Counters that read high from the first scan count nothing: the 4-bit
/// overrun counter at its maximum (a healthy H100 node can read 15 there for
/// ever) is listed as saturated, a steady 7 is not. Raised to its 16-bit
/// maximum during the run, `symbol_error` counts the rise and is saturated
/// from then on, in `/v1/health` and `/metrics`, without a problem.
#[test]
fn counters_high_from_the_start_count_nothing_and_one_raised_to_its_maximum_is_saturated() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = FakeSysfs::node_of(2);
    sysfs.set_counter("mlx5_0", 1, "excessive_buffer_overrun_errors", 15);
    sysfs.set_counter("mlx5_1", 1, "symbol_error", 7);
    let agent = start(dir.path(), &sysfs);
    let addr = agent.api_addr().expect("API address logged");
    let mut last = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            last = network(&addr);
            last["ports"].as_array().map(Vec::len) == Some(2)
        }),
        "no first scan: {last:#}"
    );
    let p0 = port_health(&last, "mlx5_0");
    assert_eq!(
        saturated(&p0),
        ["excessive_buffer_overrun_errors"],
        "{p0:#}"
    );
    // `error_counts` lists the counters that counted something.
    assert!(
        p0["error_counts"]["excessive_buffer_overrun_errors"].is_null(),
        "{p0:#}"
    );
    let p1 = port_health(&last, "mlx5_1");
    assert!(saturated(&p1).is_empty(), "steady at 7: {p1:#}");
    assert!(p1["error_counts"]["symbol_error"].is_null(), "{p1:#}");

    sysfs.set_counter("mlx5_1", 1, "symbol_error", 65_535);
    assert!(
        wait_until(T, || {
            last = network(&addr);
            saturated(&port_health(&last, "mlx5_1")) == ["symbol_error"]
        }),
        "symbol_error at 65535 never saturated: {last:#}"
    );
    let p1 = port_health(&last, "mlx5_1");
    assert_eq!(p1["error_counts"]["symbol_error"], 65_528, "{p1:#}");
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");
    assert_eq!(
        saturated(&port_health(&last, "mlx5_0")),
        ["excessive_buffer_overrun_errors"]
    );

    let errors = metric_lines(&addr, "hw_errors_total", &[]);
    assert_eq!(errors.len(), 1, "only the rise counts: {errors:?}");
    assert!(
        errors[0].contains("mlx5_1/1")
            && errors[0].contains("error_type=\"symbol_error\"")
            && errors[0].ends_with(" 65528"),
        "{errors:?}"
    );
    for device in ["mlx5_0/1", "mlx5_1/1"] {
        let lines = metric_lines(
            &addr,
            "gpuwatch_network_counters_unusable",
            &[device, "state=\"saturated\""],
        );
        assert!(
            lines.len() == 1 && lines[0].ends_with(" 1"),
            "{device}: {lines:?}"
        );
    }
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

/// The network part of `/v1/health` once `pred` holds for it.
fn wait_network(
    addr: &str,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            last = network(addr);
            pred(&last)
        }),
        "{what}: {last:#}"
    );
    last
}

/// The stall is logged once, as a warning naming the stuck file `fifo`, and
/// nothing says it reads again.
fn assert_stall_warned_once(agent: &TestAgent, fifo: &std::path::Path) {
    // That the watchdog reports a stall once however many ticks it lasts is
    // `Watchdog::check`'s, on an injected clock in gpuwatch-core; it is
    // still one after the recovery.
    assert!(wait_until(T, || !agent.logs(STUCK).is_empty()));
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
}

/// Stuck again (another counter, the monitor down naming it): SIGTERM does
/// not wait for the read; the NIC poller is abandoned and gpuwatch exits 0
/// within 5 s.
fn assert_sigterm_leaves_a_stuck_read_behind(agent: TestAgent, addr: &str, sysfs: &FakeSysfs) {
    let fifo =
        std::fs::canonicalize(sysfs.make_counter_blocking("mlx5_0", 1, "symbol_error")).unwrap();
    let last = wait_network(addr, "the monitor never went down again", |n| {
        n["monitor_ok"] == false
    });
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
    let last = wait_network(&addr, "no first scan", |n| {
        n["monitor_ok"] == true && n["ports"].as_array().map(Vec::len) == Some(2)
    });
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");
    assert_eq!(network_up_metric(&addr).as_deref(), Some("1"));

    // The reader opens the files at their resolved paths (under
    // /sys/devices), and names them so.
    let fifo = std::fs::canonicalize(sysfs.make_counter_blocking(
        "mlx5_1",
        1,
        "hw_counters/out_of_buffer",
    ))
    .unwrap();
    let stuck_at = Instant::now();
    let last = wait_network(&addr, "the monitor never went down", |n| {
        n["monitor_ok"] == false
    });
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
    assert_stall_warned_once(&agent, &fifo);

    // The read returns: the real verdict is back, by itself.
    sysfs.unblock_counter("mlx5_1", 1, "hw_counters/out_of_buffer", 7);
    let last = wait_network(&addr, "the monitor never came back", |n| {
        n["monitor_ok"] == true
    });
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");
    assert_eq!(last["monitor_message"], "", "{last:#}");
    assert_eq!(network_up_metric(&addr).as_deref(), Some("1"));
    assert!(wait_until(T, || agent.logs(READS_AGAIN).len() == 1));
    assert_eq!(agent.logs(STUCK).len(), 1);

    assert_sigterm_leaves_a_stuck_read_behind(agent, &addr, &sysfs);
}

/// Two EFA devices just scanned: NICHealthy saying what it read (presence
/// and error-counter rates), every port `state_unreported`, never "up".
fn assert_efa_healthy_by_presence(addr: &str) {
    let last = wait_network(addr, "no first scan", |n| {
        n["ports"].as_array().map(Vec::len) == Some(2)
    });
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");
    let message = last["message"].as_str().unwrap();
    assert!(
        message.starts_with("2 AWS EFA devices present, no error-rate breach")
            && message.contains("judged by presence and error-counter rates"),
        "{message}"
    );
    for p in last["ports"].as_array().unwrap() {
        assert_eq!(p["status"], "state_unreported", "{p:#}");
        assert_eq!(p["link_layer"], "efa", "{p:#}");
    }
}

/// The rx_drops breach on rdmap17s0 as an event (kind nic, warning, the
/// device, counter and link layer) and in `/metrics` (one rate breach, the
/// problem gauge), with no up/down series for an EFA port.
fn assert_efa_breach_reported(agent: &TestAgent, addr: &str) {
    assert!(
        agent.wait_events("NICErrorRate", 1, T),
        "{}",
        agent.stdout.tail(5)
    );
    let ev = &agent.events("NICErrorRate")[0];
    assert_eq!(ev["kind"], "nic");
    assert_eq!(ev["severity"], "warning", "{ev:#}");
    assert_eq!(ev["attributes"]["rdma_device"], "rdmap17s0");
    assert_eq!(ev["attributes"]["nic_counter"], "rx_drops");
    assert_eq!(ev["attributes"]["link_layer"], "efa");
    let (_, metrics) = http_get(addr, "/metrics").unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpuwatch_network_rate_breaches_total{")
                && l.contains("rdmap17s0/1")
                && l.contains("error_type=\"rx_drops\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    assert!(
        !metrics.lines().any(|l| l.starts_with("hw_network_up{")),
        "an EFA port has no up/down: {metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpuwatch_network_problem{") && l.contains("NICErrorRate")),
        "{metrics}"
    );
}

/// Two AWS EFA devices (their ports say ACTIVE/LinkUp, always) through the
/// agent: NICHealthy saying what it read, never a port "up"; counters rising
/// within the EKS node monitoring agent's buckets change nothing, a rise
/// over one is NICErrorRate naming the device and counter (an event, a
/// metric) until flap_quiet passes.
#[test]
fn efa_devices_are_judged_by_counter_rates_never_their_state() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = FakeSysfs::efa_node_of(2);
    let agent = start_with(dir.path(), &sysfs, "expected_ports = { efa = 2 }\n");
    let addr = agent.api_addr().expect("API address logged");
    assert_efa_healthy_by_presence(&addr);

    // Within the buckets: each counter's whole burst at once, seen by a
    // scan, changes nothing. (The refill, 1 a second for ever, is the token
    // bucket's, on an injected clock in gpuwatch-core.)
    sysfs.set_hw_counter("rdmap17s0", 1, "rx_drops", 100);
    sysfs.set_hw_counter("rdmap16s0", 1, "retrans_pkts", 1_000);
    sysfs.set_hw_counter("rdmap16s0", 1, "retrans_bytes", 1_000_000);
    let last = wait_network(&addr, "the rises were never counted", |n| {
        port_health(n, "rdmap17s0")["error_counts"]["rx_drops"] == 100
            && port_health(n, "rdmap16s0")["error_counts"]["retrans_bytes"] == 1_000_000
    });
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");
    assert!(agent.events("NICErrorRate").is_empty());

    // Over: 500 drops at once.
    sysfs.set_hw_counter("rdmap17s0", 1, "rx_drops", 600);
    let n = wait_reason(&addr, "NICErrorRate");
    assert_eq!(n["problem"], true);
    let message = n["message"].as_str().unwrap();
    assert!(
        message.starts_with("rdmap17s0/1 AWS EFA error rate: rx_drops rose by 500"),
        "{message}"
    );
    assert_efa_breach_reported(&agent, &addr);

    // Quiet for flap_quiet (3 s): healthy again, with a recovery record.
    let n = wait_reason(&addr, "NICHealthy");
    assert_eq!(n["problem"], false);
    assert!(agent.wait_events("NICPortRecovered", 1, T));
    agent.stop();
}

/// An AWS EFA device that leaves sysfs is NICPortDown after the grace (an
/// event saying so), and `expected_ports.efa` says how many are missing.
#[test]
fn an_efa_device_that_leaves_sysfs_is_down_and_counted_missing() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = FakeSysfs::efa_node_of(2);
    let agent = start_with(dir.path(), &sysfs, "expected_ports = { efa = 2 }\n");
    let addr = agent.api_addr().expect("API address logged");
    let mut last = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            last = network(&addr);
            last["ports"].as_array().map(Vec::len) == Some(2)
        }),
        "no first scan: {last:#}"
    );
    assert_eq!(last["reason"], "NICHealthy", "{last:#}");

    // Down after the grace, and 1 of 2 present. (The expectation and the
    // port's own status may turn at slightly different moments: wait for
    // both.)
    sysfs.remove_device("rdmap16s0");
    assert!(
        wait_until(T, || {
            last = network(&addr);
            let m = last["message"].as_str().unwrap_or_default();
            last["reason"] == "NICPortDown"
                && m.contains("rdmap16s0/1 AWS EFA down for")
                && m.contains("1 of 2 expected AWS EFA devices present")
        }),
        "{last:#}"
    );
    assert!(agent.wait_events("NICPortDown", 1, T));
    let down = &agent.events("NICPortDown")[0];
    assert!(
        down["message"]
            .as_str()
            .unwrap()
            .contains("disappeared from sysfs"),
        "{down:#}"
    );
    agent.stop();
}
