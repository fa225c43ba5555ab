//! The NVML sources through the real nvml-wrapper code path, against the
//! nvml-sim cdylib (`nvml-sim/scenarios/test-*.toml`), one test per injection,
//! including hung calls (the watchdog: Unknown, bounded stop, recovery, and a
//! `gpuwatch run` that exits promptly on SIGTERM while NVML is wedged).
//!
//! The cdylib cannot be a dependency of this package, so the first test to need
//! it runs `cargo build -p nvml-sim` (a no-op when it is fresh) and uses
//! `target/<profile>/libnvml_sim.so`. Each test gets its own simulator instance
//! (gpuwatch loads a private copy of the library), so they run in parallel.

use crate::common::nvml_sim_lib as sim_lib;
use crate::engine_support::Rig;
use gpuwatch::{InputContext, NvmlError, NvmlSettings, NvmlSources, poll_nvml_once, start_nvml};
use gpuwatch_core::Registry;
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_proto::{FaultEvent, FaultKind, GpuSample, RecoveryAction, Source, Verdict};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nvml-sim/scenarios")
        .join(name)
}

fn config(scenario_name: &str) -> NvmlSettings {
    NvmlSettings {
        library_path: Some(sim_lib().to_path_buf()),
        sim_scenario: Some(scenario(scenario_name)),
        poll_interval: Duration::from_millis(50),
        retry_interval: Duration::from_millis(50),
        ..NvmlSettings::default()
    }
}

/// The running NVML sources and everything they sent so far (each input
/// also goes through a real health engine, when the test has one).
struct NvmlSimHarness {
    rx: crossbeam_channel::Receiver<Input>,
    seen: Vec<Input>,
    /// When each input of `seen` arrived.
    arrived: Vec<Instant>,
    registry: Arc<Registry>,
    sources: NvmlSources,
    engine: Option<Rig>,
}

impl NvmlSimHarness {
    /// Starts the sources with `cfg`, the typed `[nvml]` settings.
    fn start(cfg: &NvmlSettings) -> NvmlSimHarness {
        let (tx, rx) = crossbeam_channel::bounded(1024);
        let registry = Registry::new();
        let sources = start_nvml(
            cfg,
            registry.clone(),
            InputContext::new(gpuwatch_core::Shutdown::new(), tx),
        );
        NvmlSimHarness {
            rx,
            seen: Vec::new(),
            arrived: Vec::new(),
            registry,
            sources,
            engine: None,
        }
    }

    /// Like `start`, feeding every input into a health engine too.
    fn with_engine(cfg: &NvmlSettings) -> NvmlSimHarness {
        let mut h = NvmlSimHarness::start(cfg);
        h.engine = Some(Rig::new(None, "boot-nvml-hang"));
        h
    }

    /// Verdicts of the GPUs the engine knows, by index.
    fn verdicts(&self) -> Vec<(Option<u32>, Verdict)> {
        let rig = self.engine.as_ref().expect("a harness with an engine");
        rig.engine
            .health()
            .gpus
            .iter()
            .map(|g| (g.index, g.verdict()))
            .collect()
    }

    fn receive(&mut self, input: Input) {
        if let Some(rig) = self.engine.as_mut() {
            // The engine consumes its input; tests keep a copy (Input is not
            // Clone: it can carry a reply channel, never from NVML).
            let copy = match &input {
                Input::Samples { samples, complete } => Input::Samples {
                    samples: samples.clone(),
                    complete: *complete,
                },
                Input::Fault { event, read_at } => Input::Fault {
                    event: event.clone(),
                    read_at: *read_at,
                },
                Input::MonitorStatus { input, ok, message } => Input::MonitorStatus {
                    input: *input,
                    ok: *ok,
                    message: message.clone(),
                },
                other => panic!("NVML sent an unexpected input: {other:?}"),
            };
            rig.engine.handle(copy);
        }
        self.seen.push(input);
        self.arrived.push(Instant::now());
    }

    /// Receives until `f` finds what it wants in the inputs so far (or 10 s pass).
    fn wait_for<T>(&mut self, what: &str, mut f: impl FnMut(&[Input]) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(t) = f(&self.seen) {
                return t;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {what}; got {:#?}",
                summary(&self.seen)
            );
            if let Ok(input) = self.rx.recv_timeout(left.min(Duration::from_millis(100))) {
                self.receive(input);
            }
        }
    }

    fn faults(&self) -> Vec<&FaultEvent> {
        faults(&self.seen)
    }

    /// Stops the sources; returns how long that took. Every thread ended.
    fn stop(self) -> Duration {
        let t = Instant::now();
        let left = self.sources.stop();
        let took = t.elapsed();
        assert_eq!(left, 0, "threads left behind");
        took
    }
}

fn faults(inputs: &[Input]) -> Vec<&FaultEvent> {
    inputs
        .iter()
        .filter_map(|i| match i {
            Input::Fault { event, .. } => Some(event),
            _ => None,
        })
        .collect()
}

fn summary(inputs: &[Input]) -> Vec<String> {
    inputs
        .iter()
        .map(|i| match i {
            Input::Samples {
                samples: s,
                complete,
            } => format!("Samples({}, complete={complete})", s.len()),
            Input::Fault { event, .. } => {
                format!(
                    "Fault({:?} {} gpu {:?})",
                    event.kind(),
                    event.code,
                    event.gpu_index
                )
            }
            other => format!("{other:?}"),
        })
        .collect()
}

/// The latest sample of a GPU that satisfies `pred`.
fn sample_where(
    inputs: &[Input],
    index: u32,
    pred: impl Fn(&GpuSample) -> bool,
) -> Option<GpuSample> {
    inputs.iter().rev().find_map(|i| match i {
        Input::Samples { samples: s, .. } => {
            s.iter().find(|g| g.index == index && pred(g)).cloned()
        }
        _ => None,
    })
}

const UUID0: &str = "GPU-00000000-1111-2222-3333-444444444440";
const UUID1: &str = "GPU-00000000-1111-2222-3333-444444444441";

