//! `gpuwatch demo` end to end, 4× faster than the shipped timeline: the real
//! agent reads the real `/dev/kmsg` and the nvml-sim scenarios, across a
//! simulated reboot, and the narration (taken from the agent's events, logs
//! and `/v1/health`) tells the story the demo promises.
//!
//! Needs root (writes `/dev/kmsg`); holds `common::DevKmsg` so it never runs
//! beside another kmsg test of this binary. The nvml-sim cdylib is built first
//! (`cargo build -p nvml-sim`, a no-op when fresh) next to the gpuwatch binary.

use crate::common;
use crate::common::{DevKmsg, wait_timeout};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Index of the first line at or after `from` that contains every needle.
fn find(lines: &[&str], from: usize, needles: &[&str]) -> Option<usize> {
    lines
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, l)| needles.iter().all(|n| l.contains(n)))
        .map(|(i, _)| i)
}

#[test]
fn demo_shows_detection_reclassification_recovery_and_reboot() {
    common::nvml_sim_lib();
    let _k = DevKmsg::acquire();
    let scenarios = workspace().join("nvml-sim/scenarios");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .arg("demo")
        .args(["--speed", "4"])
        .arg("--scenario")
        .arg(scenarios.join("demo.toml"))
        .arg("--reboot-scenario")
        .arg(scenarios.join("demo-after-reboot.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuwatch demo");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let mut stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_timeout(&mut child, Duration::from_secs(120));
    let out = reader.join().unwrap();
    let err = err_reader.join().unwrap();
    assert_eq!(status, Some(0), "demo failed:\n{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    let need = |from: usize, needles: &[&str]| {
        find(&lines, from, needles)
            .unwrap_or_else(|| panic!("no line with {needles:?} after line {from}:\n{out}"))
    };

    // Boot 1: XID 79 → reboot_node, a row-remap failure → inspect_hardware.
    need(0, &["DETECTED", "XID 79 on GPU 2", "action reboot_node"]);
    need(
        0,
        &["DETECTED", "row remap on GPU 5", "action inspect_hardware"],
    );
    // Issue 3: the XID 64 ends at inspect_hardware, never downgraded to ignore
    // by a sample older than the kernel line.
    let xid64_final = find(
        &lines,
        0,
        &["RECLASS", "XID 64 on GPU 5", "→ inspect_hardware"],
    )
    .or_else(|| {
        find(
            &lines,
            0,
            &["DETECTED", "XID 64 on GPU 5", "action inspect_hardware"],
        )
    });
    assert!(
        xid64_final.is_some(),
        "XID 64 never reached inspect_hardware:\n{out}"
    );
    assert!(
        find(&lines, 0, &["XID 64 on GPU 5", "action ignore"]).is_none(),
        "XID 64 was downgraded to ignore:\n{out}"
    );
    // Thermal: investigate, then cleared by the agent and GPU 6 recovered.
    let hot = need(0, &["DETECTED", "thermal on GPU 6", "action investigate"]);
    let cleared = need(
        hot,
        &["CLEARED", "GPU 6 ThermalSlowdown", "consecutive samples"],
    );
    need(cleared, &["GPU 6 recovered: degraded → healthy"]);

    // The simulated reboot: state flushed, new boot id, XID 79 cleared because
    // the new boot validated; GPU 5's inspect_hardware stays, with the reason.
    let reboot = need(0, &["REBOOT", "exit status: 0", "flushed"]);
    assert!(reboot > cleared);
    need(reboot, &["REBOOT", "new boot id"]);
    need(reboot, &["RESTORED"]);
    need(
        reboot,
        &[
            "CLEARED",
            "GPU 2 XID79 (reboot_node)",
            "the node rebooted",
            "validates",
        ],
    );
    need(reboot, &["GPU 2 recovered"]);
    need(
        reboot,
        &[
            "STAYS",
            "GPU 5 unhealthy (inspect_hardware)",
            "remapped_rows_failure=true",
        ],
    );
    need(
        reboot,
        &["final node state: verdict=unhealthy action=inspect_hardware reason=RowRemapFailure"],
    );
    need(reboot, &["agent exit (boot 2): exit status: 0"]);
}
