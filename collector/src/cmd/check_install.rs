//! `gpuwatch check-install`: proves an install works on its cluster (what the
//! chart's `helm test` Pod runs, as the agent's service account, with the
//! agent's ConfigMap mounted): the config loads, RBAC allows every request
//! the agent makes, and the agent's pods are Ready. The API checks are the
//! kube crate's ([`gpuwatch_kube::check_install`]).

use super::{init_logging, unless_broken_pipe};
use anyhow::Context as _;
use gpuwatch::{Config, LogFormat};
use gpuwatch_kube::{InstallCheck, KubeSettings};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The agent's configuration file (its `[kube]` section names the API
    /// server and the Event and Lease namespaces).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Namespace of the agent's pods.
    #[arg(long, value_name = "NS")]
    namespace: String,
    /// Label selector of the agent's pods (the DaemonSet's selector).
    #[arg(long, value_name = "SELECTOR")]
    selector: String,
    /// Seconds the agent's pods may take to be Ready.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    timeout: u64,
    /// Pass when no pod matches (no node matches the DaemonSet's node
    /// selection yet); without it, that fails.
    #[arg(long)]
    allow_no_pods: bool,
}

/// Prints one `PASS`/`FAIL <check>: ...` line per finding and the verdict;
/// exit 0 only when every check passed.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args {
        config,
        namespace,
        selector,
        timeout,
        allow_no_pods,
    } = args;
    // The report names every failure; the kube client's own ERROR logs of
    // the same failed requests would only repeat them.
    init_logging(LogFormat::Text, "warn,kube_client=off");
    if selector.trim().is_empty() {
        anyhow::bail!("--selector must not be empty (it picks the agent's pods)");
    }
    // The file's `[kube]` settings; when it does not load, the built-in ones
    // (the API checks still run, in the default scopes).
    let (problem, settings) = match Config::check_file(&config) {
        Ok(settings) => (None, settings.kube().clone()),
        Err(e) => (Some(e.to_string()), KubeSettings::default()),
    };
    let check = InstallCheck {
        config_file: config.display().to_string(),
        config_problem: problem,
        settings,
        namespace,
        selector,
        timeout: Duration::from_secs(timeout),
        allow_no_pods,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let report = rt.block_on(gpuwatch_kube::check_install(&check));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    unless_broken_pipe(write!(out, "{report}").and_then(|()| out.flush()))
        .context("writing the check-install report")?;
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
