//! The whole demo: the first boot, the simulated reboot (the agent stopped with
//! SIGTERM, a new boot id written to the file it reads it from, the agent
//! restarted on the same state directory with the after-reboot scenario), how
//! the lines look in the kernel log when they went there, and the summary.

use crate::agent::{self, CLEAR_SAMPLES, Phase};
use crate::kernel_log::{
    self, KernelLog, KernelLogKind, NVIDIA_DRIVER_PROC, PrintkGuard, choose_kernel_log,
    dmesg_x_view,
};
use crate::narrate::{LINE_WIDTH, Narrator, wrap};
use crate::nic::{FLAP_AFTER_LAST_INJECT_MS, NetworkTimings};
use crate::phase::run_phase;
use crate::script::{ScriptedLine, flap_script, last_inject_ms, read_scenario};
use crate::{DemoArgs, DemoError, setup_err};
use gpuwatch_test_support::sysfs::FakeSysfs;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The scenarios read and how long each boot runs.
struct Plan {
    speed: u32,
    /// The first boot's scenario (times scaled) and script.
    boot1: (String, Vec<ScriptedLine>),
    /// The after-reboot scenario and script (`None`: `--no-reboot`).
    reboot: Option<(String, Vec<ScriptedLine>)>,
    duration1: Duration,
    duration2: Duration,
    /// The agent's `[network]` timings and the flap's.
    net: NetworkTimings,
}

impl Plan {
    fn read(args: &DemoArgs) -> Result<Plan, DemoError> {
        let speed = args.speed.max(1);
        let scaled_ms = |ms: u64| Duration::from_millis(ms / u64::from(speed));
        let net = crate::nic::timings(speed);
        let mut boot1 = read_scenario(&args.scenario, speed)?;
        let original = std::fs::read_to_string(&args.scenario).unwrap_or_default();
        // The flap follows the scenario's story, when it has one.
        let flap = (!boot1.1.is_empty()).then(|| {
            let start = last_inject_ms(&original) + FLAP_AFTER_LAST_INJECT_MS;
            flap_script(start, speed, &net)
        });
        let flap_end = flap.as_ref().map_or(Duration::ZERO, |f| {
            Duration::from_millis(f.first().map_or(0, |l| l.at_ms)) + net.flap_story()
        });
        boot1.1.extend(flap.into_iter().flatten());
        boot1.1.sort_by_key(|l| l.at_ms);
        let reboot = if args.no_reboot {
            None
        } else {
            Some(read_scenario(&args.reboot_scenario, speed)?)
        };
        let duration1 = if args.duration_secs > 0 {
            Duration::from_secs(args.duration_secs)
        } else {
            scaled_ms((last_inject_ms(&original) + 3_000).max(20_000)).max(flap_end)
        };
        let duration2 = reboot.as_ref().map_or(Duration::ZERO, |(text, _)| {
            Duration::from_millis(last_inject_ms(text)) + scaled_ms(6_000)
        });
        Ok(Plan {
            speed,
            boot1,
            reboot,
            duration1,
            duration2,
            net,
        })
    }

    /// Every kernel line of both boots.
    fn messages(&self) -> Vec<String> {
        self.boot1
            .1
            .iter()
            .chain(self.reboot.iter().flat_map(|(_, s)| s.iter()))
            .map(|l| l.message.clone())
            .collect()
    }
}

/// The demo's temporary state directory, removed on drop.
struct StateDir(PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the agent runs with. Dropped in field order: the kernel log closes,
/// `printk_devkmsg` comes back, the NIC tree and the state directory go.
struct Setup {
    kmsg: KernelLog,
    _printk: PrintkGuard,
    /// The node's RDMA NICs, in the state directory.
    sysfs: FakeSysfs,
    state: StateDir,
    config: PathBuf,
    boot_id_path: PathBuf,
    boot1: String,
    /// The newest `/dev/kmsg` record before the demo wrote any.
    first_seq: u64,
}

fn write_file(path: &Path, contents: &str) -> Result<(), DemoError> {
    std::fs::write(path, contents).map_err(setup_err(format!("cannot write {}", path.display())))
}

impl Setup {
    fn prepare(kind: KernelLogKind, speed: u32) -> Result<Setup, DemoError> {
        let state = std::env::temp_dir().join(format!("gpuwatch-demo-{}", std::process::id()));
        std::fs::create_dir_all(&state)
            .map_err(setup_err(format!("cannot create {}", state.display())))?;
        let state = StateDir(state);
        let printk = PrintkGuard::for_kind(kind)?;
        let kmsg = KernelLog::open(kind, &state.0)?;
        let first_seq = kmsg.last_seq().unwrap_or(0);
        let sysfs = crate::nic::build_tree(&state.0)?;
        let config = state.0.join("demo-agent.toml");
        write_file(&config, &agent::agent_config(speed))?;
        let boot_id_path = state.0.join("boot_id");
        let boot1 = crate::read_boot_id(Path::new(crate::BOOT_ID_PATH)).unwrap_or_else(new_boot_id);
        write_file(&boot_id_path, &format!("{boot1}\n"))?;
        Ok(Setup {
            kmsg,
            _printk: printk,
            sysfs,
            state,
            config,
            boot_id_path,
            boot1,
            first_seq,
        })
    }

    fn dir(&self) -> &Path {
        &self.state.0
    }
}

/// A new boot id (the kernel's random UUID source, else time and pid).
fn new_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            let nanos = gpuwatch_core::clock::unix_nanos(std::time::SystemTime::now());
            format!("demo-{nanos:x}-{:x}", std::process::id())
        })
}

