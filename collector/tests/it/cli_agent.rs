//! The `gpuwatch` binary's agent-side commands: `check-config`,
//! `run --kmsg-path FILE --exit-at-eof` (the replay mode benchmarks use) and
//! what a running agent's configuration and environment make of `/metrics`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn gpuwatch() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
}

#[test]
fn check_config_accepts_the_example_and_lists_every_problem() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/gpuwatch.example.toml");
    let out = gpuwatch()
        .arg("check-config")
        .arg(&example)
        .env("NODE_NAME", "cli-node")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with(": OK\n"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "node_name = \"n1\"\nstate_dir = \"rel\"\n[kmsg]\ncursor_interval_ms = 0\n[api]\nlisten = \"x\"\n",
    )
    .unwrap();
    let out = gpuwatch().arg("check-config").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for key in ["state_dir:", "kmsg.cursor_interval_ms:", "api.listen:"] {
        assert!(text.contains(key), "{key} missing in {text}");
    }

    std::fs::write(&bad, "[kmsg]\npaht = \"/dev/kmsg\"\n").unwrap();
    let out = gpuwatch().arg("check-config").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("bad.toml:2:1: key `kmsg.paht`"), "{text}");
}

/// The problems the OTLP exporter would meet at start are check-config's
/// too: a bad `OTEL_EXPORTER_OTLP_ENDPOINT` in the environment and a TLS
/// file that is not there; with the export off, neither matters.
#[test]
fn check_config_sees_the_otlp_environment_and_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("otlp.toml");
    let missing = dir.path().join("no-such-ca.pem");
    std::fs::write(
        &cfg,
        format!(
            "node_name = \"n1\"\n[otlp]\nenabled = true\nprotocol = \"grpc\"\n[otlp.tls]\nca_file = {missing:?}\n"
        ),
    )
    .unwrap();
    let out = gpuwatch()
        .arg("check-config")
        .arg(&cfg)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "ht!tp://not a url")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{text}");
    assert!(text.contains("otlp.tls.ca_file: cannot read"), "{text}");
    assert!(text.contains("no-such-ca.pem"), "{text}");

    std::fs::write(&cfg, "node_name = \"n1\"\n[otlp]\nenabled = false\n").unwrap();
    let out = gpuwatch()
        .arg("check-config")
        .arg(&cfg)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "ht!tp://not a url")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn replay_with_exit_at_eof_prints_a_summary_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let replay = dir.path().join("replay.kmsg");
    let mut text = String::new();
    for i in 0..1000u64 {
        if i % 100 == 50 {
            text.push_str(&format!(
                "3,{i},{},-;NVRM: Xid (PCI:0000:{:02x}:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
                i * 10,
                i / 100
            ));
        } else {
            text.push_str(&format!("6,{i},{},-;eth0: periodic line {i}\n", i * 10));
        }
    }
    std::fs::write(&replay, text).unwrap();
    let out = gpuwatch()
        .args([
            "run",
            "--no-nvml",
            "--exit-at-eof",
            "--sink",
            "stdout",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .args(["--node-name", "bench"])
        .arg("--kmsg-path")
        .arg(&replay)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 10, "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stderr
        .lines()
        .find_map(|l| l.strip_prefix("gpuwatch-summary "))
        .expect("summary line");
    let v: serde_json::Value = serde_json::from_str(summary).unwrap();
    assert_eq!(v["records"], 1000);
    assert_eq!(v["kmsg_events"], 10);
    assert_eq!(v["stopped_by"], "end_of_input");
    assert_eq!(v["records_lost"], 0);
    assert!(v["latency_p99_us"].as_f64().is_some());
    assert!(v["peak_rss_kib"].as_u64().unwrap() > 0);
}

#[test]
fn invalid_flags_fail_with_a_clear_message() {
    let out = gpuwatch()
        .args(["run", "--api-listen", "not-an-address", "--no-nvml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("api.listen"), "{err}");
}

/// An `[engine]` or `[nvml]` value the agent would refuse at start is a
/// `check-config` problem too, named by its key, all of them in one report;
/// `run` refuses the same file naming the same keys.
#[test]
fn check_config_and_run_name_the_same_engine_and_nvml_problems() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        format!(
            "node_name = \"n1\"\nstate_dir = {:?}\n[engine]\ntick_interval_ms = 5\nplacement_wait_ms = 60000\n[nvml]\ncall_timeout_ms = 50\npoll_interval_ms = 1\n",
            dir.path().join("state")
        ),
    )
    .unwrap();
    let keys = [
        "engine.tick_interval_ms:",
        "engine.placement_wait_ms:",
        "nvml.poll_interval_ms:",
        "nvml.call_timeout_ms:",
    ];
    let out = gpuwatch().arg("check-config").arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("4 configuration problem(s)"), "{text}");
    for key in keys {
        assert!(text.contains(key), "{key} missing in {text}");
    }

    let replay = dir.path().join("empty.kmsg");
    std::fs::write(&replay, "").unwrap();
    let out = gpuwatch()
        .arg("run")
        .arg("--config")
        .arg(&cfg)
        .arg("--kmsg-path")
        .arg(&replay)
        .arg("--exit-at-eof")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for key in keys {
        assert!(err.contains(key), "{key} missing in {err}");
    }
    assert!(!dir.path().join("state").exists(), "nothing starts: {err}");
}

