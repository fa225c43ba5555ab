//! The subcommands of the `gpuwatch` binary, one module each with its own
//! `Args` and a `run` that returns the exit code, and what they share.

pub(crate) mod check_config;
pub(crate) mod check_install;
pub(crate) mod clear;
pub(crate) mod explain;
pub(crate) mod node_cleanup;
pub(crate) mod run;
pub(crate) mod scan;
pub(crate) mod validate;

use anyhow::Context as _;
use gpuwatch::{Config, LogFormat};
use std::io::IsTerminal as _;
use std::path::Path;

/// Logs to stderr in `format`, at `level` unless `RUST_LOG` says otherwise.
pub(crate) fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a person at a terminal: log collectors (kubectl
    // logs, journald, files) would store the escape sequences verbatim.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Every section of a config file (or of the defaults) resolved, for a
/// command that reads only some of them and so is not stopped by a problem
/// in another.
pub(crate) fn resolve_each(config: Option<&Path>) -> anyhow::Result<gpuwatch::Resolved> {
    let cfg = match config {
        Some(p) => Config::load(p)?,
        None => Config::defaults(),
    };
    Ok(cfg.resolve_each())
}

/// The policy of a config file's `[policy]` section, or the built-in one.
pub(crate) fn load_policy(
    config: Option<&Path>,
) -> anyhow::Result<std::sync::Arc<xid_parser::Policy>> {
    let resolved = resolve_each(config)?;
    let policy = resolved.policy().context("invalid [policy] overrides")?;
    Ok(policy.clone())
}

/// An error that may mean the reader of stdout went away.
pub(crate) trait BrokenPipe {
    /// Whether the write failed because the reader closed the pipe.
    fn is_broken_pipe(&self) -> bool;
}

impl BrokenPipe for std::io::Error {
    fn is_broken_pipe(&self) -> bool {
        self.kind() == std::io::ErrorKind::BrokenPipe
    }
}

impl BrokenPipe for gpuwatch::ScanError {
    fn is_broken_pipe(&self) -> bool {
        gpuwatch::ScanError::is_broken_pipe(self)
    }
}

impl BrokenPipe for gpuwatch::ExplainError {
    fn is_broken_pipe(&self) -> bool {
        gpuwatch::ExplainError::is_broken_pipe(self)
    }
}

/// A closed stdout is a normal end, not an error (`gpuwatch scan ... |
/// head`): `Ok(None)` then, so the command exits 0 without a message.
pub(crate) fn unless_broken_pipe<T, E: BrokenPipe>(result: Result<T, E>) -> Result<Option<T>, E> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_broken_pipe() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use gpuwatch::Prepared;
    use std::path::Path;

    #[derive(Parser)]
    struct RunCli {
        #[command(flatten)]
        args: super::run::Args,
    }

    #[derive(Parser)]
    struct ValidateCli {
        #[command(flatten)]
        args: super::validate::Args,
    }

    fn prepared_by_run(argv: &[&str]) -> Prepared {
        let args = RunCli::parse_from(std::iter::once("run").chain(argv.iter().copied())).args;
        let cfg = gpuwatch::resolve(args.config.as_deref(), &args.overrides().0).unwrap();
        gpuwatch::prepare(cfg).unwrap()
    }

    fn prepared_by_validate(argv: &[&str]) -> Prepared {
        let args =
            ValidateCli::parse_from(std::iter::once("validate").chain(argv.iter().copied())).args;
        let cfg = gpuwatch::resolve(args.config.as_deref(), &args.overrides()).unwrap();
        gpuwatch::prepare(cfg).unwrap()
    }

    /// Everything in a prepared agent but the boot time (a clock reading
    /// taken at each preparation).
    fn settings(p: &Prepared) -> String {
        p.settings_text()
    }

    /// A file that sets something in every section both commands read, each
    /// away from its default.
    fn write_config(dir: &Path) -> std::path::PathBuf {
        let boot_id = dir.join("boot_id");
        std::fs::write(&boot_id, "0e4f5d8a-run-and-validate\n").unwrap();
        let path = dir.join("gpuwatch.toml");
        let text = format!(
            r#"node_name = "node-from-file"
state_dir = "{state}"
[kmsg]
accept_user_facility = true
cursor_interval_ms = 250
boot_id_path = "{boot_id}"
[nvml]
poll_interval_secs = 3
call_timeout_ms = 1500
[engine]
dedup_window_secs = 17
cross_source_window_ms = 900
nvml_join_grace_secs = 7
[policy]
default_recurrence_reboots = 4
[policy.xid."79"]
action = "inspect_hardware"
[validation]
expected_gpus = 8
"#,
            state = dir.join("state").display(),
            boot_id = boot_id.display(),
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn run_and_validate_prepare_the_same_agent_from_the_same_config_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path());
        let config = config.to_str().unwrap();
        let replay = dir.path().join("ring.kmsg");
        let replay = replay.to_str().unwrap();
        // The same settings as each command spells them: validate's
        // --kmsg-path reads the file to its end, run's needs --exit-at-eof.
        let run = prepared_by_run(&[
            "--config",
            config,
            "--nvml-sim",
            "scenario.toml",
            "--kmsg-path",
            replay,
            "--exit-at-eof",
            "--node-name",
            "node-b",
        ]);
        let validate = prepared_by_validate(&[
            "--config",
            config,
            "--nvml-sim",
            "scenario.toml",
            "--kmsg-path",
            replay,
            "--node",
            "node-b",
        ]);
        let (r, v) = (&run, &validate);
        assert_eq!(r.engine(), v.engine(), "engine settings");
        assert_eq!(
            r.engine().dedup_window_ns,
            17_000_000_000,
            "read from the file"
        );
        assert_eq!(
            format!("{:?}", run.policy()),
            format!("{:?}", validate.policy()),
            "policy overrides"
        );
        assert_eq!(r.kmsg(), v.kmsg(), "kmsg settings");
        assert!(r.kmsg().accept_user_facility && r.kmsg().exit_at_eof);
        assert_eq!(r.nvml(), v.nvml(), "NVML settings");
        assert_eq!(
            r.nvml().sim_scenario.as_deref(),
            Some(Path::new("scenario.toml"))
        );
        assert_eq!(
            r.validation().expected_gpus,
            std::num::NonZeroU32::new(8),
            "expected GPU count"
        );
        assert_eq!(r.validation(), v.validation());
        assert_eq!(
            (r.node_name(), r.state_dir()),
            (v.node_name(), v.state_dir())
        );
        assert_eq!(r.node_name(), "node-b", "the flag wins over the file");
        assert_eq!(run.boot().boot_id, validate.boot().boot_id);
        assert_eq!(run.boot().boot_id, "0e4f5d8a-run-and-validate");
        let (a, b) = (
            run.boot().boot_time_unix_nano,
            validate.boot().boot_time_unix_nano,
        );
        assert!(a.abs_diff(b) < 1_000_000, "boot time {a} vs {b}");
        // And all of it, so a setting added later is covered too.
        assert_eq!(settings(&run), settings(&validate));
    }

    #[test]
    fn a_flag_only_one_command_was_given_makes_a_different_agent() {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path());
        let config = config.to_str().unwrap();
        let replay = dir.path().join("ring.kmsg");
        let replay = replay.to_str().unwrap();
        let run = prepared_by_run(&["--config", config, "--kmsg-path", replay]);
        let validate = prepared_by_validate(&["--config", config, "--kmsg-path", replay]);
        assert_ne!(run.kmsg(), validate.kmsg());
        assert_ne!(settings(&run), settings(&validate));
    }
}
