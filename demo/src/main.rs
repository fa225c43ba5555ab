//! `gpuwatch-demo`: a narrated run of the real gpuwatch agent on this machine,
//! with simulated GPUs, across a simulated reboot. A program of its own, not
//! part of the agent: it only starts `gpuwatch run` as a child process, and
//! the agent's container image does not carry something that writes fake
//! NVIDIA lines into a kernel log.
//!
//! Boot 1 starts the agent reading a kernel log, with NVML from the nvml-sim
//! library driven by a scenario, writes scripted NVIDIA kernel lines at the
//! times the scenario injects its XIDs, and narrates what the agent reports:
//! every emitted event (detection, classification, reclassification), every
//! cleared fault with the agent's reason (from its JSON log), and every change
//! of a GPU's or the node's verdict (polled from `/v1/health`). Boot 2
//! simulates a reboot: the agent is stopped with SIGTERM (it flushes its
//! state), a new boot id is written to the file the agent reads it from
//! (`--boot-id-path`), and the agent restarts on the same state directory with
//! the after-reboot scenario. The narration shows which faults the new boot
//! clears and why the others stay — all taken from the agent, none scripted.
//!
//! The node has four RDMA NICs in a fake sysfs tree the agent reads
//! (`--sysfs-root`); after the scenario's last injection one port flaps (its
//! state in the tree and the `mlx5_core` kernel lines), and the narration
//! shows the `NetworkProblem` condition the agent reports, the GPU verdicts
//! it leaves alone, and the clear after the quiet window.
//!
//! The kernel log is a private FIFO the agent reads through `--kmsg-path` (the
//! same reader code path as `/dev/kmsg`) unless `--kmsg` asks for this
//! machine's real `/dev/kmsg` (`kernel_log` says why).
//!
//! Modules by job: `script` (the kernel lines from the scenario, and the
//! flap's), `nic` (the NIC tree and the `[network]` timings), `kernel_log`
//! (the FIFO or `/dev/kmsg` they are written to), `agent` (the child
//! `gpuwatch run`), `phase` (one boot: play the script, narrate, stop),
//! `narrate`, `health_view` and `network_view` (the timeline's words), `run`
//! (both boots and the summary).

mod agent;
mod health_view;
mod kernel_log;
mod narrate;
mod network_view;
mod nic;
mod phase;
mod run;
mod script;

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Narrated gpuwatch demo: the real agent, simulated GPUs (nvml-sim),
/// scripted NVIDIA kernel lines, and a simulated reboot. No cluster needed.
/// The agent reads the demo's lines from a private FIFO; --kmsg writes them
/// into this machine's /dev/kmsg instead.
#[derive(Debug, Parser)]
#[command(name = "gpuwatch-demo", version, about)]
struct DemoCli {
    #[command(flatten)]
    args: DemoArgs,
}

/// The demo's command line (what `--help` lists; `--speed` is hidden).
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// nvml-sim scenario of the first boot (GPUs and timed faults).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "nvml-sim/scenarios/demo.toml"
    )]
    pub scenario: PathBuf,
    /// nvml-sim scenario after the simulated reboot.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "nvml-sim/scenarios/demo-after-reboot.toml"
    )]
    pub reboot_scenario: PathBuf,
    /// Stop after the first boot (no simulated reboot).
    #[arg(long)]
    pub no_reboot: bool,
    /// How long the first boot runs; 0: until 3 s after the scenario's last
    /// injection (at least 20 s).
    #[arg(long, default_value_t = 0)]
    pub duration_secs: u64,
    /// Write the scripted kernel lines into this machine's real /dev/kmsg, as
    /// user-facility records (needs root; refused where an NVIDIA driver is
    /// loaded). Other tools that read the kernel log see them too.
    #[arg(long, conflicts_with = "fifo")]
    pub kmsg: bool,
    /// Feed the agent through a private kmsg-format FIFO (the default; kept
    /// for scripts that ask for it).
    #[arg(long)]
    pub fifo: bool,
    /// The gpuwatch binary to run (default: `gpuwatch` beside this program).
    #[arg(long, value_name = "FILE")]
    pub agent: Option<PathBuf>,
    /// Runs the timeline this many times faster (scenario times, NVML poll
    /// interval, phase lengths); for tests.
    #[arg(long, hide = true, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub speed: u32,
}

/// Why the demo stopped before its summary, or failed after it.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The scenario could not be read or parsed.
    #[error("cannot use scenario {path}: {message}")]
    Scenario {
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
    /// The requested kernel log cannot be used, or the agent binary is missing.
    #[error("{0}")]
    Input(String),
    /// Setting up the machine failed.
    #[error("{what}: {source}")]
    Setup {
        /// What the demo was doing.
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The agent did not start or failed.
    #[error("the agent failed: {0}")]
    Agent(String),
}

/// Maps an I/O error to [`DemoError::Setup`] saying what failed.
fn setup_err(what: String) -> impl FnOnce(std::io::Error) -> DemoError {
    move |source| DemoError::Setup { what, source }
}

/// The running kernel's boot id.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The boot id in `path` (one token), as the agent reads it.
fn read_boot_id(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let id = text.trim();
    (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_string())
}

fn main() -> ExitCode {
    let cli = DemoCli::parse();
    match run::run(&cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwatch-demo: error: {e}");
            ExitCode::FAILURE
        }
    }
}
