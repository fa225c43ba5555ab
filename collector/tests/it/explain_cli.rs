//! `gpuwatch explain`: calls `gpuwatch::explain` directly with the default policy and
//! with overrides, in both formats.

use gpuwatch::{ExplainArgs, ExplainError, ExplainFormat, explain};
use gpuwatch_proto::Action;
use xid_parser::{Policy, PolicyOverrides, XidOverride};

fn run(args: ExplainArgs, policy: &Policy) -> String {
    let mut out = Vec::new();
    explain(&args, policy, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn one(xid: u32, format: ExplainFormat) -> ExplainArgs {
    ExplainArgs {
        xid: Some(xid),
        all: false,
        network: false,
        format,
    }
}

fn all(format: ExplainFormat) -> ExplainArgs {
    ExplainArgs {
        xid: None,
        all: true,
        network: false,
        format,
    }
}

#[test]
fn text_for_xid_79_names_action_buckets_runbook_and_peers() {
    let text = run(one(79, ExplainFormat::Text), &Policy::default());
    assert!(
        text.starts_with(
            "XID 79: GPU has fallen off the bus (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS)\n"
        ),
        "{text}"
    );
    for needle in [
        "gpuwatch action:",
        "reboot_node (severity error)",
        "RESTART_BM",
        "CONTACT_SUPPORT",
        "kubectl drain",
        "REBOOT_SYSTEM+HARDWARE_INSPECTION",
        "node-fatal",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("  overridden:") && l.ends_with(" no")),
        "{text}"
    );
    assert!(text.lines().all(|l| l.len() <= 100), "{text}");
}

#[test]
fn json_for_one_code_is_one_object() {
    let json = run(one(48, ExplainFormat::Json), &Policy::default());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["code"], 48);
    assert_eq!(v["action"], "reset_gpu");
    assert_eq!(v["severity"], "error");
    assert_eq!(v["nvidia_immediate"], "WORKFLOW_XID_48");
    assert!(v["context_rule"].as_str().unwrap().contains("63 or 64"));
    assert_eq!(v["overridden"], false);
    assert_eq!(v["recurrence_reboots"], 2);
    assert!(
        v["other_agents"]["gpud"]
            .as_str()
            .unwrap()
            .contains("REBOOT_SYSTEM")
    );
}

#[test]
fn unknown_code_is_explained_with_the_default_not_an_error() {
    let json = run(one(4242, ExplainFormat::Json), &Policy::default());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["action"], "investigate");
    assert_eq!(v["in_catalog"], false);
    assert!(v["other_agents"].is_null());
    let text = run(one(4242, ExplainFormat::Text), &Policy::default());
    assert!(text.contains("not listed"), "{text}");
    assert!(text.contains("investigate (severity warning)"), "{text}");
}

#[test]
fn all_json_is_one_array_covering_the_catalog() {
    let json = run(all(ExplainFormat::Json), &Policy::default());
    let v: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let codes: Vec<u64> = v.iter().map(|e| e["code"].as_u64().unwrap()).collect();
    let mut expected: Vec<u64> = (1..=173).collect();
    expected.push(185);
    assert_eq!(codes, expected);
    let actions: std::collections::BTreeSet<&str> =
        v.iter().map(|e| e["action"].as_str().unwrap()).collect();
    for action in Action::ALL {
        assert!(
            actions.contains(action.to_string().as_str()),
            "{action} unused"
        );
    }
}

#[test]
fn all_text_is_one_line_per_code_plus_header() {
    let text = run(all(ExplainFormat::Text), &Policy::default());
    let lines: Vec<&str> = text.lines().collect();
    let rows = lines
        .iter()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .count();
    assert_eq!(rows, 174);
    assert!(lines[0].contains("ACTION") && lines[0].contains("NVIDIA"));
    // The columns are explained after the table.
    let legend = lines[175..].join(" ");
    for col in ["ACTION:", "SEVERITY:", "NVIDIA:", "OVR:"] {
        assert!(legend.contains(col), "{col} not explained: {legend}");
    }
    assert!(lines[175..].iter().all(|l| l.len() <= 100), "{text}");
    let l79 = lines
        .iter()
        .find(|l| l.trim_start().starts_with("79 "))
        .unwrap();
    assert!(
        l79.contains("reboot_node") && l79.contains("RESTART_BM"),
        "{l79}"
    );
}