#[test]
fn healthy_sample_carries_every_reading_and_identity() {
    let mut h = NvmlSimHarness::start(&config("test-pcie.toml"));
    let s = h.wait_for("a first sample", |seen| sample_where(seen, 1, |_| true));
    assert_eq!(s.uuid, UUID1);
    assert_eq!(s.pci_address, "0000:3b:00.0", "8-digit domain normalised");
    assert_eq!(s.name, "NVIDIA H100 80GB HBM3");
    assert_eq!(s.temperature_c, Some(35));
    assert_eq!(s.slowdown_temperature_c, Some(87));
    assert_eq!(s.shutdown_temperature_c, Some(92));
    assert_eq!(s.power_mw, Some(72_000));
    assert_eq!(s.power_limit_mw, Some(700_000));
    assert_eq!(s.clock_event_reasons, Some(1));
    assert_eq!(s.ecc_volatile_corrected, Some(0));
    assert_eq!(s.remapped_rows_pending, Some(false));
    assert_eq!(s.pcie_link_gen_max, Some(5));
    assert_eq!(s.pcie_link_width_max, Some(16));
    assert_eq!(s.nvlinks.len(), 18);
    assert!(s.nvlinks.iter().all(|l| l.active == Some(true)));
    assert_eq!(s.recovery_action(), RecoveryAction::None);
    assert_eq!(s.persistence_mode, Some(true));
    // Page retirement is not supported on this GPU: empty, and not an error.
    assert_eq!(s.retired_pages_sbe, None);
    assert_eq!(s.retired_pages_pending, None);
    assert!(
        h.registry.nvml_errors().is_empty(),
        "{:?}",
        h.registry.nvml_errors()
    );
    let ok = h.seen.iter().any(|i| {
        matches!(
            i,
            Input::MonitorStatus {
                input: MonitorInput::Nvml,
                ok: true,
                ..
            }
        )
    });
    assert!(ok, "MonitorStatus ok:true first");
    h.stop();
}

/// The driver version, VBIOS and serial reach every sample; the energy
/// counter rises between polls; a board NVML answers NOT_SUPPORTED for (no
/// serial, no energy count before Volta) has neither, and that is no error.
#[test]
fn samples_carry_firmware_serial_and_a_rising_energy_count() {
    let mut h = NvmlSimHarness::start(&config("test-identity-energy.toml"));
    let first = h.wait_for("a first sample", |seen| sample_where(seen, 0, |_| true));
    assert_eq!(first.driver_version, "570.172.08");
    assert_eq!(first.vbios_version, "96.00.AF.00.01");
    assert_eq!(first.serial, "1654322000001");
    // 5 J at time zero, then 300 W: at least 5 J, rising by 0.3 J a ms.
    let mj = first.energy_mj.expect("energy counted");
    assert!(mj >= 5000, "{mj}");
    let later = h.wait_for("a later energy count", |seen| {
        sample_where(seen, 0, |s| s.energy_mj.is_some_and(|e| e > mj + 3000))
    });
    assert_eq!(later.serial, "1654322000001");
    let other = h.wait_for("GPU 1", |seen| sample_where(seen, 1, |_| true));
    assert_eq!(other.driver_version, "570.172.08");
    assert_eq!(
        other.vbios_version, "96.00.99.00.01",
        "the simulator's default"
    );
    assert_eq!(other.serial, "", "NOT_SUPPORTED: no serial");
    assert_eq!(other.energy_mj, None, "NOT_SUPPORTED: no energy count");
    assert!(
        h.registry.nvml_errors().is_empty(),
        "{:?}",
        h.registry.nvml_errors()
    );
    h.stop();
}

#[test]
fn xid_event_is_a_fault_with_code_and_gpu_identity() {
    let mut h = NvmlSimHarness::start(&config("test-xid.toml"));
    let ev = h.wait_for("an XID fault", |seen| {
        faults(seen)
            .into_iter()
            .find(|e| e.kind() == FaultKind::Xid)
            .cloned()
    });
    assert_eq!(ev.code, 79);
    assert_eq!(ev.source(), Source::NvmlEvent);
    assert_eq!(ev.gpu_index, Some(1));
    assert_eq!(ev.gpu_uuid, UUID1);
    assert_eq!(ev.pci_address, "0000:3b:00.0");
    assert_eq!(
        ev.action(),
        gpuwatch_proto::Action::Unspecified,
        "the engine classifies"
    );
    assert_eq!(ev.count, 1);
    assert!(ev.time_unix_nano.is_some());
    h.stop();
}

#[test]
fn ecc_counters_rise_in_samples_and_dbe_event_is_an_ecc_fault() {
    let mut h = NvmlSimHarness::start(&config("test-ecc.toml"));
    let s = h.wait_for("ECC counters in a sample", |seen| {
        sample_where(seen, 0, |g| g.ecc_volatile_corrected == Some(12))
    });
    assert_eq!(s.ecc_aggregate_corrected, Some(40));
    assert_eq!(s.ecc_volatile_uncorrected, Some(1));
    assert_eq!(s.ecc_aggregate_uncorrected, Some(1));
    let ev = h.wait_for("a DBE fault", |seen| {
        faults(seen)
            .into_iter()
            .find(|e| e.kind() == FaultKind::Ecc)
            .cloned()
    });
    assert_eq!(
        ev.attributes.get("ecc_type").map(String::as_str),
        Some("dbe")
    );
    assert_eq!(ev.gpu_uuid, UUID0);
    assert_eq!(ev.gpu_index, Some(0));
    assert_eq!(ev.source(), Source::NvmlEvent);
    h.stop();
}

#[test]
fn row_remap_pending_and_failure_and_recovery_action_show_in_samples() {
    let mut h = NvmlSimHarness::start(&config("test-row-remap.toml"));
    let pending = h.wait_for("a pending row remap", |seen| {
        sample_where(seen, 0, |g| g.remapped_rows_pending == Some(true))
    });
    assert_eq!(pending.remapped_rows_uncorrectable, Some(1));
    assert_eq!(pending.remapped_rows_failure, Some(false));
    assert_eq!(pending.recovery_action(), RecoveryAction::GpuReset);
    let failed = h.wait_for("a failed row remap", |seen| {
        sample_where(seen, 1, |g| g.remapped_rows_failure == Some(true))
    });
    assert_eq!(failed.remapped_rows_uncorrectable, Some(512));
    assert!(
        h.faults().is_empty(),
        "samples only: the engine derives faults"
    );
    h.stop();
}

