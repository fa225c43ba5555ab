//! `gpuwatch explain`: prints the effective classification policy (NVIDIA's
//! catalog mapped onto gpuwatch's actions, with this node's `[policy]`
//! overrides applied).
//!
//! - `gpuwatch explain 79` (also `xid79`, `XID79`): one code, as text.
//! - `gpuwatch explain 79 --format json`: one JSON object.
//! - `gpuwatch explain --all`: one line per code (text table).
//! - `gpuwatch explain --all --format json`: the whole effective table as **one
//!   JSON array** of the same objects, sorted by code; codes that only the
//!   overrides name are included.
//! - `gpuwatch explain --network`: the RDMA network rules with this node's
//!   `[network]` settings (text or JSON).
//!
//! A code the catalog lacks is not an error: it is explained with the
//! documented default (`investigate`).

use gpuwatch_core::network::NetworkSettings;
use gpuwatch_proto::Action;
use std::io::Write;
use xid_parser::{Explanation, Nvlink5Row, Policy};

/// Output format of `gpuwatch explain`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExplainFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// JSON: one object for a code, one array for `--all`.
    Json,
}

/// Arguments of `gpuwatch explain`.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct ExplainArgs {
    /// The XID to explain (`79`, `xid79`).
    #[arg(value_name = "XID", value_parser = parse_xid, required_unless_present_any = ["all", "network"], conflicts_with_all = ["all", "network"])]
    pub xid: Option<u32>,
    /// Print the whole effective policy table.
    #[arg(long, conflicts_with = "network")]
    pub all: bool,
    /// Print the RDMA network (NIC) rules with this node's `[network]` settings.
    #[arg(long)]
    pub network: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ExplainFormat::Text)]
    pub format: ExplainFormat,
}

