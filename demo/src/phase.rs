//! One boot of the demo: the agent started, the scenario's kernel lines
//! written at their times, what the agent reports narrated (its events and log
//! as they come, `/v1/health` four times a second), and the agent stopped.

use crate::DemoError;
use crate::agent::{Agent, Phase, http_get};
use crate::kernel_log::{KernelLog, KernelLogKind};
use crate::narrate::Narrator;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often `/v1/health` is read.
const HEALTH_EVERY: Duration = Duration::from_millis(250);

/// Starts the agent, plays the script, narrates, stops the agent with
/// SIGTERM; returns its exit status (`None`: killed after 15 s).
pub fn run_phase(
    n: &mut Narrator,
    kmsg: &mut KernelLog,
    state: &Path,
    phase: &Phase<'_>,
    stop: &AtomicBool,
) -> Result<Option<ExitStatus>, DemoError> {
    if kmsg.kind == KernelLogKind::Device {
        start_at_ring_end(n, kmsg, state, phase.boot_id_path);
    }
    let mut agent = Agent::start(phase, kmsg, state)?;
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
/// scripted line when its time comes, narrates what the agent reported.
fn play(
    n: &mut Narrator,
    kmsg: &mut KernelLog,
    phase: &Phase<'_>,
    agent: &Agent,
    api: &str,
    stop: &AtomicBool,
) {
    let mut next = 0usize;
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    while agent.elapsed() < phase.duration && !stop.load(Ordering::Relaxed) {
        while let Some(line) = phase.script.get(next)
            && agent.elapsed() >= Duration::from_millis(line.at_ms)
        {
            n.say("INJECT", &line.note);
            n.say("", &format!("{} ← {}", kmsg.label(), line.message));
            if let Err(e) = kmsg.write(&line.message) {
                n.say("", &format!("cannot write the kernel log: {e}"));
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
        std::thread::sleep(Duration::from_millis(25));
    }
}