#[test]
fn overrides_show_up_in_every_format() {
    let mut ov = PolicyOverrides::default();
    ov.xid.insert(
        "79".into(),
        XidOverride {
            action: Some(Action::InspectHardware),
            threshold: None,
            recurrence_reboots: Some(3),
        },
    );
    ov.xid.insert(
        "250".into(),
        XidOverride {
            action: Some(Action::Ignore),
            threshold: None,
            recurrence_reboots: None,
        },
    );
    let policy = Policy::new(&ov).unwrap();
    let text = run(one(79, ExplainFormat::Text), &policy);
    assert!(
        text.contains("inspect_hardware (severity critical)"),
        "{text}"
    );
    assert!(
        text.contains("yes, by this node's [policy] config"),
        "{text}"
    );
    // Recurrence escalates reset/reboot-class faults only; inspect_hardware is the top.
    assert!(!text.contains("recurrence:"), "{text}");
    let v: Vec<serde_json::Value> =
        serde_json::from_str(&run(all(ExplainFormat::Json), &policy)).unwrap();
    assert_eq!(v.len(), 175);
    let e250 = v.iter().find(|e| e["code"] == 250).unwrap();
    assert_eq!(e250["action"], "ignore");
    assert_eq!(e250["overridden"], true);
    let table = run(all(ExplainFormat::Text), &policy);
    let l79 = table
        .lines()
        .find(|l| l.trim_start().starts_with("79 "))
        .unwrap();
    assert!(
        l79.contains("inspect_hardware") && l79.contains("yes"),
        "{l79}"
    );
}

#[test]
fn missing_code_and_failed_writes_are_errors() {
    let args = ExplainArgs::default();
    let err = explain(&args, &Policy::default(), &mut Vec::new()).unwrap_err();
    assert!(matches!(err, ExplainError::NoCode));

    struct Broken;
    impl std::io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "closed",
            ))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    for format in [ExplainFormat::Text, ExplainFormat::Json] {
        let err = explain(&one(79, format), &Policy::default(), &mut Broken).unwrap_err();
        assert!(matches!(err, ExplainError::Write(_)), "{err:?}");
    }
}

#[test]
fn clap_parses_the_documented_command_lines() {
    use clap::Parser;
    #[derive(clap::Parser, Debug)]
    struct ExplainCommandLine {
        #[command(flatten)]
        explain: ExplainArgs,
    }
    let c = ExplainCommandLine::try_parse_from(["explain", "79"]).unwrap();
    assert_eq!(c.explain, one(79, ExplainFormat::Text));
    let c = ExplainCommandLine::try_parse_from(["explain", "xid48", "--format", "json"]).unwrap();
    assert_eq!(c.explain, one(48, ExplainFormat::Json));
    let c = ExplainCommandLine::try_parse_from(["explain", "--all", "--format", "json"]).unwrap();
    assert_eq!(c.explain, all(ExplainFormat::Json));
    assert!(ExplainCommandLine::try_parse_from(["explain"]).is_err());
    assert!(ExplainCommandLine::try_parse_from(["explain", "79", "--all"]).is_err());
    assert!(ExplainCommandLine::try_parse_from(["explain", "seventy"]).is_err());
    assert!(ExplainCommandLine::try_parse_from(["explain", "79", "--format", "yaml"]).is_err());
}