/// Errors of `gpuwatch explain`.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// Neither an XID nor `--all` was given.
    #[error("no XID given; pass a code such as `gpuwatch explain 79`, or `--all`")]
    NoCode,
    /// Writing the output failed (closed pipe, full disk).
    #[error("cannot write the explanation")]
    Write(#[source] std::io::Error),
    /// Serialising JSON failed.
    #[error("cannot write the explanation as JSON")]
    Json(#[source] serde_json::Error),
}

impl ExplainError {
    /// True when the output's reader went away (`gpuwatch explain --all | head`):
    /// a normal end of the output, not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, ExplainError::Write(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// Parses an XID argument: a decimal code, optionally prefixed `xid` (any case).
pub(crate) fn parse_xid(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits = if t.len() >= 3 && t[..3].eq_ignore_ascii_case("xid") {
        t[3..].trim_start_matches([' ', '_', '-'])
    } else {
        t
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not an XID; expected a number such as 79"));
    }
    digits
        .parse()
        .map_err(|_| format!("{s:?} is out of range for an XID"))
}

/// Runs `gpuwatch explain` against `policy`, writing to `out`.
pub fn run(args: &ExplainArgs, policy: &Policy, out: &mut dyn Write) -> Result<(), ExplainError> {
    if args.all {
        let all: Vec<Explanation> = policy.entries().map(|e| policy.explain(e.xid)).collect();
        match args.format {
            ExplainFormat::Json => write_json(out, &all)?,
            ExplainFormat::Text => write_table(out, &all).map_err(ExplainError::Write)?,
        }
    } else {
        let code = args.xid.ok_or(ExplainError::NoCode)?;
        let e = policy.explain(code);
        match args.format {
            ExplainFormat::Json => write_json(out, &e)?,
            ExplainFormat::Text => write_text(out, &e).map_err(ExplainError::Write)?,
        }
    }
    out.flush().map_err(ExplainError::Write)
}

/// The network rules as this node applies them (`gpuwatch explain --network`).
#[derive(Debug, serde::Serialize)]
struct NetworkRules {
    sysfs_root: String,
    poll_interval_secs: f64,
    rules: Vec<(&'static str, String)>,
}

fn network_rules(s: &NetworkSettings) -> NetworkRules {
    let secs = |d: std::time::Duration| d.as_secs_f64();
    let expected = match (s.expected_infiniband, s.expected_ethernet, s.expected_efa) {
        (None, None, None) => "no expected port count set: a port never up since the agent \
                               started is reported once as information"
            .to_string(),
        (ib, eth, efa) => format!(
            "fewer ports up (EFA: devices present) than expected is NICPortDown too \
             (InfiniBand: {}, Ethernet: {}, EFA: {})",
            ib.map_or("any".to_string(), |n| n.to_string()),
            eth.map_or("any".to_string(), |n| n.to_string()),
            efa.map_or("any".to_string(), |n| n.to_string())
        ),
    };
    let error_rate = if s.error_rate.is_empty() {
        "no error-rate rule: counters are counted, never judged".to_string()
    } else {
        let rules: Vec<String> = s
            .error_rate
            .iter()
            .map(|(n, r)| format!("{n} {}+{}/s", r.burst, r.per_second))
            .collect();
        format!(
            "a counter's rise that overflows its token bucket (burst + refill per second: {}) \
             is NICErrorRate naming the device and counter; clears after {}s without another",
            rules.join(", "),
            secs(s.flap_quiet)
        )
    };
    let ignored = if s.ignore.is_empty() {
        "none".to_string()
    } else {
        s.ignore.join(", ")
    };
    NetworkRules {
        sysfs_root: s.sysfs_root.display().to_string(),
        poll_interval_secs: secs(s.poll_interval),
        rules: vec![
            (
                "NICHardwareFault",
                format!(
                    "a cable or module error, a NIC health failure or firmware command timeout, or \
                     an uncorrectable PCIe error at the NIC's address; clears after {}s without \
                     another",
                    secs(s.flap_quiet)
                ),
            ),
            (
                "NICPortDown",
                format!(
                    "a port not ACTIVE/LinkUp for {}s (a shorter outage is a flap); {expected}",
                    secs(s.down_grace)
                ),
            ),
            (
                "NICPortFlapping",
                format!(
                    "{} flaps (down, then up) within {}s, each counted once whichever signal saw it; \
                     clears after {}s without a flap",
                    s.flap_threshold,
                    secs(s.flap_window),
                    secs(s.flap_quiet)
                ),
            ),
            ("NICErrorRate", error_rate),
            (
                "efa",
                "AWS EFA devices (PCI vendor 0x1d0f): their port state is not evidence (the \
                 driver reports ACTIVE/LinkUp always), so an EFA port is never up \
                 (state_unreported); judged by presence (a device gone from sysfs is \
                 NICPortDown after the grace) and by NICErrorRate"
                    .to_string(),
            ),
            (
                "NICLinkDegraded",
                match s.min_rate_gbps {
                    Some(r) => format!("an up port below {r} Gb/s"),
                    None => "no minimum rate set".to_string(),
                },
            ),
            (
                "counters",
                "error counters count as deltas from the first reading; one at its saturation \
                 value counts nothing; an unreadable file is read once"
                    .to_string(),
            ),
            ("ignored", ignored),
            (
                "effect",
                "the NetworkProblem condition, a Node Event and an OTLP record per change, \
                 metrics; never a GPU verdict, AcceleratedHardwareReady or GPUProblem; no taint \
                 unless [kube] network_taint"
                    .to_string(),
            ),
        ],
    }
}

/// `gpuwatch explain --network`: the network rules with `settings` filled in.
pub fn run_network(
    settings: &NetworkSettings,
    format: ExplainFormat,
    out: &mut dyn Write,
) -> Result<(), ExplainError> {
    let rules = network_rules(settings);
    match format {
        ExplainFormat::Json => write_json(out, &rules)?,
        ExplainFormat::Text => write_network(out, settings, &rules).map_err(ExplainError::Write)?,
    }
    out.flush().map_err(ExplainError::Write)
}

fn write_network(
    out: &mut dyn Write,
    settings: &NetworkSettings,
    rules: &NetworkRules,
) -> std::io::Result<()> {
    if !settings.enabled {
        writeln!(out, "The NIC monitor is off ([network] enabled = false).")?;
    }
    writeln!(
        out,
        "RDMA ports read from {}/class/infiniband every {}s.",
        rules.sysfs_root, rules.poll_interval_secs
    )?;
    for (name, text) in &rules.rules {
        field(out, name, text)?;
    }
    Ok(())
}

fn write_json<T: serde::Serialize>(out: &mut dyn Write, value: &T) -> Result<(), ExplainError> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(|e| {
        if e.is_io() {
            ExplainError::Write(e.into())
        } else {
            ExplainError::Json(e)
        }
    })?;
    writeln!(out).map_err(ExplainError::Write)
}

const LABEL_WIDTH: usize = 22;
const TEXT_WIDTH: usize = 100;

fn field(out: &mut dyn Write, label: &str, value: &str) -> std::io::Result<()> {
    let indent = " ".repeat(LABEL_WIDTH + 2);
    let lines = wrap(value, TEXT_WIDTH - LABEL_WIDTH - 2);
    let mut lines = lines.iter();
    writeln!(
        out,
        "  {label:<w$}{}",
        lines.next().map_or("", String::as_str),
        w = LABEL_WIDTH
    )?;
    for line in lines {
        writeln!(out, "{indent}{line}")?;
    }
    Ok(())
}

/// Greedy word wrap; words longer than `width` stay whole.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "(none)" } else { s }
}

fn write_text(out: &mut dyn Write, e: &Explanation) -> std::io::Result<()> {
    if e.mnemonic.is_empty() || e.mnemonic == e.name {
        writeln!(out, "XID {}: {}", e.code, e.name)?;
    } else {
        writeln!(out, "XID {}: {} ({})", e.code, e.name, e.mnemonic)?;
    }
    field(
        out,
        "gpuwatch action:",
        &format!("{} (severity {})", e.action, e.severity),
    )?;
    field(out, "why:", &e.why)?;
    if let Some(rule) = e.context_rule {
        field(out, "context rule:", rule)?;
    }
    let threshold = e.threshold.map_or_else(
        || "none (every occurrence counts)".to_string(),
        |t| {
            format!(
                "acts after {} occurrences within {} s on the same GPU",
                t.count, t.window_secs
            )
        },
    );
    field(out, "threshold:", &threshold)?;
    // Recurrence escalation only ever applies to reset/reboot-class actions.
    if matches!(e.action, Action::ResetGpu | Action::RebootNode) {
        field(
            out,
            "recurrence:",
            &format!(
                "recurring on the same GPU after {} reboots escalates to inspect_hardware",
                e.recurrence_reboots
            ),
        )?;
    }
    field(
        out,
        "overridden:",
        if e.overridden {
            "yes, by this node's [policy] config"
        } else {
            "no"
        },
    )?;
    if e.in_catalog {
        field(
            out,
            "NVIDIA immediate:",
            &with_bucket_words(e.nvidia_immediate),
        )?;
        field(
            out,
            "NVIDIA investigatory:",
            or_none(e.nvidia_investigatory),
        )?;
        if !e.nvidia_notes.is_empty() {
            field(out, "NVIDIA notes:", e.nvidia_notes)?;
        }
    } else {
        field(out, "NVIDIA catalog:", "not listed")?;
    }
    field(out, "operator action:", &e.operator_action)?;
    if !e.nvlink5_decode.is_empty() {
        write_nvlink5_rows(out, &e.nvlink5_decode)?;
    }
    if let Some(o) = &e.other_agents {
        field(out, "gpud:", or_none(o.gpud))?;
        field(out, "NVSentinel:", or_none(o.nvsentinel))?;
        field(
            out,
            "k8s-device-plugin:",
            if o.k8s_device_plugin_skips {
                "skips it (application error)"
            } else {
                "marks the GPU unhealthy"
            },
        )?;
        field(
            out,
            "EKS monitoring agent:",
            if o.eks_node_monitoring_agent_fatal {
                "node-fatal"
            } else {
                "not fatal"
            },
        )?;
    }
    Ok(())
}

/// What NVIDIA's bucket names mean (NVIDIA "Analyzing Xid Errors with the Xid
/// Catalog", resolution buckets), appended to the name.
fn with_bucket_words(bucket: &str) -> String {
    let words = match bucket {
        "" => return "(none: the catalog gives no bucket)".to_owned(),
        "RESTART_APP" => "restart the application",
        "RESET_GPU" => "reset the GPU",
        "RESTART_BM" => "reboot the bare-metal node",
        "RESTART_VM" => "restart the virtual machine",
        "IGNORE" => "informational, nothing to do",
        "CONTACT_SUPPORT" => "contact NVIDIA support",
        "CHECK_MECHANICALS" => "check power, cooling and seating",
        "CHECK_UVM" => "check the unified-memory (UVM) driver and the application's memory use",
        "UPDATE_SWFW" => "update the driver / firmware",
        "WORKFLOW_XID_45" => "decide by the XID before it (45 alone: restart fabric manager)",
        "WORKFLOW_XID_48" => "reset the GPU; with XID 63/64, drain and reset",
        "WORKFLOW_NVLINK_ERR" => "decode the NVLink registers in the message",
        "WORKFLOW_NVLINK5_ERR" => "decode intrInfo/errorStatus with NVIDIA's NVLink5 table",
        "XID_154" => "follow the recovery action the message names",
        _ => return bucket.to_owned(),
    };
    format!("{bucket} ({words})")
}

fn write_nvlink5_rows(out: &mut dyn Write, rows: &[Nvlink5Row]) -> std::io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "  NVIDIA NVLink5 decode table (first matching row decides; intrInfo bits most significant first, - = any):"
    )?;
    writeln!(
        out,
        "  {:<32} {:<32} {:<32} {:<22} {:<12} SEVERITY",
        "MNEMONIC", "INTRINFO BEFORE R575", "INTRINFO FROM R575", "ERRORSTATUS", "RESOLUTION"
    )?;
    for r in rows {
        let status = if r.error_status.is_empty() {
            "any".to_owned()
        } else {
            r.error_status
                .iter()
                .map(|s| format!("{s:#010x}"))
                .collect::<Vec<_>>()
                .join("/")
        };
        writeln!(
            out,
            "  {:<32} {:<32} {:<32} {:<22} {:<12} {}",
            r.mnemonic,
            r.before_r575.pattern,
            r.from_r575.pattern,
            status,
            r.resolution.as_str(),
            r.severity
        )?;
    }
    Ok(())
}

