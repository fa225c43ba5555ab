//! `gpuwatch-demo` end to end, 4× faster than the shipped timeline: the real
//! agent reads the nvml-sim scenarios, the demo's kernel lines and its NIC
//! sysfs tree, across a simulated reboot, and the narration (taken from the agent's events, logs
//! and `/v1/health`) tells the story the demo promises, in lines of at most
//! 120 characters.
//!
//! Two kernel logs: the private FIFO (the default), which must leave the
//! kernel log untouched, and the real `/dev/kmsg` with `--kmsg` (this machine
//! has no NVIDIA driver; needs root). Both hold `DevKmsg`, so neither runs
//! beside the other: the FIFO test checks that nothing new of the demo's
//! reached the ring. The `--kmsg` run starts its agent at the ring's end, so
//! what earlier runs left in the ring does not change its story.

use crate::{agent_binary, workspace};
use gpuwatch_test_support::kmsg::{DevKmsg, ring};
use gpuwatch_test_support::process::wait_timeout;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Width of the `[ 12.3s] DETECTED  ` prefix; wrapped lines are indented by it.
const PREFIX: &str = "                   ";

/// The narration with wrapped lines joined back (for searching), and the raw lines.
fn logical_lines(out: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for l in out.lines() {
        match (l.strip_prefix(PREFIX), lines.last_mut()) {
            (Some(rest), Some(prev)) if !rest.starts_with(' ') => {
                prev.push(' ');
                prev.push_str(rest);
            }
            _ => lines.push(l.to_string()),
        }
    }
    lines
}

/// Index of the first line at or after `from` that contains every needle.
fn find(lines: &[String], from: usize, needles: &[&str]) -> Option<usize> {
    lines
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, l)| needles.iter().all(|n| l.contains(n)))
        .map(|(i, _)| i)
}