/// The JSON log lines of a finished `gpuwatch run --log-format json`.
fn json_logs(stderr: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `gpuwatch run` (hermetic, see [`crate::common::run_command`]) as node
/// `node` with `config`, no NVML, JSON logs, an empty replay file for its
/// kernel log and its state in `dir`; then `flags`.
fn replay_run(dir: &Path, config: &Path, node: &str, flags: &[&str]) -> Command {
    let replay = dir.join("empty.kmsg");
    std::fs::write(&replay, "").unwrap();
    let state = dir.join("state");
    crate::common::run_command(
        &[
            "--no-nvml",
            "--log-format",
            "json",
            "--node-name",
            node,
            "--config",
            config.to_str().unwrap(),
            "--kmsg-path",
            replay.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            // Tests run in parallel: the default port would be taken twice.
            "--api-listen",
            "127.0.0.1:0",
        ],
        flags,
    )
}

/// `gpuwatch run` over an empty replay file with OTLP on and the given
/// config file, environment endpoint and flags; it exits at the end of
/// the file. The endpoints are closed loopback ports: every export fails
/// at once, which is not what these tests look at.
fn run_otlp(
    dir: &Path,
    config: &Path,
    env_endpoint: Option<&str>,
    extra: &[&str],
) -> std::process::Output {
    let flags: Vec<&str> = ["--exit-at-eof"].iter().chain(extra).copied().collect();
    let mut cmd = replay_run(dir, config, "otlp-source", &flags);
    cmd.env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT");
    if let Some(url) = env_endpoint {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", url);
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The start line of each signal's export: (signal, endpoint, source).
fn endpoint_lines(logs: &[serde_json::Value]) -> Vec<(String, String, String)> {
    logs.iter()
        .filter(|l| {
            l["message"] == "OTLP metric export started."
                || l["message"] == "OTLP fault log export started."
        })
        .map(|l| {
            let field = |k: &str| l[k].as_str().unwrap_or_default().to_owned();
            (field("signal"), field("endpoint"), field("source"))
        })
        .collect()
}

fn warnings(logs: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    logs.iter().filter(|l| l["level"] == "WARN").collect()
}

/// `dir/gpuwatch.toml` with OTLP on over gRPC, to `endpoint` when given.
fn otlp_config(dir: &Path, endpoint: Option<&str>) -> PathBuf {
    let config = dir.join("gpuwatch.toml");
    let endpoint = endpoint.map_or(String::new(), |e| format!("endpoint = \"{e}\"\n"));
    std::fs::write(
        &config,
        format!("[otlp]\nenabled = true\nprotocol = \"grpc\"\n{endpoint}"),
    )
    .unwrap();
    config
}

/// Both signals' start lines say they export to `url`, from `source`.
fn assert_both_signals_use(logs: &[serde_json::Value], url: &str, source: &str) {
    assert_eq!(
        endpoint_lines(logs),
        [
            ("metrics".into(), url.into(), source.into()),
            ("logs".into(), url.into(), source.into()),
        ],
        "{logs:#?}"
    );
}

/// The shipped config sets `[otlp] endpoint`; an operator's
/// `OTEL_EXPORTER_OTLP_ENDPOINT` then loses. The start says which endpoint
/// each signal uses and where it comes from, and warns once about the
/// ignored variable with what makes it win.
#[test]
fn run_says_a_config_endpoint_wins_over_the_env_and_warns_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = otlp_config(dir.path(), Some("http://127.0.0.1:9"));
    let out = run_otlp(dir.path(), &config, Some("http://127.0.0.1:7"), &[]);
    let logs = json_logs(&out.stderr);
    assert_both_signals_use(&logs, "http://127.0.0.1:9", "config [otlp] endpoint");
    let warned = warnings(&logs);
    let ignored: Vec<_> = warned
        .iter()
        .filter(|w| w["ignored"] == "OTEL_EXPORTER_OTLP_ENDPOINT")
        .collect();
    assert_eq!(ignored.len(), 1, "one line for both signals: {warned:#?}");
    let w = ignored[0];
    assert_eq!(w["ignored_value"], "http://127.0.0.1:7");
    assert_eq!(w["source"], "config [otlp] endpoint");
    assert_eq!(w["endpoint"], "http://127.0.0.1:9");
    assert_eq!(w["signal"], "metrics,logs");
    let message = w["message"].as_str().unwrap();
    assert!(
        message.contains("remove `[otlp] endpoint` from the config"),
        "{message}"
    );
}

/// `--otlp-endpoint` wins over the file and the environment, and the
/// warning about the variable says to drop the flag as well.
#[test]
fn run_says_the_otlp_endpoint_flag_wins_over_config_and_env() {
    let dir = tempfile::tempdir().unwrap();
    let config = otlp_config(dir.path(), Some("http://127.0.0.1:9"));
    let out = run_otlp(
        dir.path(),
        &config,
        Some("http://127.0.0.1:7"),
        &["--otlp-endpoint", "http://127.0.0.1:8"],
    );
    let logs = json_logs(&out.stderr);
    assert_both_signals_use(&logs, "http://127.0.0.1:8", "--otlp-endpoint flag");
    let warned = warnings(&logs);
    let w = warned
        .iter()
        .find(|w| w["ignored"] == "OTEL_EXPORTER_OTLP_ENDPOINT")
        .unwrap_or_else(|| panic!("no warning about the variable: {warned:#?}"));
    assert_eq!(w["source"], "--otlp-endpoint flag");
    assert_eq!(w["endpoint"], "http://127.0.0.1:8");
    assert!(
        w["message"]
            .as_str()
            .unwrap()
            .contains("drop the --otlp-endpoint flag and remove `[otlp] endpoint` from the config"),
        "{w}"
    );
}

/// The same URL in the config and the environment: the file's is used,
/// nothing to warn about.
#[test]
fn run_warns_of_nothing_when_config_and_env_name_the_same_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = otlp_config(dir.path(), Some("http://127.0.0.1:9"));
    let out = run_otlp(dir.path(), &config, Some("http://127.0.0.1:9/"), &[]);
    let logs = json_logs(&out.stderr);
    assert_eq!(endpoint_lines(&logs).len(), 2, "{logs:#?}");
    assert!(
        !warnings(&logs).iter().any(|w| w.get("ignored").is_some()),
        "{logs:#?}"
    );
}

/// Only the environment names an endpoint: it is used and named.
#[test]
fn run_uses_and_names_an_env_endpoint_the_config_leaves_open() {
    let dir = tempfile::tempdir().unwrap();
    let config = otlp_config(dir.path(), None);
    let out = run_otlp(dir.path(), &config, Some("http://127.0.0.1:7"), &[]);
    let logs = json_logs(&out.stderr);
    assert_both_signals_use(&logs, "http://127.0.0.1:7", "OTEL_EXPORTER_OTLP_ENDPOINT");
}

/// check-config reads the environment as the agent does: the same warning,
/// and the file is still OK.
#[test]
fn check_config_warns_about_an_overridden_otlp_env_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        "node_name = \"n1\"\n[otlp]\nenabled = true\nprotocol = \"grpc\"\nendpoint = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let check = |env: &str| {
        gpuwatch()
            .arg("check-config")
            .arg(&config)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", env)
            .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
            .output()
            .unwrap()
    };
    let out = check("http://127.0.0.1:7");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().next(),
        Some(
            "warning: OTEL_EXPORTER_OTLP_ENDPOINT \"http://127.0.0.1:7\" is not used for OTLP \
             metrics and logs: config [otlp] endpoint \"http://127.0.0.1:9\" wins over it; to \
             use the variable, remove `[otlp] endpoint` from the config."
        ),
        "{text}"
    );
    assert!(text.ends_with(": OK\n"), "{text}");

    let out = check("http://127.0.0.1:9");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("warning"), "{text}");
}