#[test]
fn pcie_link_downtrained_shows_current_below_max() {
    let mut h = NvmlSimHarness::start(&config("test-pcie.toml"));
    let s = h.wait_for("a downtrained link", |seen| {
        sample_where(seen, 0, |g| g.pcie_link_width == Some(8))
    });
    assert_eq!(s.pcie_link_gen, Some(3));
    assert_eq!(s.pcie_link_gen_max, Some(5));
    assert_eq!(s.pcie_link_width_max, Some(16));
    assert_eq!(s.pcie_replay_counter, Some(17));
    h.stop();
}

#[test]
fn thermal_slowdown_is_one_thermal_fault_per_onset() {
    let mut h = NvmlSimHarness::start(&config("test-thermal.toml"));
    let ev = h.wait_for("a thermal fault", |seen| {
        faults(seen)
            .into_iter()
            .find(|e| e.kind() == FaultKind::Thermal)
            .cloned()
    });
    assert_eq!(ev.gpu_uuid, UUID1);
    assert_eq!(ev.source(), Source::NvmlEvent);
    let temp = ev
        .attributes
        .get("temperature_c")
        .cloned()
        .unwrap_or_default();
    assert!(temp == "93" || temp == "94", "temperature_c = {temp:?}");
    let hot = h.wait_for("a slowed-down sample", |seen| {
        sample_where(seen, 1, |g| {
            g.clock_event_reasons.is_some_and(|r| r & 0x60 != 0)
        })
    });
    assert!(hot.temperature_c.is_some_and(|t| t >= 93));
    // The clearing clock event (t = 1 s) is no fault; the second onset (1.5 s) is.
    let n = h.wait_for("the second onset", |seen| {
        let n = faults(seen)
            .iter()
            .filter(|e| e.kind() == FaultKind::Thermal)
            .count();
        (n >= 2).then_some(n)
    });
    assert_eq!(n, 2);
    h.stop();
}

#[test]
fn nvlink_down_shows_in_samples_only_for_links_that_exist() {
    let mut h = NvmlSimHarness::start(&config("test-nvlink.toml"));
    let s = h.wait_for("a down link", |seen| {
        sample_where(seen, 0, |g| {
            g.nvlinks.iter().any(|l| l.active == Some(false))
        })
    });
    let down: Vec<u32> = s
        .nvlinks
        .iter()
        .filter(|l| l.active == Some(false))
        .map(|l| l.link)
        .collect();
    assert_eq!(down, vec![3]);
    assert_eq!(s.nvlinks[3].replay_errors, Some(7));
    assert_eq!(s.nvlinks[3].crc_data_errors, Some(0));
    let no_links = h.wait_for("GPU 1", |seen| sample_where(seen, 1, |_| true));
    assert!(
        no_links.nvlinks.is_empty(),
        "GPU without NVLink reports no links"
    );
    assert!(
        h.registry.nvml_errors().is_empty(),
        "{:?}",
        h.registry.nvml_errors()
    );
    h.stop();
}

#[test]
fn lost_and_removed_gpus_are_gpu_lost_faults_once_each() {
    let mut h = NvmlSimHarness::start(&config("test-gpu-lost.toml"));
    let lost = h.wait_for("two gpu_lost faults", |seen| {
        let l: Vec<FaultEvent> = faults(seen)
            .into_iter()
            .filter(|e| e.kind() == FaultKind::GpuLost)
            .cloned()
            .collect();
        (l.len() >= 2).then_some(l)
    });
    let mut uuids: Vec<&str> = lost.iter().map(|e| e.gpu_uuid.as_str()).collect();
    uuids.sort_unstable();
    assert_eq!(
        uuids,
        vec![UUID1, "GPU-00000000-1111-2222-3333-444444444442"],
        "GPU 1 (GPU_IS_LOST) and GPU 2 (removed)"
    );
    for e in &lost {
        assert_eq!(e.source(), Source::NvmlPoll);
        assert!(!e.pci_address.is_empty() && e.gpu_index.is_some(), "{e:?}");
    }
    // Both come back at 1.2 s: a full sample again, and no further gpu_lost.
    h.wait_for("all three GPUs back", |seen| match seen.last() {
        Some(Input::Samples { samples: s, .. }) if s.len() == 3 => Some(()),
        _ => None,
    });
    let n = h
        .faults()
        .iter()
        .filter(|e| e.kind() == FaultKind::GpuLost)
        .count();
    assert_eq!(n, 2, "each loss reported once");
    // GPU 0's power reading fails: counted under its NVML function, field empty.
    let errors = h.registry.nvml_errors();
    assert!(
        errors
            .get("nvmlDeviceGetPowerUsage")
            .is_some_and(|&n| n > 0),
        "{errors:?}"
    );
    assert!(
        !errors.contains_key("nvmlDeviceGetRetiredPages"),
        "NotSupported is no error"
    );
    let s0 = sample_where(&h.seen, 0, |_| true).expect("GPU 0 sample");
    assert_eq!(s0.power_mw, None);
    h.stop();
}

#[test]
fn init_failure_is_a_monitor_status_never_a_fault_then_recovers() {
    let mut h = NvmlSimHarness::start(&config("test-init-failure.toml"));
    h.wait_for("ok:true after the failures", |seen| {
        seen.iter()
            .any(|i| matches!(i, Input::MonitorStatus { ok: true, .. }))
            .then_some(())
    });
    let statuses: Vec<(bool, String)> = h
        .seen
        .iter()
        .filter_map(|i| match i {
            Input::MonitorStatus {
                input: MonitorInput::Nvml,
                ok,
                message,
            } => Some((*ok, message.clone())),
            _ => None,
        })
        .collect();
    assert!(!statuses[0].0, "first status is ok:false: {statuses:?}");
    assert!(
        statuses[0].1.contains("driver is not loaded"),
        "{statuses:?}"
    );
    assert!(statuses.last().is_some_and(|s| s.0));
    assert_eq!(statuses.len(), 2, "one status per change: {statuses:?}");
    assert!(h.faults().is_empty(), "a monitor problem is never a fault");
    assert_eq!(h.registry.nvml_errors().get("nvmlInit_v2"), Some(&2));
    h.wait_for("samples after recovery", |seen| {
        sample_where(seen, 0, |_| true)
    });
    h.stop();
}