/// Ctrl-C / SIGTERM: the flag is set, and the demo stops early (still
/// restoring `printk_devkmsg` and removing its state directory).
fn watch_signals() -> Result<Arc<AtomicBool>, DemoError> {
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(setup_err("cannot start the signal runtime".into()))?;
    let flag = stop.clone();
    let guard = rt.enter();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(setup_err("cannot install signal handlers".into()))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(setup_err("cannot install signal handlers".into()))?;
    drop(guard);
    std::thread::spawn(move || {
        rt.block_on(async {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        });
        flag.store(true, Ordering::Relaxed);
    });
    Ok(stop)
}

fn print_wrapped(text: &str) {
    for line in wrap(text, LINE_WIDTH, "") {
        println!("{line}");
    }
}

fn print_intro(args: &DemoArgs, why: &str, setup: &Setup, plan: &Plan) {
    println!(
        "gpuwatch demo: the real agent, simulated GPUs ({}).",
        args.scenario.display()
    );
    print_wrapped(why);
    println!("State directory {}.", setup.dir().display());
    println!(
        "NVML is polled every {} ms; a condition fault clears after {CLEAR_SAMPLES} clean \
         samples. Ctrl-C stops early.",
        agent::poll_ms(plan.speed)
    );
    let net = &plan.net;
    print_wrapped(&format!(
        "RDMA NICs: {} InfiniBand NDR ports in a sysfs tree of the demo's ({}, --sysfs-root), \
         read every {} ms; {} flaps within {} s are NICPortFlapping, cleared after {} s without \
         one.",
        crate::nic::NICS.len(),
        setup.sysfs.root().display(),
        net.poll_interval_ms,
        net.flap_threshold,
        net.flap_window_secs,
        net.flap_quiet_secs
    ));
    if plan.speed > 1 {
        println!("timeline {}× faster than the scenario says.", plan.speed);
    }
    println!(
        "\n── boot 1 ({}), {} s ──",
        setup.boot1,
        plan.duration1.as_secs_f64().round()
    );
}

/// Runs both boots (the second unless `--no-reboot`, a signal, or a failed
/// first agent) and prints the summary; an error when it could not start or
/// an agent did not exit 0.
pub(crate) fn run(args: &DemoArgs) -> Result<(), DemoError> {
    let plan = Plan::read(args)?;
    let exe = agent::gpuwatch_exe(args.agent.as_deref())?;
    let (kind, why) = choose_kernel_log(
        args.kmsg,
        Path::new(NVIDIA_DRIVER_PROC).exists(),
        kernel_log::kmsg_writable(),
    )
    .map_err(DemoError::Input)?;
    let setup = Setup::prepare(kind, plan.speed)?;
    let stop = watch_signals()?;
    print_intro(args, &why, &setup, &plan);
    let mut demo = Demo {
        args,
        plan,
        exe,
        setup,
        stop,
        n: Narrator::new(),
    };
    let status1 = demo.boot_1()?;
    let mut statuses = vec![status1];
    let boot1_node = demo.n.last_node.clone();
    if demo.plan.reboot.is_some()
        && status1.is_some_and(|s| s.success())
        && !demo.stop.load(Ordering::Relaxed)
    {
        statuses.push(demo.boot_2(status1)?);
        demo.n.explain_remaining();
    }
    if kind == KernelLogKind::Device {
        show_kernel_log(&demo.setup, &demo.plan.messages());
    }
    let boot1_node = demo.plan.reboot.is_some().then_some(&boot1_node);
    print_summary(&demo.n, &statuses, boot1_node, kind);
    exit_result(&statuses)
}

/// A demo under way: what both boots share.
struct Demo<'a> {
    args: &'a DemoArgs,
    plan: Plan,
    exe: PathBuf,
    setup: Setup,
    stop: Arc<AtomicBool>,
    n: Narrator,
}