#[test]
fn an_empty_otlp_endpoint_flag_is_refused_naming_it() {
    let out = gpuwatch()
        .args(["run", "--no-nvml", "--otlp-endpoint", ""])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--otlp-endpoint"), "{err}");
    assert!(err.contains("empty"), "{err}");
}

/// A running `gpuwatch run`, killed when dropped (a failed assertion must
/// not leave it running).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `/metrics` of a running agent with Prometheus on, `[api]
/// otel_scope_labels = scope_labels`, `[otlp.resource_attributes]` setting
/// `k8s.cluster.name` (the OTLP export off) and an `OTEL_RESOURCE_ATTRIBUTES`
/// that also names the agent's own pod, as manifests of older releases did.
fn metrics_with_scope_labels(scope_labels: bool) -> String {
    use crate::common::{Lines, http_get, wait_until};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[api]\nprometheus = true\notel_scope_labels = {scope_labels}\n\
             [otlp.resource_attributes]\n\"k8s.cluster.name\" = \"prod\"\n\
             [kubelet]\npod_resources_socket = \"\"\n"
        ),
    )
    .unwrap();
    let mut cmd = replay_run(dir.path(), &config, "scope-node", &[]);
    cmd.env(
        "OTEL_RESOURCE_ATTRIBUTES",
        "team=gpu-infra,k8s.pod.name=gpuwatch-abcde,k8s.namespace.name=gpuwatch",
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let mut agent = Running(cmd.spawn().expect("start gpuwatch"));
    let stderr = Lines::default();
    stderr.spawn_reader(agent.0.stderr.take().expect("stderr piped"));
    let api = || {
        stderr
            .logs("API listening.")
            .first()
            .and_then(|v| v["addr"].as_str().map(str::to_owned))
    };
    let mut text = String::new();
    assert!(
        wait_until(Duration::from_secs(20), || {
            if let Some((200, body)) = api().and_then(|a| http_get(&a, "/metrics")) {
                text = body;
            }
            !text.is_empty()
        }),
        "no /metrics; agent log:\n{}",
        stderr.tail(40)
    );
    text
}