#[test]
fn missing_library_is_a_monitor_status_and_shutdown_is_prompt() {
    let cfg = NvmlSettings {
        library_path: Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1")),
        poll_interval: Duration::from_millis(50),
        retry_interval: Duration::from_secs(30),
        ..NvmlSettings::default()
    };
    let mut h = NvmlSimHarness::start(&cfg);
    let msg = h.wait_for("ok:false", |seen| {
        seen.iter().find_map(|i| match i {
            Input::MonitorStatus {
                ok: false, message, ..
            } => Some(message.clone()),
            _ => None,
        })
    });
    assert!(msg.contains("/nonexistent/libnvidia-ml.so.1"), "{msg}");
    assert_eq!(h.registry.nvml_errors().get("dlopen"), Some(&1));
    assert!(h.faults().is_empty());
    // The poller is inside a 30 s retry wait; shutdown must not wait for it
    // (5 s: well below it, and a loaded machine's lateness stays inside).
    let took = h.stop();
    assert!(took < Duration::from_secs(5), "join took {took:?}");
}

/// Both threads end at the shutdown signal: the poller's 50 ms sleep and the
/// event source's 500 ms event wait end, not the 30 s call deadline the stop
/// would otherwise wait out before leaving them behind.
#[test]
fn shutdown_joins_both_threads_promptly() {
    let cfg = NvmlSettings {
        call_timeout: Duration::from_secs(30),
        ..config("test-xid.toml")
    };
    let mut h = NvmlSimHarness::start(&cfg);
    assert_eq!(h.sources.len(), 2, "poller and event source");
    h.wait_for("a sample", |seen| sample_where(seen, 0, |_| true));
    let took = h.stop();
    assert!(took < Duration::from_secs(5), "join took {took:?}");
}

/// Polls 10 s apart (the default): stopping between two polls does not wait
/// for the next one; the poller's sleep ends at the shutdown signal.
#[test]
fn stopping_between_polls_ten_seconds_apart_is_prompt() {
    let cfg = NvmlSettings {
        poll_interval: Duration::from_secs(10),
        events: false,
        ..config("test-xid.toml")
    };
    let mut h = NvmlSimHarness::start(&cfg);
    h.wait_for("a sample", |seen| sample_where(seen, 0, |_| true));
    std::thread::sleep(Duration::from_millis(200));
    let took = h.stop();
    // Well below the 10 s to the next poll.
    assert!(took < Duration::from_secs(5), "join took {took:?}");
}

#[test]
fn poll_once_finds_the_simulator_and_reads_every_gpu() {
    let lib = sim_lib();
    let cfg = NvmlSettings {
        library_path: Some(lib.to_path_buf()),
        sim_scenario: Some(scenario("demo.toml")),
        ..NvmlSettings::default()
    };
    let samples = poll_nvml_once(&cfg).expect("poll_once");
    assert_eq!(samples.len(), 8);
    let indexes: Vec<u32> = samples.iter().map(|s| s.index).collect();
    assert_eq!(indexes, (0..8).collect::<Vec<_>>());
    assert_eq!(samples[7].pci_address, "0000:db:00.0");
    // Without library_path the simulator is found next to the test executable's
    // parent directory (target/<profile>/).
    let auto = NvmlSettings {
        library_path: None,
        ..cfg
    };
    assert_eq!(
        poll_nvml_once(&auto).expect("auto-found simulator").len(),
        8
    );
}

#[test]
fn poll_once_reports_a_missing_scenario_by_path() {
    let cfg = NvmlSettings {
        library_path: Some(sim_lib().to_path_buf()),
        sim_scenario: Some(PathBuf::from("/nonexistent/scenario.toml")),
        ..NvmlSettings::default()
    };
    let err = poll_nvml_once(&cfg).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/scenario.toml"), "{err}");
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which ends with ')'): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    let ticks = 100.0; // USER_HZ on Linux
    f.iter().sum::<u64>() as f64 / ticks
}

#[test]
#[ignore = "measurement, runs 30 s: cargo test -p gpuwatch --test nvml_sim -- --ignored --nocapture idle_cost"]
fn idle_cost_of_eight_gpus_polled_every_ten_seconds() {
    let cfg = NvmlSettings {
        library_path: Some(sim_lib().to_path_buf()),
        sim_scenario: Some(scenario("demo.toml")),
        ..NvmlSettings::default()
    };
    let mut h = NvmlSimHarness::start(&cfg);
    h.wait_for("a first poll", |seen| sample_where(seen, 7, |_| true));
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let window = Duration::from_secs(30);
    while t0.elapsed() < window {
        if let Ok(i) = h.rx.recv_timeout(Duration::from_millis(500)) {
            h.receive(i);
        }
    }
    let cpu = cpu_seconds() - cpu0;
    let share = cpu / t0.elapsed().as_secs_f64() * 100.0;
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let polls = h
        .seen
        .iter()
        .filter(|i| matches!(i, Input::Samples { .. }))
        .count();
    println!(
        "8 simulated GPUs, 10 s poll: {cpu:.3} CPU s in 30 s = {share:.3} % of a core; {polls} polls; {rss}"
    );
    // The target is < 0.1 % of a core for a release build; a debug build of the
    // simulator and wrapper costs more, so it only gets a sanity bound.
    let limit = if cfg!(debug_assertions) { 0.5 } else { 0.1 };
    assert!(
        share < limit,
        "idle CPU {share:.3} % of a core (limit {limit} %)"
    );
    h.stop();
}

