//! The `gpuwatch` binary's agent-side commands: `check-config` and
//! `run --kmsg-path FILE --exit-at-eof` (the replay mode benchmarks use).

use std::path::Path;
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
