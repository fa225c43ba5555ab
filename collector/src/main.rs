//! The `gpuwatch` binary: the node agent (`run`) and its CLI tools. `main`
//! parses the command line, calls the one function of the chosen command
//! (a module of [`cmd`] each) and turns its result into the exit code.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// `gpuwatch --version`: the crate version and the commit it was built from
/// (`unknown` for a build outside a git checkout without `GPUWATCH_GIT_COMMIT`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GPUWATCH_GIT_COMMIT"),
    ")"
);

/// Per-node GPU health agent for Kubernetes: watches the kernel log and NVML
/// for NVIDIA XID / SXid / ECC / row-remap / PCIe / NVLink / thermal faults,
/// classifies them and reports them (OTLP, Kubernetes node conditions, taints,
/// Events).
#[derive(Debug, Parser)]
#[command(name = "gpuwatch", version = VERSION, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (until SIGTERM/SIGINT).
    Run(cmd::run::Args),
    /// Scan saved kernel logs (dmesg, journalctl -k, syslog, kmsg) for GPU faults
    /// (exit 2 when a reset/reboot/hardware-class fault was found).
    Scan(cmd::scan::Args),
    /// Print the effective classification policy for one or all XIDs.
    Explain(cmd::explain::Args),
    /// Check a configuration file: prints OK or every problem (exit 0 / 1).
    CheckConfig(cmd::check_config::Args),
    /// Check an install on its cluster (what `helm test` runs, as the agent's
    /// service account): the config loads, RBAC allows every request the
    /// agent makes (one SelfSubjectAccessReview each, in its namespace), and
    /// the agent's pods are Ready within --timeout. One PASS/FAIL line per
    /// finding (exit 0 only when all pass).
    CheckInstall(cmd::check_install::Args),
    /// Run the startup gate's device validation once and print the report
    /// (exit 0 when it passes, 1 when it fails or is incomplete; usable as an
    /// init container): one NVML poll, one read of the kernel-log ring of this
    /// boot, judged by the same health engine and checks as `gpuwatch run`.
    Validate(cmd::validate::Args),
    /// Clear active faults by hand (after a repair, an RMA, a false alarm):
    /// asks the running agent over its operator-clear Unix socket in the state
    /// directory (run it inside the gpuwatch container: `kubectl exec`).
    /// Recurrence history is kept. Prints how many faults were cleared.
    Clear(cmd::clear::Args),
    /// Remove gpuwatch's conditions, fault taint(s) and the startup taint from a
    /// Node (before or after an uninstall: nobody else clears them). Prints
    /// what it removed; other conditions and taints are never touched.
    NodeCleanup(cmd::node_cleanup::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Scan(args) => cmd::scan::run(args),
        Command::Explain(args) => cmd::explain::run(args),
        Command::CheckConfig(args) => cmd::check_config::run(args),
        Command::CheckInstall(args) => cmd::check_install::run(args),
        Command::Validate(args) => cmd::validate::run(args),
        Command::Clear(args) => cmd::clear::run(args),
        Command::NodeCleanup(args) => cmd::node_cleanup::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuwatch: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
