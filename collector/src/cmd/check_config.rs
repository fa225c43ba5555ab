//! `gpuwatch check-config`: every problem of a configuration file at once.

use super::unless_broken_pipe;
use anyhow::Context as _;
use gpuwatch::Config;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The TOML file.
    file: PathBuf,
}

/// Prints `FILE: OK` (exit 0) or the problems (exit 1). A valid file that
/// leaves an OTLP endpoint of the environment unused gets the agent's start
/// warning first (`warning: ...`), still OK.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = args.file;
    // Schema and validation problems in one report.
    let (text, code) = match Config::check_file(&file) {
        Ok(settings) => {
            let mut text: String = settings
                .otlp()
                .map(|otlp| otlp.endpoint_warnings())
                .unwrap_or_default()
                .iter()
                .map(|w| format!("warning: {w}\n"))
                .collect();
            text.push_str(&format!("{}: OK", file.display()));
            (text, ExitCode::SUCCESS)
        }
        Err(e) => (e.to_string(), ExitCode::FAILURE),
    };
    // `writeln!`, not `println!`: a closed pipe must not panic. The exit
    // status still tells the verdict when nobody reads the text.
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    unless_broken_pipe(writeln!(out, "{text}").and_then(|()| out.flush()))
        .context("writing the check-config result")?;
    Ok(code)
}
