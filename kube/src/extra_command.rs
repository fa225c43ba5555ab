//! The startup gate's optional extra validation command (`dcgmi diag -r 1`, a
//! vendor script, ...), run with a deadline on the tokio runtime. Its result is
//! folded into a [`ValidationReport`](gpuwatch_proto::ValidationReport) with
//! [`gpuwatch_core::validation::add_check`].

use gpuwatch_core::validation::{ExtraCommand, check, checks};
use gpuwatch_proto::ValidationCheck;

/// How much of the command's output a check message keeps.
const OUTPUT_TAIL_BYTES: usize = 512;

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let t = text.trim();
    let mut start = t.len().saturating_sub(OUTPUT_TAIL_BYTES);
    while !t.is_char_boundary(start) {
        start += 1;
    }
    t[start..].to_owned()
}

/// Runs the extra validation command, if one is configured (`Some`, with a
/// program), killing it after its timeout. The check passes when no command
/// is configured or it exits 0.
pub async fn run_extra_command(cmd: Option<&ExtraCommand>) -> ValidationCheck {
    let Some((cmd, (program, args))) = cmd.and_then(|c| Some((c, c.argv.split_first()?))) else {
        return check(
            checks::COMMAND,
            None,
            true,
            "no extra command configured".into(),
        );
    };
    let shown = cmd.argv.join(" ");
    let mut child = tokio::process::Command::new(program);
    child
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = match child.spawn() {
        Ok(c) => c,
        Err(e) => {
            return check(
                checks::COMMAND,
                None,
                false,
                format!("`{shown}` could not start: {e}"),
            );
        }
    };
    match tokio::time::timeout(cmd.timeout, child.wait_with_output()).await {
        Err(_) => check(
            checks::COMMAND,
            None,
            false,
            format!(
                "`{shown}` did not finish within {}s and was killed",
                cmd.timeout.as_secs()
            ),
        ),
        Ok(Err(e)) => check(
            checks::COMMAND,
            None,
            false,
            format!("`{shown}` failed while running: {e}"),
        ),
        Ok(Ok(out)) => {
            let mut output = tail(&out.stderr);
            if output.is_empty() {
                output = tail(&out.stdout);
            }
            let status = match out.status.code() {
                Some(c) => format!("exit code {c}"),
                None => "killed by a signal".to_owned(),
            };
            let msg = if output.is_empty() {
                format!("`{shown}` {status}")
            } else {
                format!("`{shown}` {status}: {output}")
            };
            check(checks::COMMAND, None, out.status.success(), msg)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command as `[validation]` configures it.
    fn configured(command: &[&str], timeout_secs: u64) -> ExtraCommand {
        ExtraCommand {
            argv: command.iter().map(|&a| a.to_owned()).collect(),
            timeout: std::time::Duration::from_secs(timeout_secs),
        }
    }

    #[tokio::test]
    async fn extra_command_outcomes() {
        let ok = run_extra_command(Some(&configured(&["true"], 300))).await;
        assert!(ok.passed, "{ok:?}");
        let fail = run_extra_command(Some(&configured(
            &["sh", "-c", "echo bad gpu >&2; exit 3"],
            300,
        )))
        .await;
        assert!(!fail.passed);
        assert!(
            fail.message.contains("exit code 3: bad gpu"),
            "{}",
            fail.message
        );
        let missing = run_extra_command(Some(&configured(&["/nonexistent/dcgmi"], 300))).await;
        assert!(!missing.passed && missing.message.contains("could not start"));
        let none = run_extra_command(None).await;
        assert!(none.passed);
        assert_eq!(none.message, "no extra command configured");
    }

    #[tokio::test(start_paused = true)]
    async fn extra_command_timeout_kills() {
        let slow = run_extra_command(Some(&configured(&["sleep", "30"], 1))).await;
        assert!(!slow.passed);
        assert!(
            slow.message.contains("did not finish within 1s"),
            "{}",
            slow.message
        );
    }
}
