//! `gpuwatch explain`: the effective classification policy.

use super::{init_logging, load_policy, unless_broken_pipe};
use gpuwatch::config::LogFormat;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    args: gpuwatch::explain::ExplainArgs,
    /// Configuration file whose `[policy]` overrides apply.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    init_logging(LogFormat::Text, "warn");
    let policy = load_policy(args.config.as_deref())?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    unless_broken_pipe(gpuwatch::explain::run(&args.args, &policy, &mut out))?;
    Ok(ExitCode::SUCCESS)
}