fn write_table(out: &mut dyn Write, all: &[Explanation]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>5}  {:<16}  {:<8}  {:<20}  {:<3}  NAME",
        "XID", "ACTION", "SEVERITY", "NVIDIA", "OVR"
    )?;
    for e in all {
        writeln!(
            out,
            "{:>5}  {:<16}  {:<8}  {:<20}  {:<3}  {}",
            e.code,
            e.action.to_string(),
            e.severity.to_string(),
            if e.in_catalog {
                or_none(e.nvidia_immediate)
            } else {
                "(not in catalog)"
            },
            if e.overridden { "yes" } else { "" },
            e.name
        )?;
    }
    writeln!(out)?;
    for line in wrap(
        "ACTION: what gpuwatch does when no context rule applies (ignore < restart_app < investigate < \
         reset_gpu < reboot_node < inspect_hardware). SEVERITY: the severity its events carry. NVIDIA: the \
         catalog's immediate-action bucket. OVR: yes when this node's [policy] config overrides the entry. \
         `gpuwatch explain <XID>` shows the context rules and what NVIDIA's bucket means.",
        TEXT_WIDTH,
    ) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_argument_forms() {
        assert_eq!(parse_xid("79"), Ok(79));
        assert_eq!(parse_xid("xid79"), Ok(79));
        assert_eq!(parse_xid("XID 48"), Ok(48));
        assert_eq!(parse_xid("Xid-154"), Ok(154));
        for bad in ["", "xid", "seventy", "-1", "79a", "99999999999"] {
            assert!(parse_xid(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wrap_keeps_words_and_width() {
        let lines = wrap("aaa bbb ccc ddd", 7);
        assert_eq!(lines, ["aaa bbb", "ccc ddd"]);
        assert_eq!(wrap("", 10), [""]);
        assert_eq!(
            wrap("averyveryverylongword x", 5),
            ["averyveryverylongword", "x"]
        );
    }
}
