//! `gpuwatch validate`: the startup gate's device validation once, judged by
//! the agent's own engine and kernel-log reader, built through the same
//! [`gpuwatch::resolve`] and [`gpuwatch::prepare`] as `gpuwatch run`.

use super::init_logging;
use anyhow::Context as _;
use gpuwatch::{Config, LogFormat, Overrides};
use gpuwatch::{PrepareError, Prepared};
use gpuwatch_core::validation::Expected;
use gpuwatch_proto::{ValidationCheck, ValidationReport};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct Args {
    /// Configuration file (`[nvml]`, `[kmsg]`, `[engine]`, `[policy]`,
    /// `[kube]`, `[validation]`); checked like `check-config` first.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Use the nvml-sim library with this scenario file.
    #[arg(long, value_name = "SCENARIO")]
    pub(crate) nvml_sim: Option<PathBuf>,
    /// GPUs the node must have (`validation.expected_gpus`). Without it, the
    /// count comes from the Node (label `validation.expected_gpus_label`, else
    /// its `nvidia.com/gpu` capacity) when `[kube]` is enabled or `--node` is
    /// given; otherwise the count check cannot run and the report is incomplete.
    #[arg(long, value_name = "N")]
    pub(crate) expected_gpus: Option<u32>,
    /// Read the expected GPU count from this Node (default: `node_name` /
    /// `NODE_NAME` when `[kube]` is enabled).
    #[arg(long, value_name = "NAME")]
    pub(crate) node: Option<String>,
    /// Read kernel-log records from this kmsg-format file instead of the
    /// `[kmsg] path` (`/dev/kmsg`), e.g. a saved copy of the ring.
    #[arg(long, value_name = "FILE")]
    pub(crate) kmsg_path: Option<PathBuf>,
    /// Print the report as JSON (`ValidationReport` of the gpuwatch.v1 schema).
    #[arg(long)]
    pub(crate) json: bool,
}

impl Args {
    /// The flags as settings over the file's (flags win): `--kmsg-path`
    /// reads the file to its end.
    pub(crate) fn overrides(&self) -> Overrides {
        Overrides {
            nvml_sim: self.nvml_sim.clone(),
            expected_gpus: self.expected_gpus,
            node_name: self.node.clone(),
            exit_at_eof: self.kmsg_path.is_some(),
            kmsg_path: self.kmsg_path.clone(),
            ..Overrides::default()
        }
    }

    /// Whether the expected GPU count is read from the Node when the
    /// configuration does not set it (`[kube]` enabled, or `--node`).
    fn reads_node(&self, prepared: &Prepared) -> bool {
        prepared.kube().enabled() || self.node.is_some()
    }
}

/// Prints the report; exit 0 when it passed and is complete, else 1.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    init_logging(LogFormat::Text, "warn");
    let cfg = gpuwatch::resolve(args.config.as_deref(), &args.overrides())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime for the validation")?;
    let prepared = prepare(cfg)?;
    let read_node = args.reads_node(&prepared);
    let (expected, node_problem) = expected_gpus(&rt, &prepared, read_node);
    let health = prepared.check_once()?;
    let report = judge(&rt, &prepared, &health, expected, node_problem);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", gpuwatch_core::validation::render(&report));
    }
    Ok(if report.passed && report.complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// [`gpuwatch::prepare`], with the messages this command has always given.
fn prepare(cfg: Config) -> anyhow::Result<Prepared> {
    gpuwatch::prepare(cfg).map_err(|e| match e {
        PrepareError::Boot(e) => e.into(),
        PrepareError::Config(e) => gpuwatch::ConfigError::Invalid(e).into(),
    })
}

/// An expected count and where it came from.
#[derive(Debug, Clone, Copy)]
enum ExpectedCount {
    /// `validation.expected_gpus`.
    Configured(u32),
    /// Read from the Node: in the units the device plugin's MIG strategy gives it.
    Node(u32),
}

/// The expected GPU count, as the startup gate resolves it, and why the
/// Node could not tell it.
fn expected_gpus(
    rt: &tokio::runtime::Runtime,
    prepared: &Prepared,
    read_node: bool,
) -> (Option<ExpectedCount>, Option<String>) {
    let validation = prepared.validation();
    match validation.expected_gpus {
        Some(n) => (Some(ExpectedCount::Configured(n.get())), None),
        None if read_node => {
            match rt.block_on(gpuwatch_kube::expected_gpus_from_node(
                prepared.kube(),
                validation,
                prepared.node_name(),
            )) {
                Ok(n) => (n.map(ExpectedCount::Node), None),
                Err(e) => (None, Some(e.to_string())),
            }
        }
        None => (None, None),
    }
}

/// The report: the startup gate's checks over `health`, the Node's problem
/// when it could not tell the count, and the extra command once every other
/// check passed.
fn judge(
    rt: &tokio::runtime::Runtime,
    prepared: &Prepared,
    health: &gpuwatch_proto::NodeHealth,
    expected: Option<ExpectedCount>,
    node_problem: Option<String>,
) -> ValidationReport {
    let validation = prepared.validation();
    let expected = expected.map(|c| match c {
        ExpectedCount::Configured(n) => Expected::Gpus(n),
        ExpectedCount::Node(n) => gpuwatch_kube::node_count(n, prepared.kube(), health),
    });
    let mut report = gpuwatch_core::validation::validate_expecting(health, expected, validation);
    if let Some(why) = node_problem {
        gpuwatch_core::validation::add_check(
            &mut report,
            ValidationCheck {
                name: "node".into(),
                gpu_index: None,
                passed: false,
                message: format!("unknown: expected GPU count not read from the Node: {why}"),
            },
        );
    }
    if report.passed {
        // The extra command (e.g. `dcgmi diag -r 1`) runs only once every
        // other check passed, as in the startup gate.
        let check = rt.block_on(gpuwatch_kube::run_extra_command(
            validation.extra_command.as_ref(),
        ));
        gpuwatch_core::validation::add_check(&mut report, check);
    }
    report.time_unix_nano = Some(gpuwatch_core::clock::unix_nanos(
        std::time::SystemTime::now(),
    ));
    report
}