impl Demo<'_> {
    /// The first boot; returns the agent's exit status.
    fn boot_1(&mut self) -> Result<Option<ExitStatus>, DemoError> {
        let scenario = self.setup.dir().join("scenario-boot-1.toml");
        write_file(&scenario, &self.plan.boot1.0)?;
        let phase = Phase {
            exe: &self.exe,
            scenario: &scenario,
            script: &self.plan.boot1.1,
            duration: self.plan.duration1,
            boot_id_path: &self.setup.boot_id_path,
            config: &self.setup.config,
            sysfs: &self.setup.sysfs,
            net: &self.plan.net,
        };
        run_phase(
            &mut self.n,
            &mut self.setup.kmsg,
            &self.setup.state.0,
            &phase,
            &self.stop,
        )
    }

    /// The simulated reboot and the second boot; returns the agent's exit
    /// status.
    fn boot_2(&mut self, status1: Option<ExitStatus>) -> Result<Option<ExitStatus>, DemoError> {
        let Some((scenario2, script2)) = &self.plan.reboot else {
            return Ok(None);
        };
        let state = self.setup.dir().to_path_buf();
        self.n.say(
            "REBOOT",
            &format!(
                "agent stopped by SIGTERM ({}); {} active fault(s) flushed to {}",
                status1.map_or_else(|| "killed".to_string(), |s| s.to_string()),
                agent::state_file_faults(&state)
                    .map_or_else(|| "no".to_string(), |c| c.to_string()),
                state.join(gpuwatch_core::engine::STATE_FILE).display()
            ),
        );
        let boot2 = new_boot_id();
        write_file(&self.setup.boot_id_path, &format!("{boot2}\n"))?;
        self.n.say(
            "REBOOT",
            &format!(
                "simulated reboot: new boot id {boot2} in {} (--boot-id-path); NVML now follows {}",
                self.setup.boot_id_path.display(),
                self.args.reboot_scenario.display()
            ),
        );
        println!(
            "\n── boot 2 ({boot2}), {} s ──",
            self.plan.duration2.as_secs_f64().round()
        );
        let scenario = state.join("scenario-boot-2.toml");
        write_file(&scenario, scenario2)?;
        let phase = Phase {
            exe: &self.exe,
            scenario: &scenario,
            script: script2,
            duration: self.plan.duration2,
            boot_id_path: &self.setup.boot_id_path,
            config: &self.setup.config,
            sysfs: &self.setup.sysfs,
            net: &self.plan.net,
        };
        run_phase(
            &mut self.n,
            &mut self.setup.kmsg,
            &state,
            &phase,
            &self.stop,
        )
    }
}

/// After a `--kmsg` run: the demo's records as `dmesg -x` shows them, and
/// which commands keep their facility.
fn show_kernel_log(setup: &Setup, written: &[String]) {
    let view = dmesg_x_view(&setup.kmsg.path, setup.first_seq, written);
    if view.is_empty() {
        return;
    }
    println!();
    print_wrapped(
        "The demo's lines stay in this machine's kernel log until the ring wraps. `dmesg -x` \
         shows them as user-facility records, which `gpuwatch run` ignores by default and \
         `dmesg -x | gpuwatch scan` skips:",
    );
    for line in view {
        for part in wrap(&line, LINE_WIDTH, "    ") {
            println!("{part}");
        }
    }
    print_wrapped(
        "`dmesg -S -r` keeps the facility too (`<12>`). Plain `dmesg` prints none, and `dmesg -r` \
         from util-linux before 2.39.4 prints a kernel record's prefix (`<5>`): a tool reading \
         those cannot tell these lines from the driver's. Without --kmsg the demo leaves the \
         kernel log alone.",
    );
}

fn print_summary(
    n: &Narrator,
    statuses: &[Option<ExitStatus>],
    boot1_node: Option<&String>,
    kind: KernelLogKind,
) {
    println!("\nSummary after {:.0} s:", n.t0.elapsed().as_secs_f64());
    // Two lines: with every action class present, one would pass 120
    // characters.
    println!("  fault events: {}", n.events);
    println!("  by final action: {}", n.actions_summary());
    if let Some(node) = boot1_node
        && statuses.len() > 1
    {
        println!("  node state before the reboot: {node}");
    }
    println!(
        "  network: {} NIC record(s); last reported {}",
        n.net.records,
        n.net
            .last_condition
            .as_deref()
            .unwrap_or("nothing (no network in /v1/health)")
    );
    println!(
        "  final node state: {}",
        if n.last_health.is_some() {
            n.last_node.as_str()
        } else {
            "API never answered"
        }
    );
    for (i, s) in statuses.iter().enumerate() {
        println!(
            "  agent exit (boot {}): {}",
            i + 1,
            s.map_or("killed (did not stop within 15 s)".to_string(), |s| s
                .to_string())
        );
    }
    if kind == KernelLogKind::Device {
        println!("  printk_devkmsg restored; nothing was written to any cluster.");
    } else {
        println!("  the kernel log was not touched; nothing was written to any cluster.");
    }
}

/// An error for the first boot whose agent failed or did not stop.
fn exit_result(statuses: &[Option<ExitStatus>]) -> Result<(), DemoError> {
    for s in statuses {
        match s {
            Some(s) if s.success() => {}
            Some(s) => return Err(DemoError::Agent(format!("exited with {s}"))),
            None => return Err(DemoError::Agent("did not stop on SIGTERM".into())),
        }
    }
    Ok(())
}