/// Regression: NVML enumerating zero GPUs made every GPU lost
/// (reboot_node). It is a monitor problem: ok:false, no gpu_lost fault.
#[test]
fn zero_gpus_is_a_monitor_status_not_every_gpu_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all-removed.toml");
    std::fs::write(
        &path,
        r#"description = "every GPU leaves enumeration, then comes back"

[[gpu]]
uuid = "GPU-00000000-1111-2222-3333-444444444440"
pci = "00000000:1B:00.0"

[[gpu]]
uuid = "GPU-00000000-1111-2222-3333-444444444441"
pci = "00000000:3B:00.0"

[[inject]]
at_ms = 200
gpu = 0
removed = true

[[inject]]
at_ms = 200
gpu = 1
removed = true

[[inject]]
at_ms = 1200
gpu = 0
removed = false

[[inject]]
at_ms = 1200
gpu = 1
removed = false
"#,
    )
    .unwrap();
    let cfg = NvmlSettings {
        sim_scenario: Some(path),
        ..config("test-gpu-lost.toml")
    };
    let mut h = NvmlSimHarness::start(&cfg);
    h.wait_for("ok:false for zero GPUs", |seen| {
        seen.iter()
            .any(|i| {
                matches!(i, Input::MonitorStatus { ok: false, message, .. } if message.contains("no GPUs"))
            })
            .then_some(())
    });
    h.wait_for("both GPUs back", |seen| match seen.last() {
        Some(Input::Samples { samples, complete }) if samples.len() == 2 => {
            assert!(complete);
            Some(())
        }
        _ => None,
    });
    assert!(
        h.faults().iter().all(|e| e.kind() != FaultKind::GpuLost),
        "{:#?}",
        summary(&h.seen)
    );
    assert!(
        h.seen
            .iter()
            .all(|i| !matches!(i, Input::Samples { samples, .. } if samples.is_empty())),
        "no empty poll is sent as samples"
    );
    h.stop();
}

/// NVML statuses sent so far, with their arrival times.
fn statuses(h: &NvmlSimHarness) -> Vec<(bool, String, Instant)> {
    h.seen
        .iter()
        .zip(&h.arrived)
        .filter_map(|(i, t)| match i {
            Input::MonitorStatus {
                input: MonitorInput::Nvml,
                ok,
                message,
            } => Some((*ok, message.clone(), *t)),
            _ => None,
        })
        .collect()
}

fn hang_config(scenario_name: &str, poll_ms: u64, call_timeout_ms: u64) -> NvmlSettings {
    NvmlSettings {
        poll_interval: Duration::from_millis(poll_ms),
        retry_interval: Duration::from_millis(200),
        call_timeout: Duration::from_millis(call_timeout_ms),
        ..config(scenario_name)
    }
}

/// Waits for an NVML status `ok` whose message contains `needle`, sent after
/// input number `from`; returns its position and when it arrived.
fn wait_status(h: &mut NvmlSimHarness, from: usize, ok: bool, needle: &str) -> (usize, Instant) {
    let n = h.wait_for(&format!("ok:{ok} ({needle})"), |seen| {
        seen.iter().skip(from).position(|i| {
            matches!(i, Input::MonitorStatus { input: MonitorInput::Nvml, ok: o, message }
                if *o == ok && message.contains(needle))
        })
    }) + from;
    (n, h.arrived[n])
}

/// Waits (at most 20 s) until `n` more NVML calls have been abandoned past
/// their deadline (each is counted in the registry's NVML errors): fresh
/// workers tried again and got stuck again.
fn wait_more_hung_calls(h: &NvmlSimHarness, n: u64) {
    let hung = || h.registry.nvml_errors().values().sum::<u64>();
    let base = hung();
    assert!(
        crate::common::wait_until(Duration::from_secs(20), || hung() >= base + n),
        "no {n} more hung calls after {base}: {:?}",
        h.registry.nvml_errors()
    );
}

fn complete_polls(seen: &[Input]) -> usize {
    seen.iter()
        .filter(|i| matches!(i, Input::Samples { samples, complete: true } if samples.len() == 2))
        .count()
}

/// `test-hang.toml`: from 1.5 s after the first init every NVML call blocks
/// for 10 minutes. The GPUs read Unknown within two poll intervals of the
/// hang (never Unhealthy), the progress heartbeat stops, and stopping the
/// sources takes no longer than the call deadline although the stuck calls
/// never return.
#[test]
fn hung_nvml_makes_gpus_unknown_within_two_polls_and_stop_is_bounded() {
    let (poll, deadline) = (Duration::from_millis(500), Duration::from_millis(300));
    // The simulator's clock starts at the first init, after this.
    let started = Instant::now();
    let mut h = NvmlSimHarness::with_engine(&hang_config(
        "test-hang.toml",
        poll.as_millis() as u64,
        deadline.as_millis() as u64,
    ));
    h.wait_for("a first complete poll", |seen| {
        (complete_polls(seen) > 0).then_some(())
    });
    assert_eq!(
        h.verdicts(),
        vec![(Some(0), Verdict::Healthy), (Some(1), Verdict::Healthy)]
    );
    assert!(h.sources.made_progress_within(deadline));
    let (_, unavailable) = wait_status(&mut h, 0, false, "did not return within 300 ms");
    // The hang began no earlier than 1.5 s after `started`.
    let after_hang = unavailable.saturating_duration_since(started + Duration::from_millis(1500));
    assert!(
        after_hang <= 2 * poll,
        "NVML reported unavailable {after_hang:?} after the hang began (poll interval {poll:?})"
    );
    assert_eq!(
        h.verdicts(),
        vec![(Some(0), Verdict::Unknown), (Some(1), Verdict::Unknown)],
        "a monitor problem is Unknown, never Unhealthy"
    );
    let health = h.engine.as_ref().unwrap().engine.health();
    assert!(!health.input_up("nvml"));
    assert!(h.faults().is_empty(), "a hang is never a fault");
    let errors = h.registry.nvml_errors();
    assert!(!errors.is_empty(), "the hung call is counted: {errors:?}");
    // The heartbeat stands still while the calls are stuck.
    assert!(
        crate::common::wait_until(Duration::from_secs(3), || !h
            .sources
            .made_progress_within(deadline)),
        "the NVML heartbeat kept going while every call hung"
    );
    // Fresh workers keep trying (and getting stuck): still no ok:true.
    wait_more_hung_calls(&h, 2);
    while let Ok(i) = h.rx.try_recv() {
        h.receive(i);
    }
    let st = statuses(&h);
    assert_eq!(
        st.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![true, false],
        "one status per change: {st:?}"
    );
    let took = h.stop();
    // The stop API's own bound is the deadline; allow for scheduling on a
    // loaded machine.
    assert!(
        took <= deadline + Duration::from_millis(150),
        "stop took {took:?} with a {deadline:?} call deadline"
    );
}

