//! `gpuwatch scan`: GPU faults in saved kernel logs.

use super::{init_logging, load_policy, unless_broken_pipe};
use gpuwatch::LogFormat;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    args: gpuwatch::ScanArgs,
    /// Configuration file whose `[policy]` overrides apply.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Exit 2 when a reset/reboot/hardware-class fault was found (the summary's
/// code), 0 when the reader closed the pipe early.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    init_logging(LogFormat::Text, "warn");
    let policy = load_policy(args.config.as_deref())?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let Some(summary) = unless_broken_pipe(gpuwatch::scan(&args.args, policy, &mut out))? else {
        return Ok(ExitCode::SUCCESS);
    };
    Ok(ExitCode::from(
        u8::try_from(summary.exit_code()).unwrap_or(1),
    ))
}
