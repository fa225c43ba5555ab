//! `gpuwatch scan`: end-to-end over files on disk (through `gpuwatch::scan`, the
//! function `main` calls), plus the built binary when the subcommand is wired.

use gpuwatch::{ScanArgs, ScanFormat, scan};
use gpuwatch_proto::{Action, FaultEvent};
use std::io::Write;
use std::sync::Arc;
use xid_parser::Policy;

const LOG: &str = "\
[6781741.548768] NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b
[6781741.548776] NVRM: GPU Board Serial Number: 1653723052734
[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.
[6781742.000000] usb 1-1: new high-speed USB device number 2 using xhci_hcd
[6781743.000000] NVRM: Xid (PCI:0000:cb:00): 13, pid=1, name=python, Graphics Exception
";

fn write_tmp(dir: &tempfile::TempDir, name: &str, body: &[u8]) -> std::path::PathBuf {
    let p = dir.path().join(name);
    std::fs::File::create(&p).unwrap().write_all(body).unwrap();
    p
}

#[test]
fn json_output_is_one_event_per_line_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_tmp(&dir, "dmesg.log", LOG.as_bytes());
    let args = ScanArgs {
        format: ScanFormat::Json,
        accept_user_facility: false,
        files: vec![f],
    };
    let mut out = Vec::new();
    let summary = scan(&args, Arc::new(Policy::default()), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let events: Vec<FaultEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    assert_eq!((events[0].code, events[1].code), (79, 13));
    assert_eq!(
        events[0].gpu_uuid,
        "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"
    );
    assert!(text.lines().all(|l| l.contains(r#""source":"log_file""#)));
    assert_eq!(summary.lines, 6);
    assert_eq!(summary.events, 2);
    // The exit code follows the most severe action the policy chose.
    let worst = summary.worst_action();
    assert_eq!(
        summary.exit_code(),
        if worst.rank() >= Action::ResetGpu.rank() {
            2
        } else {
            0
        }
    );
    assert!(summary.gpus.contains_key("0000:91:00.0"));
}

#[test]
fn text_output_has_table_and_per_gpu_summary() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_tmp(&dir, "dmesg.log", LOG.as_bytes());
    let args = ScanArgs {
        format: ScanFormat::Text,
        accept_user_facility: false,
        files: vec![f],
    };
    let mut out = Vec::new();
    scan(&args, Arc::new(Policy::default()), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("TIME"), "{text}");
    assert!(text.contains("0000:91:00.0:"), "{text}");
    assert!(text.contains("XID79"), "{text}");
}

#[test]
fn clean_log_exits_zero_and_missing_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_tmp(
        &dir,
        "clean.log",
        b"[ 1.0] usb 1-1: new device\n[ 2.0] random: crng init done\n",
    );
    let args = ScanArgs {
        format: ScanFormat::Json,
        accept_user_facility: false,
        files: vec![f],
    };
    let mut out = Vec::new();
    let s = scan(&args, Arc::new(Policy::default()), &mut out).unwrap();
    assert_eq!((s.events, s.exit_code()), (0, 0));
    assert!(out.is_empty());

    let missing = dir.path().join("nope.log");
    let args = ScanArgs {
        format: ScanFormat::Json,
        accept_user_facility: false,
        files: vec![missing.clone()],
    };
    let err = scan(&args, Arc::new(Policy::default()), &mut Vec::new()).unwrap_err();
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

#[test]
fn binary_garbage_and_huge_lines_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut body: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    body.extend_from_slice(b"\n[ 9.0] NVRM: Xid (PCI:0000:3b:00): 43, pid=5, Ch 00000001\n");
    let f = write_tmp(&dir, "garbage.bin", &body);
    let args = ScanArgs {
        format: ScanFormat::Json,
        accept_user_facility: false,
        files: vec![f],
    };
    let mut out = Vec::new();
    let s = scan(&args, Arc::new(Policy::default()), &mut out).unwrap();
    assert!(s.skipped_long_lines + s.lines_with_nul >= 1, "{s:?}");
    let text = String::from_utf8(out).unwrap();
    assert!(text.lines().any(|l| l.contains(r#""code":43"#)), "{text}");
}

#[test]
fn binary_scan_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let clean = write_tmp(&dir, "clean.log", b"[ 1.0] random: crng init done\n");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["scan", "--format", "json"])
        .arg(&clean)
        .output()
        .unwrap();
    assert_eq!(
        st.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(st.stdout.is_empty());

    let bad = write_tmp(&dir, "fault.log", LOG.as_bytes());
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["scan", "--format", "json"])
        .arg(&bad)
        .output()
        .unwrap();
    let summary = scan(
        &ScanArgs {
            format: ScanFormat::Json,
            accept_user_facility: false,
            files: vec![bad],
        },
        Arc::new(Policy::default()),
        &mut Vec::new(),
    )
    .unwrap();
    assert_eq!(st.status.code(), Some(summary.exit_code()));
    assert_eq!(String::from_utf8_lossy(&st.stdout).lines().count(), 2);

    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["scan"])
        .arg(dir.path().join("missing.log"))
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(1));
}

/// A writer whose reader has gone away, as stdout is in `gpuwatch scan | head`.
struct ClosedPipe;

impl Write for ClosedPipe {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
}

/// `gpuwatch scan … | head` ends quietly with exit 0 when the
/// reader closes the pipe; other write errors stay errors.
#[test]
fn closed_stdout_pipe_is_a_normal_end() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_tmp(&dir, "dmesg.log", LOG.as_bytes());
    for format in [ScanFormat::Json, ScanFormat::Text] {
        let args = ScanArgs {
            format,
            accept_user_facility: false,
            files: vec![f.clone()],
        };
        let err = scan(&args, Arc::new(Policy::default()), &mut ClosedPipe).unwrap_err();
        assert!(err.is_broken_pipe(), "{err:?}");
    }
    let other = gpuwatch::ScanError::Write(std::io::ErrorKind::StorageFull.into());
    assert!(!other.is_broken_pipe());

    for format in ["json", "text"] {
        // The read end is closed before the process starts: every write gets EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
            .args(["scan", "--format", format])
            .arg(&f)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{format}: {out:?}");
        assert!(
            out.stderr.is_empty(),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The per-GPU reason is `FaultEvent::short_reason()`, the same
/// reason node conditions and Events carry (not a table of scan's own).
#[test]
fn summary_reason_is_the_events_short_reason() {
    let log = "\
[  10.000000] pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0
[  11.000000] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
";
    let mut out = Vec::new();
    let summary = gpuwatch::scan_bytes(
        log.as_bytes(),
        ScanFormat::Json,
        Arc::new(Policy::default()),
        &mut out,
    )
    .unwrap();
    let events: Vec<FaultEvent> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let aer = events
        .iter()
        .find(|e| e.kind() == gpuwatch_proto::FaultKind::PcieAer)
        .expect("an AER event");
    assert_eq!(aer.short_reason(), "PCIeAERFatal");
    let g = &summary.gpus[&aer.pci_address];
    assert_eq!(g.reason, "PCIeAERFatal", "{summary:?}");
    assert_eq!(summary.gpus["0000:91:00.0"].reason, "XID79");
}

fn scan_file(
    name: &str,
    body: &[u8],
    format: ScanFormat,
    accept_user: bool,
) -> (String, gpuwatch::ScanSummary) {
    let dir = tempfile::tempdir().unwrap();
    let f = write_tmp(&dir, name, body);
    let args = ScanArgs {
        format,
        accept_user_facility: accept_user,
        files: vec![f],
    };
    let mut out = Vec::new();
    let s = scan(&args, Arc::new(Policy::default()), &mut out).unwrap();
    (String::from_utf8(out).unwrap(), s)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// `dmesg -x` prints `kern  :warn  : ` / `user  :err   : ` before each line
/// (util-linux dmesg.c, facility and level names padded to six).
const DMESG_X: &str = "\
kern  :warn  : [   42.023596] NVRM: Xid (PCI:0000:00:06): 13, pid=555, name=xid, Graphics Exception
user  :err   : [   43.000000] NVRM: Xid (PCI:0000:00:07): 79, pid=1, name=x, GPU has fallen off the bus.
kern  :info  : [   44.000000] usb 1-1: new high-speed USB device number 2 using xhci_hcd
";

#[test]
fn dmesg_x_user_facility_lines_are_skipped_and_counted_unless_accepted() {
    let (text, s) = scan_file("x.log", DMESG_X.as_bytes(), ScanFormat::Json, false);
    assert_eq!((s.events, s.skipped_non_kernel_lines), (1, 1), "{text}");
    assert!(text.contains(r#""code":13"#), "{text}");
    let (text, s) = scan_file("x.log", DMESG_X.as_bytes(), ScanFormat::Json, true);
    assert_eq!((s.events, s.skipped_non_kernel_lines), (2, 0), "{text}");
    assert!(text.contains(r#""facility":1"#), "{text}");
}

/// `dmesg -S -r` (the syslog(2) buffer, formatted by the kernel) prints the
/// whole priority, `(facility << 3) | level`: `<12>` is a user-facility
/// warning, `<4>` a kernel one.
const DMESG_SYSLOG_RAW: &str = "\
<4>[   42.023596] NVRM: Xid (PCI:0000:00:06): 13, pid=555, name=xid, Graphics Exception
<12>[   43.000000] NVRM: Xid (PCI:0000:00:07): 79, pid=1, name=x, GPU has fallen off the bus.
";

#[test]
fn dmesg_syslog_raw_user_facility_lines_are_skipped_unless_accepted() {
    let (text, s) = scan_file(
        "r.log",
        DMESG_SYSLOG_RAW.as_bytes(),
        ScanFormat::Json,
        false,
    );
    assert_eq!((s.events, s.skipped_non_kernel_lines), (1, 1), "{text}");
    assert!(text.contains(r#""code":13"#), "{text}");
    let (text, s) = scan_file("r.log", DMESG_SYSLOG_RAW.as_bytes(), ScanFormat::Json, true);
    assert_eq!((s.events, s.skipped_non_kernel_lines), (2, 0), "{text}");
    assert!(text.contains(r#""facility":1"#), "{text}");
}

#[test]
fn gz_files_are_read_directly() {
    let (plain, s1) = scan_file("dmesg.log", LOG.as_bytes(), ScanFormat::Json, false);
    let (gz, s2) = scan_file(
        "dmesg.log.gz",
        &gzip(LOG.as_bytes()),
        ScanFormat::Json,
        false,
    );
    assert_eq!(plain, gz);
    assert_eq!(s1, s2);
    // Two gzip members one after the other read as one stream, as `gzip -d` does.
    let mut two = gzip(&LOG.as_bytes()[..200]);
    two.extend(gzip(&LOG.as_bytes()[200..]));
    let (gz2, _) = scan_file("x.gz", &two, ScanFormat::Json, false);
    assert_eq!(plain, gz2);
}

/// The layout of nvidia-bug-report.sh's output: a start line, then sections
/// separated by a line of underscores with a header naming the command or file.
#[test]
fn nvidia_bug_report_only_its_kernel_log_sections_are_scanned() {
    let report = "\
Start of NVIDIA bug report log file.  Please include this file, along
with a detailed description of your problem, when reporting a graphics
____________________________________________

*** /usr/bin/nvidia-smi -q
NVRM: Xid (PCI:0000:11:00): 79, this text is not a kernel log
____________________________________________

*** /var/log/kern.log
Mar  3 12:00:00 node kernel: [   12.000000] NVRM: Xid (PCI:0000:22:00): 48, DBE (0x1)
____________________________________________

Skipping dmesg: NVRM: Xid (PCI:0000:44:00): 79, not a log line either
____________________________________________

journalctl -b -0 -k:
[   13.000000] NVRM: Xid (PCI:0000:33:00): 13, pid=1, name=x, Graphics Exception
";
    let (text, s) = scan_file(
        "nvidia-bug-report.log.gz",
        &gzip(report.as_bytes()),
        ScanFormat::Json,
        false,
    );
    assert_eq!(s.events, 2, "{text}");
    assert!(
        text.contains("0000:22:00.0") && text.contains("0000:33:00.0"),
        "{text}"
    );
    assert!(
        !text.contains("0000:11:00.0") && !text.contains("0000:44:00.0"),
        "{text}"
    );
}

#[test]
fn text_time_column_and_summary_order() {
    let log = "\
[   42.023596] NVRM: Xid (PCI:0000:00:06): 13, pid=555, name=xid, Graphics Exception
[Mon Oct  3 13:52:42 2022] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.
NVRM: Xid (PCI:0000:5e:00): 48, DBE (0x1)
";
    let (text, _) = scan_file("t.log", log.as_bytes(), ScanFormat::Text, false);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("TIME"), "{text}");
    // Seconds since boot, the input's own wall-clock time (UTC), or nothing.
    assert!(lines[1].starts_with("42.023596 "), "{text}");
    assert!(lines[2].starts_with("2022-10-03 13:52:42 "), "{text}");
    assert!(lines[3].starts_with("- "), "{text}");
    assert!(!text.contains('@'), "{text}");
    // Per-GPU summary, most severe first.
    let summary: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("0000:"))
        .copied()
        .collect();
    assert_eq!(summary.len(), 3, "{text}");
    assert!(
        summary[0].starts_with("0000:3b:00.0: reboot_node"),
        "{text}"
    );
    assert!(summary[1].starts_with("0000:5e:00.0: reset_gpu"), "{text}");
    assert!(
        summary[2].starts_with("0000:00:06.0: restart_app"),
        "{text}"
    );
}

#[test]
fn text_time_column_of_syslog_dates_without_a_year_is_their_wall_clock_time() {
    let log = "\
Jan  2 03:04:05 node kernel: [    9.500000] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception
Jan  2 03:04:06.250000 node kernel: NVRM: Xid (PCI:0000:3c:00): 13, pid=2, name=y, Graphics Exception
";
    let (text, _) = scan_file("t.log", log.as_bytes(), ScanFormat::Text, false);
    let rows: Vec<&str> = text.lines().skip(1).take(2).collect();
    // The year is inferred (this year, or the last when Jan 2 is still ahead).
    for (row, time) in rows.iter().zip(["-01-02 03:04:05 ", "-01-02 03:04:06 "]) {
        let year: u32 = row[..4].parse().unwrap_or(0);
        assert!(year >= 2025, "{text}");
        assert_eq!(&row[4..20], time, "{text}");
    }
    assert!(!text.contains("9.500000 "), "{text}");
    // JSON carries only times read from the line.
    let (json, _) = scan_file("t.log", log.as_bytes(), ScanFormat::Json, false);
    assert_eq!(
        json.matches(r#""time_unix_nano":null"#).count(),
        2,
        "{json}"
    );
}

#[test]
fn auto_format_is_json_when_stdout_is_not_a_terminal() {
    assert_eq!(ScanFormat::Auto.resolve(false), ScanFormat::Json);
    assert_eq!(ScanFormat::Auto.resolve(true), ScanFormat::Text);
    assert_eq!(ScanFormat::Json.resolve(true), ScanFormat::Json);
    // Under the test harness stdout is captured (not a terminal): JSON lines.
    let (text, _) = scan_file("a.log", LOG.as_bytes(), ScanFormat::Auto, false);
    assert!(text.lines().all(|l| l.starts_with('{')), "{text}");
}

#[test]
fn directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let args = ScanArgs {
        format: ScanFormat::Json,
        accept_user_facility: false,
        files: vec![dir.path().to_path_buf()],
    };
    let err = scan(&args, Arc::new(Policy::default()), &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
}

/// A MIG instance printed in the XID prefix stays on the event: the GPU
/// instance alone (`GPU-I:05`) and with its compute instance.
#[test]
fn a_mig_xid_keeps_its_gpu_and_compute_instance() {
    let dir = tempfile::tempdir().unwrap();
    let log = "\
[7200.000000] NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=7101, name=python, Ch 00000008, Contained ECC error
[7300.000000] NVRM: Xid (PCI:0000:3b:00 GPU-I:07 GPU-CI:01): 43, pid=7200, name=train.py, Ch 00000010
";
    let f = write_tmp(&dir, "mig.log", log.as_bytes());
    let args = ScanArgs {
        format: ScanFormat::Json,
        accept_user_facility: false,
        files: vec![f],
    };
    let mut out = Vec::new();
    scan(&args, Arc::new(Policy::default()), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let events: Vec<FaultEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    let attr = |e: &FaultEvent, k: &str| e.attributes.get(k).cloned();
    assert_eq!(events[0].code, 94);
    assert_eq!(
        attr(&events[0], "gpu_instance").as_deref(),
        Some("5"),
        "{text}"
    );
    assert_eq!(attr(&events[0], "compute_instance"), None);
    assert_eq!(events[0].pci_address, "0000:3b:00.0");
    assert_eq!(attr(&events[1], "gpu_instance").as_deref(), Some("7"));
    assert_eq!(attr(&events[1], "compute_instance").as_deref(), Some("1"));
}

/// The mlx5 lines an NCCL hang starts from (firmware command timeouts, fatal
/// health reports, slot power, the transmit watchdog), scanned from a file: the
/// text summary groups them with the NIC events, per PCI address, or per
/// interface for the watchdog line that prints none; the counter-read refusals
/// of a restricted NIC stay out; and no GPU fault, so exit code 0.
#[test]
fn mlx5_fault_lines_are_grouped_with_the_nic_events() {
    let log = "\
[  100.000000] mlx5_core 0000:0c:00.0 ens1f0np0: Link down
[  101.000000] mlx5_core 0000:0c:00.0: cmd_work_handler:877:(pid 1234): cmd[0]: ACCESS_REG(0x805) No done completion
[  101.000001] mlx5_core 0000:0c:00.0: wait_func:1205:(pid 1234): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource
[  102.000000] mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838:(pid 1234): ACCESS_REG(0x805) op_mod(0x1) failed, status bad parameter(0x3), syndrome (0x6e1a5d), err(-22)
[  103.000000] mlx5_core 0000:41:00.0: mlx5_health_try_recover:351:(pid 77): health recovery failed
[  103.000001] mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error
[  104.000000] mlx5_core 0000:5c:00.0: mlx5_pcie_event:301:(pid 5): Detected insufficient power on the PCIe slot (27W).
[  105.000000] NETDEV WATCHDOG: ens2f0np0 (mlx5_core): transmit queue 3 timed out 5120 ms
[  106.000000] mlx5_core 0000:5d:00.0 ens3f0np0: NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms
";
    let (text, s) = scan_file("dmesg.log", log.as_bytes(), ScanFormat::Text, false);
    assert_eq!(s.events, 8, "{text}");
    assert!(s.gpus.is_empty(), "{:?}", s.gpus);
    assert_eq!(s.exit_code(), 0);
    let nic = |key: &str| {
        let n = &s.nics[key];
        (n.events, n.action, n.reason.as_str())
    };
    assert_eq!(
        nic("0000:0c:00.0"),
        (3, Action::InspectHardware, "NICHealthEvent")
    );
    assert_eq!(
        nic("0000:41:00.0"),
        (2, Action::InspectHardware, "NICHealthEvent")
    );
    assert_eq!(
        nic("0000:5c:00.0"),
        (1, Action::Investigate, "NICSlotPower")
    );
    assert_eq!(nic("ens2f0np0"), (1, Action::Investigate, "NICTxTimeout"));
    assert_eq!(
        nic("0000:5d:00.0"),
        (1, Action::Investigate, "NICTxTimeout")
    );
    assert_eq!(s.nics.len(), 5, "{:?}", s.nics);
    assert!(text.contains("No GPU faults found."), "{text}");
    for line in [
        "NIC 0000:0c:00.0: inspect_hardware (NICHealthEvent, 3 events)",
        "NIC 0000:41:00.0: inspect_hardware (NICHealthEvent, 2 events)",
        "NIC 0000:5c:00.0: investigate (NICSlotPower, 1 events)",
        "NIC ens2f0np0: investigate (NICTxTimeout, 1 events)",
        "NIC 0000:5d:00.0: investigate (NICTxTimeout, 1 events)",
    ] {
        assert!(text.contains(line), "{line:?} not in {text}");
    }
    // Each event is a row of the table (its message last), the refusal is not.
    assert_eq!(
        text.lines().filter(|l| l.contains(" nic ")).count(),
        8,
        "{text}"
    );
    assert!(
        text.contains("inspect_hardware  mlx5_core 0000:0c:00.0: cmd_work_handler:877"),
        "{text}"
    );
    assert!(
        text.contains("investigate       NETDEV WATCHDOG: ens2f0np0 (mlx5_core)"),
        "{text}"
    );
    assert!(!text.contains("mlx5_cmd_out_err"), "{text}");
}