/// `test-hang-temperature.toml`: the third poll's first temperature read
/// blocks for 1.5 s, then the driver answers again. NVML is unavailable while
/// the call is stuck; once it returns a fresh worker initialises NVML again,
/// polls, and the GPUs are healthy again.
#[test]
fn hung_call_that_returns_is_followed_by_a_fresh_session() {
    let (poll, deadline) = (Duration::from_millis(300), Duration::from_millis(250));
    let mut h = NvmlSimHarness::with_engine(&hang_config(
        "test-hang-temperature.toml",
        poll.as_millis() as u64,
        deadline.as_millis() as u64,
    ));
    h.wait_for("two complete polls", |seen| {
        (complete_polls(seen) >= 2).then_some(())
    });
    let second_poll = h.arrived[h
        .seen
        .iter()
        .enumerate()
        .filter(|(_, i)| matches!(i, Input::Samples { complete: true, .. }))
        .nth(1)
        .map(|(n, _)| n)
        .unwrap()];
    let (at, unavailable) =
        wait_status(&mut h, 0, false, "nvmlDeviceGetTemperature did not return");
    // The third poll starts one interval after the second; the hang is
    // reported within two intervals of that.
    let since = unavailable.saturating_duration_since(second_poll);
    assert!(
        since <= 3 * poll,
        "reported {since:?} after the second poll"
    );
    assert!(
        h.verdicts().iter().all(|(_, v)| *v == Verdict::Unknown),
        "{:?}",
        h.verdicts()
    );
    let polls_before = complete_polls(&h.seen);
    wait_status(&mut h, at, true, "2 GPUs, 2 answering");
    h.wait_for("a complete poll after recovery", |seen| {
        (complete_polls(seen) > polls_before).then_some(())
    });
    assert_eq!(
        h.verdicts(),
        vec![(Some(0), Verdict::Healthy), (Some(1), Verdict::Healthy)]
    );
    let s = sample_where(&h.seen, 0, |_| true).unwrap();
    assert_eq!(s.temperature_c, Some(35), "readings come back");
    assert!(
        h.registry
            .nvml_errors()
            .get("nvmlDeviceGetTemperature")
            .is_some_and(|&n| n >= 1),
        "{:?}",
        h.registry.nvml_errors()
    );
    assert!(h.sources.made_progress_within(deadline + poll));
    assert!(h.faults().is_empty(), "a hang is never a fault");
    let took = h.stop();
    assert!(
        took <= deadline + Duration::from_millis(150),
        "stop took {took:?}"
    );
}

/// A `gpuwatch run` whose NVML wedges (every call blocks for 10 minutes):
/// `/v1/health` says the GPUs are unknown within two poll intervals, and
/// SIGTERM still ends the process within 10 s, cleanly.
#[test]
fn sigterm_ends_an_agent_with_hung_nvml_within_ten_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::common::data("nvml-hang.toml");
    let agent = crate::common::TestAgent::start_nvml_sim(
        dir.path(),
        &scenario("test-hang.toml"),
        &["--config", config.to_str().unwrap()],
    );
    let addr = agent.api_addr().expect("API address");
    let gpus = |want: &str| {
        crate::common::http_get(&addr, "/v1/health")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|h| {
                let g = h["gpus"].as_array()?.clone();
                (g.len() == 2 && g.iter().all(|g| g["verdict"] == want)).then_some(h)
            })
    };
    assert!(
        crate::common::wait_until(Duration::from_secs(10), || gpus("healthy").is_some()),
        "GPUs never healthy: {}",
        agent.stderr.tail(20)
    );
    // Hang at 1.5 s after init; deadline 1 s, polls every 500 ms.
    assert!(
        crate::common::wait_until(Duration::from_secs(5), || gpus("unknown").is_some()),
        "GPUs never unknown: {}",
        agent.stderr.tail(20)
    );
    let h = gpus("unknown").unwrap();
    assert_eq!(
        crate::common::monitor_input(&h, "nvml")["state"],
        "down",
        "{h:#}"
    );
    assert!(
        h["monitor"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("did not return within 1000 ms")),
        "{h:#}"
    );
    assert!(
        !agent
            .logs("An NVML call did not return within its deadline; NVML counts as unavailable and the call's thread is abandoned.")
            .is_empty()
    );
    let t = Instant::now();
    let (code, _, stderr) = agent.stop();
    let took = t.elapsed();
    assert_eq!(code, Some(0), "{}", stderr.tail(20));
    assert!(took < Duration::from_secs(10), "SIGTERM took {took:?}");
    assert!(
        !stderr.matching("gpuwatch stopped.").is_empty(),
        "{}",
        stderr.tail(20)
    );
    println!("SIGTERM with hung NVML: exited in {took:?}");
}

