//! `gpuwatch-demo`: a narrated run of the real gpuwatch agent on this machine,
//! with simulated GPUs, across a simulated reboot. A separate program from
//! `gpuwatch` so the agent's container image does not carry something that
//! writes fake NVIDIA lines into a kernel log.

use clap::Parser;
use std::process::ExitCode;

/// Narrated gpuwatch demo: the real agent, simulated GPUs (nvml-sim), scripted
/// NVIDIA kernel lines, and a simulated reboot. No cluster needed. Where an
/// NVIDIA driver is loaded or /dev/kmsg is not writable, the agent reads the
/// demo's lines from a private FIFO instead of the kernel log.
#[derive(Debug, Parser)]
#[command(name = "gpuwatch-demo", version, about)]
struct Cli {
    #[command(flatten)]
    args: gpuwatch::run::demo::DemoArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match gpuwatch::run::demo::run(&cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwatch-demo: error: {e}");
            ExitCode::FAILURE
        }
    }
}
