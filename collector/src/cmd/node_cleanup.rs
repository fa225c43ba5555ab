//! `gpuwatch node-cleanup`: removes gpuwatch's conditions and taints from a
//! Node.

use super::init_logging;
use anyhow::Context as _;
use gpuwatch::config::{Config, LogFormat};
use gpuwatch_kube::KubeError;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The Node.
    #[arg(long, value_name = "NAME")]
    node: String,
    /// Configuration file whose `[kube]` names (condition types, taint keys,
    /// field manager, API server) apply; default: the built-in names.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print what would be removed; change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Prints what it removed (or, with `--dry-run`, would remove).
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args {
        node,
        config,
        dry_run,
    } = args;
    init_logging(LogFormat::Text, "warn");
    let kube = match &config {
        Some(c) => Config::load(c)?.kube,
        None => gpuwatch_kube::KubeConfig::default(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let report = rt
        .block_on(async {
            let settings = kube.resolve().map_err(KubeError::Config)?;
            gpuwatch_kube::node_cleanup(&settings, &node, dry_run).await
        })
        .with_context(|| format!("cleaning up node {node:?}"))?;
    let verb = if dry_run { "Would remove" } else { "Removed" };
    if report.is_empty() {
        println!("Node {node}: nothing of gpuwatch's to remove.");
    }
    for c in &report.conditions {
        println!("{verb} condition {c} from node {node}.");
    }
    for t in &report.taints {
        println!("{verb} taint {t} from node {node}.");
    }
    Ok(ExitCode::SUCCESS)
}