/// Runs `gpuwatch-demo --speed 4 ARGS`; returns its stdout after checking it
/// exited 0.
fn run_demo(args: &[&str]) -> String {
    let agent = agent_binary();
    let scenarios = workspace().join("nvml-sim/scenarios");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuwatch-demo"))
        .args(["--speed", "4"])
        .arg("--agent")
        .arg(agent)
        .arg("--scenario")
        .arg(scenarios.join("demo.toml"))
        .arg("--reboot-scenario")
        .arg(scenarios.join("demo-after-reboot.toml"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuwatch-demo");
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
    // Plain words: at most 120 characters a line, no placeholder values.
    for l in out.lines() {
        assert!(l.chars().count() <= 120, "line longer than 120:\n{l}");
    }
    for bad in ["action=unspecified", "GPU ?", "00000000:"] {
        assert!(!out.contains(bad), "narration contains {bad:?}:\n{out}");
    }
    out
}

/// What both kernel logs must show: detection with the source named, the
/// reclassification counted by its final action, recovery, the reboot.
fn check_story(out: &str, lines: &[String]) {
    let need = |from: usize, needles: &[&str]| {
        find(lines, from, needles)
            .unwrap_or_else(|| panic!("no line with {needles:?} after line {from}:\n{out}"))
    };
    // Boot 1: the XID 79 line the demo wrote is reported as coming from the
    // kernel log; the row-remap failure ends at inspect_hardware.
    need(
        0,
        &[
            "DETECTED",
            "XID 79 on GPU 2 (0000:3a:00.0), from the kernel log",
            "action reboot_node",
        ],
    );
    need(0, &["NODE", "healthy, 8 GPUs"]);
    need(
        0,
        &["DETECTED", "row remap on GPU 5", "action inspect_hardware"],
    );
    // The XID 64 ends at inspect_hardware, never downgraded to ignore by a
    // sample older than the kernel line.
    let xid64_final = find(
        lines,
        0,
        &["RECLASS", "XID 64 on GPU 5", "→ inspect_hardware"],
    )
    .or_else(|| {
        find(
            lines,
            0,
            &["DETECTED", "XID 64 on GPU 5", "action inspect_hardware"],
        )
    });
    assert!(
        xid64_final.is_some(),
        "XID 64 never reached inspect_hardware:\n{out}"
    );
    assert!(
        find(lines, 0, &["XID 64 on GPU 5", "action ignore"]).is_none(),
        "XID 64 was downgraded to ignore:\n{out}"
    );
    // The summary counts that fault once, by its final action.
    need(
        0,
        &["by final action:", "2 inspect_hardware", "1 restart_app"],
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
    check_nic_flap(out, lines, hot, reboot);
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
        &["final node state: unhealthy: inspect_hardware (RowRemapFailure), 8 GPUs"],
    );
    need(reboot, &["agent exit (boot 2): exit status: 0"]);
}

/// The NIC flap of boot 1, after the thermal slowdown began and before the
/// reboot: the agent reads the ports from the demo's tree, reports the kernel
/// line's link down, `NetworkProblem=True NICPortFlapping` naming the port
/// with the GPU verdicts as they were, then the clear after the quiet window;
/// the demo never has to say the agent failed to report one of them.
fn check_nic_flap(out: &str, lines: &[String], after: usize, reboot: usize) {
    let need = |from: usize, needles: &[&str]| {
        find(lines, from, needles)
            .unwrap_or_else(|| panic!("no line with {needles:?} after line {from}:\n{out}"))
    };
    need(
        0,
        &[
            "NETWORK",
            "4 RDMA ports (InfiniBand 400 Gb/s)",
            "mlx5_2/1 ib2",
            "all up; NetworkProblem=False NICHealthy",
        ],
    );
    let down = need(
        after,
        &[
            "NIC ",
            "NICLinkDown on ib2 (0000:9b:00.0), from the kernel log",
        ],
    );
    let flapping = need(
        down,
        &[
            "NETWORK",
            "NetworkProblem=True NICPortFlapping",
            "mlx5_2/1 (ib2)",
        ],
    );
    // The monitor's record of the change, beside the condition.
    need(
        down,
        &["NIC ", "NICPortFlapping on mlx5_2/1 ib2", "→ flapping"],
    );
    let unaffected = need(
        flapping,
        &[
            "GPUs unaffected: all 8 GPU verdicts as before the flap",
            "no network fault on a GPU or the node",
        ],
    );
    let healthy = need(unaffected, &["NETWORK", "NetworkProblem=False NICHealthy"]);
    assert!(
        healthy < reboot,
        "the flap must clear before the reboot:\n{out}"
    );
    for missing in ["the agent reported no", "did not report NICHealthy"] {
        assert!(!out.contains(missing), "{missing:?}:\n{out}");
    }
    need(
        0,
        &[
            "network:",
            "NIC record(s); last reported NetworkProblem=False NICHealthy",
        ],
    );
}

#[test]
fn demo_on_dev_kmsg_narrates_and_shows_its_lines_as_dmesg_x_does() {
    let _k = DevKmsg::acquire();
    let out = run_demo(&["--kmsg"]);
    let lines = logical_lines(&out);
    assert!(
        find(
            &lines,
            0,
            &["--kmsg:", "this machine's kernel log", "/dev/kmsg"]
        )
        .is_some(),
        "the demo must say which kernel log it writes:\n{out}"
    );
    check_story(&out, &lines);
    // Afterwards: how its lines look in `dmesg -x` (user facility, the
    // driver's warning level), and that printk_devkmsg was put back.
    let shown = find(&lines, 0, &["`dmesg -x` shows them"])
        .unwrap_or_else(|| panic!("no dmesg -x view:\n{out}"));
    let view = find(
        &lines,
        shown,
        &["user  :warn  : [", "NVRM: Xid (PCI:0000:3a:00): 79"],
    );
    assert!(view.is_some(), "XID 79 not in the dmesg -x view:\n{out}");
    let nic = find(
        &lines,
        shown,
        &["user  :info  : [", "mlx5_core 0000:9b:00.0 ib2: Link down"],
    );
    assert!(
        nic.is_some(),
        "the NIC line not in the dmesg -x view:\n{out}"
    );
    assert!(out.contains("printk_devkmsg restored"), "{out}");
}

#[test]
fn demo_through_a_fifo_by_default_leaves_the_kernel_log_alone() {
    let _k = DevKmsg::acquire();
    let before = ring().last().map_or(0, |(seq, _)| *seq);
    let out = run_demo(&[]);
    let lines = logical_lines(&out);
    assert!(
        find(&lines, 0, &["private FIFO", "--kmsg-path"]).is_some(),
        "the demo must say it uses a FIFO:\n{out}"
    );
    need_fifo_lines(&out, &lines);
    check_story(&out, &lines);
    assert!(!out.contains("dmesg -x"), "{out}");
    assert!(out.contains("the kernel log was not touched"), "{out}");
    // Nothing of the demo's script reached the machine's kernel log.
    let leaked: Vec<String> = ring()
        .into_iter()
        .filter(|(seq, m)| {
            *seq > before
                && ((m.contains("NVRM: Xid") && m.contains("name=train.py"))
                    || m.contains("mlx5_core 0000:9b:00.0 ib2: Link"))
        })
        .map(|(_, m)| m)
        .collect();
    assert!(leaked.is_empty(), "demo lines in /dev/kmsg: {leaked:#?}");
}

fn need_fifo_lines(out: &str, lines: &[String]) {
    assert!(
        find(lines, 0, &["FIFO ← NVRM: Xid (PCI:0000:3a:00): 79"]).is_some(),
        "the XID 79 line must be shown as written to the FIFO:\n{out}"
    );
    assert!(
        find(
            lines,
            0,
            &[
                "INJECT",
                "ib2 link down",
                "FIFO ← mlx5_core 0000:9b:00.0 ib2: Link down"
            ]
        )
        .is_some(),
        "the flap's first line must be shown as written to the FIFO:\n{out}"
    );
}

#[test]
fn demo_refuses_dev_kmsg_flags_that_conflict() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch-demo"))
        .args(["--kmsg", "--fifo"])
        .output()
        .expect("run gpuwatch-demo");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be used with"), "{err}");
}
