//! `gpuwatch explain`: the effective classification policy.

use super::{init_logging, load_policy, resolve_each, unless_broken_pipe};
use anyhow::Context as _;
use gpuwatch::LogFormat;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    args: gpuwatch::ExplainArgs,
    /// Configuration file whose `[policy]` overrides (and, with `--network`,
    /// `[network]` settings) apply.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    init_logging(LogFormat::Text, "warn");
    if args.args.network {
        let resolved = resolve_each(args.config.as_deref())?;
        let settings = resolved.network().context("invalid [network] settings")?;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        unless_broken_pipe(gpuwatch::explain_network(
            settings,
            args.args.format,
            &mut out,
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let policy = load_policy(args.config.as_deref())?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    unless_broken_pipe(gpuwatch::explain(&args.args, &policy, &mut out))?;
    Ok(ExitCode::SUCCESS)
}