/// `gpuwatch explain --all | head` ends quietly with exit 0 when
/// the reader closes the pipe; other write errors stay errors.
#[test]
fn closed_stdout_pipe_is_a_normal_end() {
    struct Failing(std::io::ErrorKind);
    impl std::io::Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(self.0.into())
        }
    }
    for format in [ExplainFormat::Text, ExplainFormat::Json] {
        for args in [all(format), one(61, format)] {
            let mut w = Failing(std::io::ErrorKind::BrokenPipe);
            let err = explain(&args, &Policy::default(), &mut w).unwrap_err();
            assert!(err.is_broken_pipe(), "{err:?}");
            let mut w = Failing(std::io::ErrorKind::StorageFull);
            let err = explain(&args, &Policy::default(), &mut w).unwrap_err();
            assert!(!err.is_broken_pipe(), "{err:?}");
        }
    }
    for args in [
        &["explain", "61"][..],
        &["explain", "--all"],
        &["explain", "--all", "--format", "json"],
    ] {
        // The read end is closed before the process starts: every write gets EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Unused codes of NVIDIA's CONTACT_SUPPORT bucket are explained
/// as investigate, with the evidence; XID 61 as reset_gpu.
#[test]
fn contact_support_codes_explain_their_per_code_decision() {
    let v: serde_json::Value =
        serde_json::from_str(&run(one(57, ExplainFormat::Json), &Policy::default())).unwrap();
    assert_eq!(v["action"], "investigate");
    assert_eq!(v["nvidia_immediate"], "CONTACT_SUPPORT");
    assert!(v["why"].as_str().unwrap().contains("marks the code unused"));
    let text = run(one(61, ExplainFormat::Text), &Policy::default());
    assert!(text.contains("reset_gpu (severity error)"), "{text}");
    assert!(text.contains("PMU"), "{text}");
}

#[test]
fn recurrence_line_only_where_recurrence_applies() {
    let text = run(one(79, ExplainFormat::Text), &Policy::default());
    assert!(text.contains("after 2 reboots escalates"), "{text}");
    let text = run(one(13, ExplainFormat::Text), &Policy::default());
    assert!(!text.contains("recurrence:"), "{text}");
    // NVIDIA's bucket name comes with what it means.
    assert!(
        text.contains("RESTART_APP (restart the application)"),
        "{text}"
    );
}

#[test]
fn explain_149_shows_nvidia_nvlink5_decode_rows() {
    let text = run(one(149, ExplainFormat::Text), &Policy::default());
    assert!(text.contains("NVIDIA NVLink5 decode table"), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("NETIR"))
        .collect();
    // The XID 149 rows of NVIDIA's table (31), each with both layouts.
    assert_eq!(rows.len(), 31, "{text}");
    assert!(
        rows.iter()
            .any(|l| l.contains("------100110----------0111000110")
                && l.contains("IGNORE")
                && l.contains("Link Fatal")),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&run(one(149, ExplainFormat::Json), &Policy::default())).unwrap();
    assert_eq!(v["nvlink5_decode"].as_array().map(Vec::len), Some(31));
    assert_eq!(v["nvlink5_decode"][0]["resolution"], "RESET_GPU");
    let v: serde_json::Value =
        serde_json::from_str(&run(one(79, ExplainFormat::Json), &Policy::default())).unwrap();
    assert_eq!(v["nvlink5_decode"].as_array().map(Vec::len), Some(0));
}

/// `gpuwatch explain --network` prints the network rules with the config's
/// `[network]` settings, as text and JSON, and refuses bad settings by key.
#[test]
fn explain_network_shows_the_configured_rules() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &cfg,
        "[network]\nexpected_ports = { infiniband = 8 }\nmin_rate_gbps = 400\nignore = [\"mlx5_8\"]\ndown_grace_secs = 90\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["explain", "--network", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "not ACTIVE/LinkUp for 90s",
        "InfiniBand: 8",
        "below 400 Gb/s",
        "mlx5_8",
        "never a GPU verdict",
        "rx_drops 100+1/s",
        "retrans_bytes 1000000+1/s",
        "NICErrorRate naming the device and counter",
        "AWS EFA devices (PCI vendor 0x1d0f)",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
    let out = run(&[
        "explain",
        "--network",
        "--format",
        "json",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["poll_interval_secs"], 5.0);
    assert!(v["rules"].as_array().is_some_and(|r| r.len() == 9), "{v:#}");

    std::fs::write(&cfg, "[network]\nflap_threshold = 0\n").unwrap();
    let out = run(&["explain", "--network", "--config", cfg.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("flap_threshold"), "{err}");
}
