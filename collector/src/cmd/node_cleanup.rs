//! `gpuwatch node-cleanup`: removes gpuwatch's conditions, taints and DRA
//! DeviceTaintRules from a Node, or (`--all-nodes`, the uninstall hook) from
//! every Node, with the quarantine budget's Leases.

use super::init_logging;
use anyhow::Context as _;
use gpuwatch::LogFormat;
use gpuwatch_kube::{CleanupReport, FleetOptions, FleetReport, KubeSettings, NodeOutcome, PodWait};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("target")
        .required(true)
        .args(["node", "all_nodes"])
))]
pub(crate) struct Args {
    /// The Node to clean.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Clean every Node of the cluster and delete the quarantine budget's
    /// Leases (in `quarantine_namespace`, else the current namespace): what
    /// the Helm chart's post-delete hook runs. Exits 1 when anything failed,
    /// after doing all it could.
    #[arg(long)]
    all_nodes: bool,
    /// With `--all-nodes`: first wait (listing them every 2 s) until no pod
    /// matches LABELSELECTOR in NAMESPACE, so that an agent still
    /// terminating cannot put back what is removed; e.g.
    /// `gpuwatch/app.kubernetes.io/name=gpuwatch`.
    #[arg(
        long,
        value_name = "NAMESPACE/LABELSELECTOR",
        // Not `requires = "all_nodes"`: a flag's implicit `false` default
        // counts as present for `requires`.
        conflicts_with = "node",
        value_parser = parse_wait
    )]
    wait_for_pods: Option<String>,
    /// How long `--wait-for-pods` waits at most; then it logs a warning
    /// naming the pods still there and cleans anyway.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 120,
        requires = "wait_for_pods",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    timeout: u64,
    /// Configuration file whose `[kube]` names (condition types, taint keys,
    /// field manager, quarantine namespace, API server) apply; default: the
    /// built-in names.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print what would be removed; change nothing.
    #[arg(long)]
    dry_run: bool,
}

fn parse_wait(s: &str) -> Result<String, String> {
    PodWait::parse(s, Duration::ZERO).map(|_| s.to_owned())
}

/// Prints what it removed (or, with `--dry-run`, would remove).
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Progress goes to the log (stderr) at info for `--all-nodes`: in the
    // hook Job, `kubectl logs` is all the operator reads.
    let level = if args.all_nodes { "info" } else { "warn" };
    init_logging(LogFormat::Text, level);
    // Every section is resolved, as for every command, but only `[kube]`'s
    // problems stop the cleanup, on purpose: it runs when gpuwatch is
    // uninstalled, and refusing it over a section it does not use (an OTLP
    // variable of the Job, a policy override) would leave every taint and
    // condition behind.
    let resolved = super::resolve_each(args.config.as_deref())?;
    let settings = resolved.kube().context("invalid [kube] settings")?.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    match &args.node {
        Some(node) => one_node(&rt, &settings, node, args.dry_run),
        None => all_nodes(&rt, &settings, &args),
    }
}

fn verb(dry_run: bool) -> &'static str {
    if dry_run { "Would remove" } else { "Removed" }
}

fn print_removed(node: &str, report: &CleanupReport, dry_run: bool) {
    let verb = verb(dry_run);
    for c in &report.conditions {
        println!("{verb} condition {c} from node {node}.");
    }
    for t in &report.taints {
        println!("{verb} taint {t} from node {node}.");
    }
    for r in &report.device_taint_rules {
        println!("{verb} DeviceTaintRule {r} of node {node}.");
    }
}

fn one_node(
    rt: &tokio::runtime::Runtime,
    settings: &KubeSettings,
    node: &str,
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    let report = rt
        .block_on(gpuwatch_kube::node_cleanup(settings, node, dry_run))
        .with_context(|| format!("cleaning up node {node:?}"))?;
    if report.is_empty() {
        println!("Node {node}: nothing of gpuwatch's to remove.");
    }
    print_removed(node, &report, dry_run);
    Ok(ExitCode::SUCCESS)
}

fn all_nodes(
    rt: &tokio::runtime::Runtime,
    settings: &KubeSettings,
    args: &Args,
) -> anyhow::Result<ExitCode> {
    let wait = args
        .wait_for_pods
        .as_deref()
        .map(|w| PodWait::parse(w, Duration::from_secs(args.timeout)))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let opts = FleetOptions {
        dry_run: args.dry_run,
        wait,
        ..FleetOptions::default()
    };
    let report = rt
        .block_on(gpuwatch_kube::all_nodes_cleanup(settings, &opts))
        .context("cleaning up every node")?;
    print_fleet(&report);
    Ok(if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One line per thing removed on stdout, one per failure on stderr, then the
/// summary.
fn print_fleet(report: &FleetReport) {
    for n in &report.nodes {
        print_removed(&n.node, &n.removed, report.dry_run);
        match &n.outcome {
            NodeOutcome::Gone => println!("Skipped node {}: deleted since the list.", n.node),
            NodeOutcome::Failed(e) => eprintln!("error: node {}: {e}", n.node),
            NodeOutcome::Cleaned | NodeOutcome::Nothing => {}
        }
    }
    let verb = verb(report.dry_run);
    for l in &report.leases {
        println!("{verb} Lease {l}.");
    }
    for r in &report.device_taint_rules {
        println!("{verb} DeviceTaintRule {r}.");
    }
    for f in &report.failures {
        eprintln!("error: {f}");
    }
    println!("{}.", report.summary());
}
