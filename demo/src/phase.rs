//! One boot of the demo: the agent started, the scenario's kernel lines (and
//! the NIC flap's port changes) written at their times, what the agent
//! reports narrated (its events and log as they come, `/v1/health` four times
//! a second), and the agent stopped.

use crate::DemoError;
use crate::agent::{AgentProcess, Phase, http_get};
use crate::health_view::GpuView;
use crate::kernel_log::{KernelLog, KernelLogKind};
use crate::narrate::Narrator;
use crate::script::ScriptedLine;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often `/v1/health` is read.
const HEALTH_EVERY: Duration = Duration::from_millis(250);

/// Starts the agent, plays the script, narrates, stops the agent with
/// SIGTERM; returns its exit status (`None`: killed after 15 s).
pub(crate) fn run_phase(
    n: &mut Narrator,
    kmsg: &mut KernelLog,
    state: &Path,
    phase: &Phase<'_>,
    stop: &AtomicBool,
) -> Result<Option<ExitStatus>, DemoError> {
    if kmsg.kind == KernelLogKind::Device {
        start_at_ring_end(n, kmsg, state, phase.boot_id_path);
    }
    let mut agent = AgentProcess::start(phase, kmsg, state)?;
    n.net.agent_started();
    let api = agent.wait_for_api(n)?;
    n.say("", &format!("agent started (API http://{api}/v1/health)"));
    play(n, kmsg, phase, &agent, &api, stop);
    Ok(agent.stop(n))
}

/// Starts the agent at the kernel log's current end so records from before
/// the demo (or, after the simulated reboot, from the "previous boot") do not
/// crowd the timeline: a position for this boot at the last sequence number.
/// (A real reboot starts with an empty ring; a real first start reads the
/// whole ring.)
fn start_at_ring_end(n: &Narrator, kmsg: &KernelLog, state: &Path, boot_id_path: &Path) {
    let (Some(last_seq), Some(boot_id)) = (kmsg.last_seq(), crate::read_boot_id(boot_id_path))
    else {
        return;
    };
    let position = gpuwatch_core::msg::KmsgPosition { boot_id, last_seq };
    if let Err(e) = gpuwatch_core::engine::preset_kmsg_position(state, position) {
        n.say(
            "",
            &format!(
                "cannot pre-set the kernel log position ({e}); the agent reads the whole ring"
            ),
        );
    }
}

/// Until the phase's duration has passed (or a signal came): writes each
/// scripted line when its time comes (a NIC line's port change into the sysfs
/// tree first), narrates what the agent reported, and says what it did not
/// report about the flapped port in time.
fn play(
    n: &mut Narrator,
    kmsg: &mut KernelLog,
    phase: &Phase<'_>,
    agent: &AgentProcess,
    api: &str,
    stop: &AtomicBool,
) {
    let mut next = 0usize;
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let first_port_line = phase.script.iter().position(|l| l.port.is_some());
    let last_port_line = phase.script.iter().rposition(|l| l.port.is_some());
    while agent.elapsed() < phase.duration && !stop.load(Ordering::Relaxed) {
        while let Some(line) = phase.script.get(next)
            && agent.elapsed() >= Duration::from_millis(line.at_ms)
        {
            write_line(n, kmsg, phase, line, Some(next) == first_port_line);
            if Some(next) == last_port_line {
                n.net.flap_written();
            }
            next += 1;
        }
        agent.drain(n);
        if last_poll.elapsed() >= HEALTH_EVERY {
            last_poll = Instant::now();
            if let Some(body) = http_get(api, "/v1/health")
                && let Ok(h) = serde_json::from_str::<gpuwatch_proto::NodeHealth>(&body)
            {
                n.health(h);
            }
        }
        for missing in n.net.overdue(Some(Instant::now())) {
            n.say("NETWORK", &missing);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    agent.drain(n);
    if !stop.load(Ordering::Relaxed) {
        for missing in n.net.overdue(None) {
            n.say("NETWORK", &format!("{missing} (the boot ended)"));
        }
    }
}

/// Writes one scripted line and narrates it. A NIC line changes its port in
/// the sysfs tree first, as the port changes before the driver prints; the
/// first one starts what the narration waits for.
fn write_line(
    n: &mut Narrator,
    kmsg: &mut KernelLog,
    phase: &Phase<'_>,
    line: &ScriptedLine,
    first_port_line: bool,
) {
    match &line.port {
        Some(change) => {
            if first_port_line {
                let gpus: Vec<GpuView> = n.gpus.values().cloned().collect();
                n.net.flap_begins(
                    &change.port_name(),
                    change.nic.netdev,
                    &gpus,
                    Duration::from_secs(phase.net.flap_quiet_secs),
                    phase.net.report_timeout,
                );
            }
            crate::nic::apply(phase.sysfs, change);
            n.say(
                "INJECT",
                &format!("{}; {} ← {}", line.note, kmsg.label(), line.message),
            );
        }
        None => {
            n.say("INJECT", &line.note);
            n.say("", &format!("{} ← {}", kmsg.label(), line.message));
        }
    }
    if let Err(e) = kmsg.write(&line.message, line.level()) {
        n.say("", &format!("cannot write the kernel log: {e}"));
    }
}