/// Only the event wait wedges (forever, from 1 s on) while every poll still
/// answers: NVML is unavailable all the same (XID events are not watched),
/// and the status does not flap although fresh event workers answer other
/// calls before they get stuck again.
#[test]
fn hung_event_wait_alone_holds_nvml_unavailable_without_flapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("event-wait-hang.toml");
    std::fs::write(
        &path,
        r#"description = "the event wait wedges forever from 1 s on"

[[gpu]]
uuid = "GPU-00000000-1111-2222-3333-444444444440"
pci = "00000000:1B:00.0"

[[gpu]]
uuid = "GPU-00000000-1111-2222-3333-444444444441"
pci = "00000000:3B:00.0"

[[hang]]
call = "nvmlEventSetWait_v2"
at_ms = 1000
"#,
    )
    .unwrap();
    let deadline = Duration::from_millis(200);
    let cfg = NvmlSettings {
        sim_scenario: Some(path),
        ..hang_config("test-xid.toml", 200, deadline.as_millis() as u64)
    };
    let mut h = NvmlSimHarness::with_engine(&cfg);
    let (at, _) = wait_status(&mut h, 0, false, "nvmlEventSetWait_v2 did not return");
    // Several backoff rounds: fresh event workers answer a few calls and get
    // stuck again; the poller keeps polling.
    wait_more_hung_calls(&h, 2);
    while let Ok(i) = h.rx.try_recv() {
        h.receive(i);
    }
    let st = statuses(&h);
    assert_eq!(
        st.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![true, false],
        "{st:?}"
    );
    // Samples are held back while a call is hung: the engine would take
    // them as NVML answering.
    assert!(
        h.seen[at..]
            .iter()
            .all(|i| !matches!(i, Input::Samples { .. })),
        "{:#?}",
        summary(&h.seen[at..])
    );
    assert!(
        h.verdicts().iter().all(|(_, v)| *v == Verdict::Unknown),
        "{:?}",
        h.verdicts()
    );
    assert!(!h.sources.made_progress_within(deadline));
    let took = h.stop();
    assert!(
        took <= deadline + Duration::from_millis(150),
        "stop took {took:?}"
    );
}

/// `gpuwatch validate`'s one-shot poll has the same deadline: a wedged
/// enumeration is an error naming the call, returned in time.
#[test]
fn poll_once_gives_up_on_a_hung_call_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("count-hang.toml");
    std::fs::write(
        &path,
        r#"description = "enumeration never returns"

[[gpu]]
uuid = "GPU-00000000-1111-2222-3333-444444444440"
pci = "00000000:1B:00.0"

[[hang]]
call = "nvmlDeviceGetCount_v2"
"#,
    )
    .unwrap();
    let cfg = NvmlSettings {
        library_path: Some(sim_lib().to_path_buf()),
        sim_scenario: Some(path),
        call_timeout: Duration::from_millis(200),
        ..NvmlSettings::default()
    };
    let t = Instant::now();
    let err = poll_nvml_once(&cfg).unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(
            err,
            NvmlError::Hung {
                call: "nvmlDeviceGetCount_v2",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("did not return within 200 ms"),
        "{err}"
    );
    // It ended at the 200 ms deadline: well below the default 5 s one, and
    // the hung call never returns.
    assert!(
        took < Duration::from_millis(2500),
        "poll_once took {took:?}"
    );
}

/// The same with the default 5 s call deadline, SIGTERM arriving while calls
/// are stuck but not yet past their deadline: shutdown leaves them behind
/// after at most the deadline, and the process ends within 10 s.
#[test]
fn sigterm_with_the_default_deadline_and_stuck_calls_exits_within_ten_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let agent =
        crate::common::TestAgent::start_nvml_sim(dir.path(), &scenario("test-hang.toml"), &[]);
    let addr = agent.api_addr().expect("API address");
    assert!(
        crate::common::wait_until(Duration::from_secs(10), || {
            crate::common::http_get(&addr, "/v1/health")
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                .is_some_and(|h| crate::common::monitor_input(&h, "nvml")["state"] == "up")
        }),
        "NVML never available: {}",
        agent.stderr.tail(20)
    );
    // Every call blocks from 1.5 s after the first init on. SIGTERM must
    // come while calls are stuck but before their 5 s deadline: the
    // simulator gives no sign that a call entered its hang, and the agent
    // reports a stuck call only at that deadline, so the test waits for
    // the scenario's own time (1.5 s, and a poll that started after it).
    std::thread::sleep(Duration::from_millis(2500));
    let t = Instant::now();
    let (code, _, stderr) = agent.stop();
    let took = t.elapsed();
    assert_eq!(code, Some(0), "{}", stderr.tail(20));
    assert!(took < Duration::from_secs(10), "SIGTERM took {took:?}");
    assert!(
        !stderr.matching("leaving it behind").is_empty()
            || stderr
                .matching("abandoning it so that gpuwatch exits")
                .iter()
                .any(|l| l.contains("\"thread\":\"NVML\"")),
        "the stuck event wait was left behind: {}",
        stderr.tail(20)
    );
    println!("SIGTERM with stuck NVML calls, default deadline: exited in {took:?}");
}

/// `hgx-fabric-manager-restart.toml`: GPU 0 is registered with the NVLink
/// fabric, leaves it at 1.5 s (pending again: the fabric manager restarted)
/// and is registered again at 5 s. The poller reads the registration through
/// `nvmlDeviceGetGpuFabricInfoV`; the engine raises a reboot-class fabric
/// fault while it is pending and clears it once it is back.
#[test]
fn a_gpu_leaving_the_fabric_is_a_fault_until_it_is_registered_again() {
    let mut h = NvmlSimHarness::with_engine(&config("hgx-fabric-manager-restart.toml"));
    let registered = h.wait_for("a registered sample", |seen| {
        sample_where(seen, 0, |g| {
            g.fabric.as_ref().is_some_and(|f| f.state == "completed")
        })
    });
    let f = registered.fabric.unwrap();
    assert_eq!(f.status, "success");
    assert_eq!(f.clique_id, 1);
    assert_eq!(f.cluster_uuid, "6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11");
    assert_eq!(f.health_mask, Some(0x1AA), "read through the v3 struct");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut raised = false;
    while Instant::now() < deadline {
        if let Ok(input) = h.rx.recv_timeout(Duration::from_millis(100)) {
            h.receive(input);
        }
        let rig = h.engine.as_mut().unwrap();
        rig.advance(1);
        let faults = rig.gpu_faults("0000:18:00.0");
        if !raised && faults == ["GPUFabricNotRegistered"] {
            raised = true;
            assert!(h.verdicts().contains(&(Some(0), Verdict::Unhealthy)));
        } else if raised && faults.is_empty() {
            break;
        }
    }
    assert!(raised, "no fabric fault: {:#?}", summary(&h.seen));
    let rig = h.engine.as_ref().unwrap();
    assert!(
        rig.gpu_faults("0000:18:00.0").is_empty(),
        "the fault did not clear once the GPU was registered again"
    );
    let ev = h
        .faults()
        .into_iter()
        .find(|e| e.kind() == FaultKind::Fabric);
    assert!(
        ev.is_none(),
        "fabric faults come from the engine, not the source"
    );
    assert!(h.verdicts().iter().all(|(_, v)| *v == Verdict::Healthy));
    h.stop();
}

