//! `gpuwatch clear`: operator clear of active faults, asked of the running
//! agent over its operator-clear socket.

use anyhow::Context as _;
use gpuwatch::Config;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// GPU to clear: NVML index, UUID or PCI address (default: every GPU and
    /// the node-level faults).
    #[arg(long, value_name = "INDEX|UUID|PCI")]
    gpu: Option<String>,
    /// Why (mandatory; logged by the agent with every cleared fault).
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// The agent's configuration file: its `state_dir` holds the socket.
    #[arg(long, value_name = "FILE", conflicts_with = "socket")]
    config: Option<PathBuf>,
    /// The socket itself (default: `gpuwatch.sock` in the default state
    /// directory, /var/lib/gpuwatch, as in both deploy overlays).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

/// Prints how many faults the agent cleared.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args {
        gpu,
        reason,
        config,
        socket,
    } = args;
    let socket = match (socket, config) {
        (Some(s), _) => s,
        (None, Some(c)) => {
            // Only `state_dir` is read: a problem elsewhere in the file does
            // not keep the operator from clearing.
            let resolved = Config::load(&c)?.resolve_each();
            gpuwatch::clear_socket_path(resolved.state_dir().context("invalid state_dir")?)
        }
        (None, None) => {
            gpuwatch::clear_socket_path(std::path::Path::new(gpuwatch::DEFAULT_STATE_DIR))
        }
    };
    let cleared = operator_clear(&socket, gpu.as_deref(), &reason)?;
    match &gpu {
        Some(g) => println!("Cleared {cleared} active fault(s) of GPU {g}."),
        None => println!("Cleared {cleared} active fault(s)."),
    }
    Ok(ExitCode::SUCCESS)
}

/// `POST /v1/clear` over the agent's operator-clear Unix socket: one HTTP/1.1
/// request (no client library needed).
fn operator_clear(
    socket: &std::path::Path,
    gpu: Option<&str>,
    reason: &str,
) -> anyhow::Result<u64> {
    use std::io::{Read, Write};
    use std::time::Duration;
    if reason.trim().is_empty() {
        anyhow::bail!("--reason must not be empty");
    }
    let body = serde_json::json!({ "gpu": gpu, "reason": reason }).to_string();
    let shown = socket.display();
    let mut stream = std::os::unix::net::UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the gpuwatch agent at {shown} (is it running? run this inside the gpuwatch container, or pass --config or --socket)"
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "POST /v1/clear HTTP/1.1\r\nHost: gpuwatch\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .with_context(|| format!("cannot send the request to {shown}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("no answer from {shown}"))?;
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer from {shown}"))?;
    let payload = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(payload).unwrap_or(serde_json::Value::Null);
    if status != 200 {
        let msg = v["error"].as_str().unwrap_or(payload.trim());
        anyhow::bail!("the agent refused the clear (HTTP {status}): {msg}");
    }
    v["cleared"]
        .as_u64()
        .with_context(|| format!("unexpected answer from {shown}: {payload}"))
}