/// One `target_info` with the whole resource the OTLP export resolves
/// (`OTEL_RESOURCE_ATTRIBUTES` and `[otlp.resource_attributes]`), never the
/// agent's own pod.
fn assert_target_info_is_the_resource(text: &str) {
    let target_info: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("target_info{"))
        .collect();
    assert_eq!(target_info.len(), 1, "{text}");
    for kv in [
        "team=\"gpu-infra\"",
        "k8s_cluster_name=\"prod\"",
        "service_name=\"gpuwatch\"",
        "service_instance_id=\"scope-node\"",
        "k8s_node_name=\"scope-node\"",
    ] {
        assert!(target_info[0].contains(kv), "{kv}: {}", target_info[0]);
    }
    for own in ["k8s_pod_name", "k8s_namespace_name"] {
        assert!(!target_info[0].contains(own), "{own}: {}", target_info[0]);
    }
}

/// Every series but `target_info` (at least 3) carries `otel_scope_name` /
/// `otel_scope_version` exactly when `scope_labels`.
fn assert_scope_labels(text: &str, scope_labels: bool) {
    let series: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("target_info"))
        .collect();
    assert!(series.len() >= 3, "{text}");
    for l in series {
        assert_eq!(
            l.contains("otel_scope_name=\"gpuwatch\"") && l.contains("otel_scope_version=\""),
            scope_labels,
            "otel_scope_labels = {scope_labels}: {l}"
        );
    }
}

/// `/metrics` of the running binary follows the OTel -> Prometheus
/// compatibility rules: `target_info` carries the whole resource the OTLP
/// export resolves (with the OTLP export off too), never the agent's own
/// pod; every other series carries `otel_scope_name` /
/// `otel_scope_version`.
#[test]
fn metrics_target_info_has_the_environment_resource_and_scope_labels() {
    let text = metrics_with_scope_labels(true);
    assert_target_info_is_the_resource(&text);
    assert_scope_labels(&text, true);
}

/// `[api] otel_scope_labels = false` leaves the scope labels out, and
/// `target_info` is the same.
#[test]
fn metrics_scope_labels_switch_off_leaves_them_out() {
    let text = metrics_with_scope_labels(false);
    assert_target_info_is_the_resource(&text);
    assert_scope_labels(&text, false);
}