/// `test-mig.toml` through the real NVML path: the poller reads MIG mode
/// and each MIG device's UUID, GPU instance and compute instance.
#[test]
fn mig_devices_are_read_with_their_instance_ids() {
    let mut h = NvmlSimHarness::start(&config("test-mig.toml"));
    let s = h.wait_for("a sample with MIG devices", |seen| {
        sample_where(seen, 0, |g| !g.mig_devices.is_empty())
    });
    assert_eq!(s.mig_enabled, Some(true));
    assert_eq!(s.mig_pending, Some(true), "no change pending");
    let ids: Vec<(&str, u32, u32, &str, u32, u64)> = s
        .mig_devices
        .iter()
        .map(|m| {
            (
                m.uuid.as_str(),
                m.gpu_instance,
                m.compute_instance,
                m.profile.as_str(),
                m.gpu_slices,
                m.memory_mib,
            )
        })
        .collect();
    // H200 (143771 MiB): the profiles named from nvmlDeviceGetAttributes_v2
    // and the GPU's memory as the device plugin names them.
    assert_eq!(
        ids,
        [
            (
                "MIG-1d2c3b4a-5f6e-5a7b-8c9d-0e1f2a3b4c01",
                1,
                0,
                "3g.71gb",
                3,
                71_885
            ),
            (
                "MIG-1d2c3b4a-5f6e-5a7b-8c9d-0e1f2a3b4c05",
                5,
                0,
                "2g.35gb",
                2,
                35_942
            ),
            (
                "MIG-1d2c3b4a-5f6e-5a7b-8c9d-0e1f2a3b4c0d",
                13,
                0,
                "1g.18gb",
                1,
                17_971
            ),
        ]
    );
    assert!(s.mig_devices.iter().all(|m| m.error.is_empty()));
    let s1 = sample_where(&h.seen, 1, |_| true).unwrap();
    assert_eq!(s1.mig_devices.len(), 2);
    h.stop();
}

/// `/v1/health` of the agent at `addr`, once `pred` holds for it (15 s).
fn wait_agent_health(
    addr: &str,
    agent: &crate::common::TestAgent,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let health = || {
        crate::common::http_get(addr, "/v1/health")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
    };
    assert!(
        crate::common::wait_until(Duration::from_secs(15), || health()
            .is_some_and(|h| pred(&h))),
        "{what}: {:#?} {}",
        health(),
        agent.stderr.tail(20)
    );
    health().unwrap()
}

/// The GPU at `pci` in `/v1/health` `h`.
fn health_gpu(h: &serde_json::Value, pci: &str) -> serde_json::Value {
    h["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["pci_address"] == pci)
        .unwrap_or_else(|| panic!("no GPU {pci}: {h:#}"))
        .clone()
}

/// A GPU's MIG instances in `/v1/health`: (GPU instance, verdict).
fn instance_verdicts(g: &serde_json::Value) -> Vec<(u64, String)> {
    g["mig_instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["gpu_instance"].as_u64().unwrap(),
                m["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A whole agent on `test-mig.toml` with a kernel log it follows: XID 94
/// (contained ECC) on GPU instance 5 of GPU 0 marks that instance only —
/// its siblings, GPU 0 and the node stay healthy — while XID 95
/// (uncontained ECC) on GPU instance 1 of GPU 1 takes the whole GPU and
/// both its instances. `/v1/health` keeps the instance on the fault.
#[test]
fn a_contained_mig_fault_is_scoped_to_its_instance_through_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("kmsg.log");
    std::fs::write(&log, "").unwrap();
    let agent = crate::common::TestAgent::start_nvml_sim(
        &dir.path().join("state"),
        &scenario("test-mig.toml"),
        &["--kmsg-path", log.to_str().unwrap()],
    );
    let addr = agent.api_addr().expect("API address");
    wait_agent_health(&addr, &agent, "MIG instances never listed", |h| {
        h["gpus"]
            .as_array()
            .is_some_and(|g| g.len() == 2 && g.iter().all(|g| g["mig_instances"].is_array()))
    });
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(
        &mut f,
        b"3,10,1000,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=7101, name=python, Ch 00000008, Contained ECC error\n\
          3,11,1100,-;NVRM: Xid (PCI:0000:5d:00 GPU-I:01): 95, pid=7202, name=python, Ch 00000010, Uncontained ECC error\n",
    )
    .unwrap();
    let h = wait_agent_health(&addr, &agent, "faults never active", |h| {
        h["gpus"].as_array().is_some_and(|g| {
            g.iter()
                .all(|g| g["active_faults"].as_array().is_some_and(|a| !a.is_empty()))
        })
    });
    let g0 = health_gpu(&h, "0000:3b:00.0");
    assert_eq!(g0["verdict"], "healthy", "{g0:#}");
    assert_eq!(g0["active_faults"][0]["gpu_instance"], 5, "{g0:#}");
    assert_eq!(
        instance_verdicts(&g0),
        [
            (1, "healthy".to_owned()),
            (5, "degraded".to_owned()),
            (13, "healthy".to_owned())
        ]
    );
    let g1 = health_gpu(&h, "0000:5d:00.0");
    assert_eq!(g1["verdict"], "unhealthy", "{g1:#}");
    assert_eq!(
        instance_verdicts(&g1),
        [(1, "unhealthy".to_owned()), (2, "unhealthy".to_owned())]
    );
    let events = agent.events("Contained ECC error");
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["attributes"]["gpu_instance"], "5");
    let (code, _, stderr) = agent.stop();
    assert_eq!(code, Some(0), "{}", stderr.tail(20));
}
