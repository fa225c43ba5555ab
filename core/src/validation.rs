//! Device validation for the startup taint gate and `gpuwatch validate`.
//!
//! [`validate`] is pure: it judges the latest [`NodeHealth`] (NVML samples of every
//! GPU) against the expected GPU count and the PCIe expectations. The optional extra
//! command (`dcgmi diag -r 1`, a vendor script, ...) runs separately with
//! `gpuwatch_kube::run_extra_command`; [`add_check`] folds its result into the report.
//!
//! A report only passes when it is *complete*: every check could run (NVML answered,
//! the kernel-log ring was read to its end so faults logged before the agent started
//! are known, the expected GPU count is known, every GPU has a sample). A partial
//! report never removes the startup taint.
//!
//! The PCIe link is checked on its width by default (against the GPU's maximum or
//! `expected_pcie_width`). The generation is only checked when configured
//! (`expected_pcie_gen` or `check_pcie_gen = true`): idle GPUs drop to Gen1 to save
//! power, so a generation check on a new, idle node would fail for no fault.
//!
//! ```
//! use gpuwatch_proto::{GpuHealth, GpuSample, InputState, InputStatus, MonitorStatus, NodeHealth, RecoveryAction};
//! use gpuwatch_core::validation::{validate, ValidationSettings};
//!
//! let mut sample = GpuSample { index: 0, uuid: "GPU-0".into(), ..Default::default() };
//! sample.set_recovery_action(RecoveryAction::None);
//! let up = |input: &str| {
//!     let mut i = InputStatus { input: input.into(), ..Default::default() };
//!     i.set_state(InputState::Up);
//!     i
//! };
//! let health = NodeHealth {
//!     monitor: Some(MonitorStatus { inputs: vec![up("kmsg"), up("nvml")], kmsg_caught_up: true, ..Default::default() }),
//!     gpus: vec![GpuHealth { index: Some(0), sample: Some(sample), ..Default::default() }],
//!     ..Default::default()
//! };
//! let report = validate(&health, Some(1), &ValidationSettings::default());
//! assert!(report.complete && report.passed, "{report:?}");
//! assert!(!validate(&health, Some(2), &ValidationSettings::default()).passed);
//! assert!(!validate(&health, None, &ValidationSettings::default()).complete);
//! ```

use gpuwatch_proto::fabric::{FabricState, Problem, Reading};
use gpuwatch_proto::{
    GpuFabric, GpuHealth, GpuSample, InputState, NodeHealth, RecoveryAction, ShortName,
    ValidationCheck, ValidationReport,
};
use std::fmt::Write as _;

pub use config::ValidationConfig;
pub use settings::{ExtraCommand, PcieGenCheck, ValidationSettings};

mod config;
mod settings;

/// Check names used in reports (stable: they appear in Events and CLI output).
pub mod checks {
    /// NVML answered.
    pub const NVML: &str = "nvml";
    /// The kernel log is readable and its ring was read to the end (faults
    /// logged before gpuwatch started are known).
    pub const KMSG: &str = "kmsg";
    /// Expected GPU count equals what NVML sees.
    pub const GPU_COUNT: &str = "gpu_count";
    /// The GPU has a sample from the poller.
    pub const SAMPLE: &str = "sample";
    /// No pending or failed row remap.
    pub const ROW_REMAP: &str = "row_remap";
    /// No uncorrectable ECC error this boot (volatile counter).
    pub const ECC: &str = "ecc_uncorrected";
    /// PCIe link at the expected width (and generation, when configured).
    pub const PCIE_LINK: &str = "pcie_link";
    /// NVML recovery action is none.
    pub const RECOVERY_ACTION: &str = "recovery_action";
    /// The GPU is registered with the NVLink fabric (NVSwitch systems) and
    /// the fabric reports it healthy.
    pub const FABRIC: &str = "fabric";
    /// No MIG mode change waits for a GPU reset; the MIG devices of a GPU in
    /// MIG mode are listed.
    pub const MIG: &str = "mig";
    /// No active reset/reboot/inspect fault on the GPU (or, without a GPU index,
    /// on the node).
    pub const FAULTS: &str = "active_faults";
    /// The extra validation command exited 0 in time.
    pub const COMMAND: &str = "command";
}

/// One check result (a helper for callers that add their own checks).
pub fn check(name: &str, gpu: Option<u32>, passed: bool, message: String) -> ValidationCheck {
    ValidationCheck {
        name: name.to_owned(),
        gpu_index: gpu,
        passed,
        message,
    }
}

/// What an expected count counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Whole GPUs (configured, or a Node count of GPUs).
    Gpus(u32),
    /// What the device plugin's single MIG strategy advertises: one device per
    /// MIG device of a GPU in MIG mode, one per other GPU. GPU feature
    /// discovery then sets `nvidia.com/gpu.count` to this number and the
    /// `nvidia.com/gpu` capacity is this number, so a count read from the Node
    /// of such GPUs is one of these.
    SingleStrategyDevices(u32),
}

/// The MIG devices of a GPU in MIG mode (its latest sample's); `None` when it
/// is not in MIG mode or has no sample.
pub fn mig_devices(g: &GpuHealth) -> Option<usize> {
    g.sample
        .as_ref()
        .filter(|s| s.mig_enabled == Some(true))
        .map(|s| s.mig_devices.len())
}

/// Validates the node's GPUs as seen in `health`.
///
/// `expected_gpus` is the resolved expected count of GPUs (config, node label or
/// capacity); `None` falls back to `cfg.expected_gpus`, and when that is unset too
/// the report is incomplete. The extra command is not run here (see
/// `gpuwatch_kube::run_extra_command`). `time_unix_nano` is left for
/// the caller; `boot_id` comes from `health`.
pub fn validate(
    health: &NodeHealth,
    expected_gpus: Option<u32>,
    cfg: &ValidationSettings,
) -> ValidationReport {
    validate_expecting(health, expected_gpus.map(Expected::Gpus), cfg)
}

/// [`validate`] with an expected count that may count MIG devices.
pub fn validate_expecting(
    health: &NodeHealth,
    expected: Option<Expected>,
    cfg: &ValidationSettings,
) -> ValidationReport {
    let mut report = ValidationReport {
        boot_id: health.boot_id.clone(),
        complete: true,
        ..Default::default()
    };
    let (nvml_ok, nvml) = nvml_check(health);
    report.complete &= nvml_ok;
    report.checks.push(nvml);
    let (kmsg_known, kmsg) = kmsg_requirement(health, cfg);
    report.complete &= kmsg_known;
    report.checks.push(kmsg);
    let (count_known, count) = gpu_count_check(
        health,
        expected.or(cfg.expected_gpus.map(|n| Expected::Gpus(n.get()))),
        cfg,
        nvml_ok,
    );
    report.complete &= count_known;
    report.checks.push(count);
    for g in &health.gpus {
        let idx = g.index.or(g.sample.as_ref().map(|s| s.index));
        let Some(s) = g.sample.as_ref() else {
            report.complete = false;
            report.checks.push(check(
                checks::SAMPLE,
                idx,
                false,
                format!("unknown: no NVML sample yet for GPU {}", gpu_label(g)),
            ));
            continue;
        };
        gpu_checks(g, s, idx, cfg, &mut report.checks);
    }
    let node_faults = isolating(&health.node_faults);
    if !node_faults.is_empty() {
        report.checks.push(check(
            checks::FAULTS,
            None,
            false,
            format!("active on the node: {}", node_faults.join(", ")),
        ));
    }
    finish(&mut report);
    report
}

/// The NVML check: `(answered, check)`.
fn nvml_check(health: &NodeHealth) -> (bool, ValidationCheck) {
    if health.input_up("nvml") {
        return (
            true,
            check(checks::NVML, None, true, "NVML answered".into()),
        );
    }
    let why = health
        .monitor
        .as_ref()
        .and_then(|m| m.input("nvml"))
        .map(|i| i.message.as_str())
        .filter(|m| !m.is_empty())
        .unwrap_or("no NVML status yet");
    (
        false,
        check(
            checks::NVML,
            None,
            false,
            format!("unknown: NVML is not available ({why})"),
        ),
    )
}

/// The kernel-log check as configured: `(complete, check)`. With
/// `require_kmsg = false` a kernel log that was not read is recorded, not
/// required.
fn kmsg_requirement(health: &NodeHealth, cfg: &ValidationSettings) -> (bool, ValidationCheck) {
    let (known, mut c) = kmsg_check(health);
    if known || cfg.require_kmsg {
        return (known, c);
    }
    c.passed = true;
    c.message = format!(
        "not required (validation.require_kmsg = false): {}",
        c.message.trim_start_matches("unknown: ")
    );
    (true, c)
}

/// The GPU count check against the resolved expected count: `(complete,
/// check)`. Unknown while the count is not known, NVML is down, or fewer
/// GPUs than expected have a sample so far.
fn gpu_count_check(
    health: &NodeHealth,
    expected: Option<Expected>,
    cfg: &ValidationSettings,
    nvml_ok: bool,
) -> (bool, ValidationCheck) {
    let sampled = health.gpus.iter().filter(|g| g.sample.is_some()).count();
    let unsampled = health.gpus.len() - sampled;
    let expected = match expected {
        Some(Expected::SingleStrategyDevices(want)) if nvml_ok && unsampled == 0 => {
            let seen: usize = health
                .gpus
                .iter()
                .map(|g| mig_devices(g).unwrap_or(1))
                .sum();
            let seen = u32::try_from(seen).unwrap_or(u32::MAX);
            return (
                true,
                check(
                    checks::GPU_COUNT,
                    None,
                    seen == want,
                    format!(
                        "expected {want} devices (the Node's count under the single MIG strategy), NVML sees {seen} on {sampled} GPUs"
                    ),
                ),
            );
        }
        Some(Expected::SingleStrategyDevices(want)) if nvml_ok => {
            return (
                false,
                check(
                    checks::GPU_COUNT,
                    None,
                    false,
                    format!(
                        "unknown: expected {want} devices (single MIG strategy), {unsampled} GPUs without a sample"
                    ),
                ),
            );
        }
        Some(Expected::SingleStrategyDevices(want) | Expected::Gpus(want)) => Some(want),
        None => None,
    };
    let (known, passed, message) = match expected {
        None => (
            false,
            false,
            format!(
                "unknown: expected GPU count not configured, no node label {:?}, no nvidia.com/gpu capacity ({sampled} visible)",
                cfg.expected_gpus_label
            ),
        ),
        Some(want) if nvml_ok => {
            let seen = u32::try_from(sampled).unwrap_or(u32::MAX);
            if unsampled > 0 && seen < want {
                (
                    false,
                    false,
                    format!(
                        "unknown: {seen} of {want} GPUs sampled so far, {unsampled} without a sample"
                    ),
                )
            } else {
                (
                    true,
                    seen == want,
                    format!("expected {want} GPUs, NVML sees {seen}"),
                )
            }
        }
        Some(want) => (
            false,
            false,
            format!("unknown: expected {want} GPUs, NVML unavailable"),
        ),
    };
    (known, check(checks::GPU_COUNT, None, passed, message))
}

/// The kernel-log check: `(complete, check)`. Until the kmsg source has read the
/// ring to its end, a fault logged before gpuwatch started (an XID 79 at boot)
/// may still be unread, so the report cannot be complete.
fn kmsg_check(health: &NodeHealth) -> (bool, ValidationCheck) {
    let Some(m) = health
        .monitor
        .as_ref()
        .filter(|m| m.input_state("kmsg") != InputState::NotReported)
    else {
        return (
            false,
            check(
                checks::KMSG,
                None,
                false,
                "unknown: no kernel-log status yet".into(),
            ),
        );
    };
    if m.input_state("kmsg") != InputState::Up {
        let why = match m.input("kmsg").map(|i| i.message.as_str()) {
            None | Some("") => String::new(),
            Some(message) => format!(" ({message})"),
        };
        return (
            false,
            check(
                checks::KMSG,
                None,
                false,
                format!(
                    "unknown: the kernel log is not readable{why}; faults logged before gpuwatch started cannot be ruled out"
                ),
            ),
        );
    }
    if !m.kmsg_caught_up {
        return (
            false,
            check(
                checks::KMSG,
                None,
                false,
                "unknown: the kernel-log ring has not been read to its end yet; faults logged before gpuwatch started may still be unread".into(),
            ),
        );
    }
    (
        true,
        check(
            checks::KMSG,
            None,
            true,
            "kernel-log ring read to its end".into(),
        ),
    )
}

/// `reason (action)` of each active fault that needs isolation.
fn isolating(faults: &[gpuwatch_proto::ActiveFault]) -> Vec<String> {
    faults
        .iter()
        .filter(|f| f.action().needs_isolation())
        .map(|f| format!("{} ({})", f.reason, f.action().short_name()))
        .collect()
}

fn gpu_label(g: &GpuHealth) -> String {
    match (g.index, g.uuid.is_empty()) {
        (Some(i), false) => format!("{i} ({})", g.uuid),
        (Some(i), true) => i.to_string(),
        (None, false) => g.uuid.clone(),
        (None, true) => g.pci_address.clone(),
    }
}

fn gpu_checks(
    g: &GpuHealth,
    s: &GpuSample,
    idx: Option<u32>,
    cfg: &ValidationSettings,
    out: &mut Vec<ValidationCheck>,
) {
    // Row remapping (Ampere and later); None = not supported on this GPU.
    let (ok, msg) = match (s.remapped_rows_pending, s.remapped_rows_failure) {
        (_, Some(true)) => (false, "row remap failed (replace the GPU)".to_owned()),
        (Some(true), _) => (false, "row remap pending (GPU reset needed)".to_owned()),
        (None, None) => (true, "row remapping not supported".to_owned()),
        _ => (true, "no pending or failed row remap".to_owned()),
    };
    out.push(check(checks::ROW_REMAP, idx, ok, msg));

    let (ok, msg) = match s.ecc_volatile_uncorrected {
        Some(0) => (true, "no uncorrectable ECC error this boot".to_owned()),
        Some(n) => (false, format!("{n} uncorrectable ECC errors this boot")),
        None => (true, "ECC not supported or disabled".to_owned()),
    };
    out.push(check(checks::ECC, idx, ok, msg));

    let mut problems = Vec::new();
    let mut parts = Vec::new();
    match (
        s.pcie_link_width,
        cfg.expected_pcie_width.or(s.pcie_link_width_max),
    ) {
        (Some(c), Some(w)) if c < w => problems.push(format!("width x{c} below expected x{w}")),
        (Some(c), Some(w)) => parts.push(format!("width x{c} (expected x{w})")),
        _ => parts.push("width not reported".to_owned()),
    }
    match (s.pcie_link_gen, cfg.pcie_gen.expected(s.pcie_link_gen_max)) {
        (Some(c), Some(w)) if c < w => problems.push(format!("generation {c} below expected {w}")),
        (Some(c), Some(w)) => parts.push(format!("generation {c} (expected {w})")),
        (Some(c), _) => parts.push(format!("generation {c} (not checked by default)")),
        (None, _) => parts.push("generation not reported".to_owned()),
    }
    if problems.is_empty() {
        out.push(check(checks::PCIE_LINK, idx, true, parts.join(", ")));
    } else {
        out.push(check(checks::PCIE_LINK, idx, false, problems.join(", ")));
    }

    let ra = s.recovery_action();
    let ok = matches!(ra, RecoveryAction::None | RecoveryAction::Unspecified);
    let msg = if ra == RecoveryAction::Unspecified {
        "recovery action not reported by the driver".to_owned()
    } else {
        format!("recovery action {}", ra.short_name())
    };
    out.push(check(checks::RECOVERY_ACTION, idx, ok, msg));

    let (ok, msg) = fabric_check(s.fabric.as_ref());
    out.push(check(checks::FABRIC, idx, ok, msg));

    if let Some((ok, msg)) = mig_check(s) {
        out.push(check(checks::MIG, idx, ok, msg));
    }

    let isolating = isolating(&g.active_faults);
    if isolating.is_empty() {
        out.push(check(checks::FAULTS, idx, true, "no active fault".into()));
    } else {
        out.push(check(
            checks::FAULTS,
            idx,
            false,
            format!("active: {}", isolating.join(", ")),
        ));
    }
}

/// The MIG check, for a GPU in MIG mode or with a MIG mode change pending
/// (`None` otherwise): a pending change fails — the GPU's devices change at
/// its next reset, so what the device plugin advertises now is not what the
/// node will have — and the MIG devices are listed (a device NVML cannot
/// read is named with its error: a monitoring problem, not a failed check).
fn mig_check(s: &GpuSample) -> Option<(bool, String)> {
    let on = s.mig_enabled == Some(true);
    let pending = s.mig_pending.filter(|&p| Some(p) != s.mig_enabled);
    if !on && pending.is_none() {
        return None;
    }
    let word = |b: bool| if b { "enabled" } else { "disabled" };
    let mut msg = if let Some(p) = pending {
        format!(
            "MIG mode change pending: {} now, {} after the next GPU reset or reboot",
            word(on),
            word(p)
        )
    } else {
        "MIG mode enabled".to_owned()
    };
    if on {
        let devices: Vec<String> = s
            .mig_devices
            .iter()
            .map(|m| {
                if !m.error.is_empty() && m.uuid.is_empty() {
                    return format!("unreadable ({})", m.error);
                }
                let profile = if m.profile.is_empty() {
                    String::new()
                } else {
                    format!(" {}", m.profile)
                };
                let unread = if m.error.is_empty() {
                    String::new()
                } else {
                    format!(" (partly unreadable: {})", m.error)
                };
                format!(
                    "GI {} CI {}{profile} {}{unread}",
                    m.gpu_instance, m.compute_instance, m.uuid
                )
            })
            .collect();
        msg.push_str(&format!(
            "; {} MIG devices{}{}",
            devices.len(),
            if devices.is_empty() { "" } else { ": " },
            devices.join(", ")
        ));
    }
    Some((pending.is_none(), msg))
}

/// The fabric check: no fabric on the board passes; a registration must be
/// completed with success and a health mask that reports no problem. A
/// pending registration fails (the startup gate validates again, and
/// `gpuwatch validate` waits up to `fabric_wait_secs` for it first).
fn fabric_check(f: Option<&GpuFabric>) -> (bool, String) {
    let Some(f) = f else {
        return (
            true,
            "fabric state not reported (driver without GPU fabric info)".into(),
        );
    };
    let f = Reading::of(f);
    let clique = if f.cluster_uuid.is_empty() {
        format!("clique {}", f.clique_id)
    } else {
        format!("clique {}, cluster {}", f.clique_id, f.cluster_uuid)
    };
    if f.state == FabricState::NotSupported {
        return (true, "no NVLink fabric on this GPU".into());
    }
    if f.is_pending() {
        let state = f.problem_text(Problem::NotRegistered);
        return (
            false,
            format!("fabric registration {state} — is nvidia-fabricmanager running?"),
        );
    }
    match f.problem() {
        None if f.state == FabricState::Completed => (
            true,
            format!("registered with the NVLink fabric ({clique})"),
        ),
        None => (
            false,
            format!("unknown fabric state {:?}", f.state.as_str()),
        ),
        Some(p @ Problem::RegistrationFailed) => (
            false,
            format!("fabric registration failed: {}", f.problem_text(p)),
        ),
        Some(p) => (
            false,
            format!(
                "fabric {}: {} ({clique})",
                p.name().replace('_', " "),
                f.problem_text(p)
            ),
        ),
    }
}

fn finish(report: &mut ValidationReport) {
    report.passed = report.complete && report.checks.iter().all(|c| c.passed);
}

/// Adds one check (e.g. the extra command's) to a report and recomputes `passed`.
/// A check whose message starts with `unknown:` marks the report incomplete.
pub fn add_check(report: &mut ValidationReport, check: ValidationCheck) {
    if !check.passed && check.message.starts_with("unknown:") {
        report.complete = false;
    }
    report.checks.push(check);
    finish(report);
}

/// Names of the failed checks (`gpu_count`, `ecc_uncorrected[gpu 3]`, ...).
pub fn failed_checks(report: &ValidationReport) -> Vec<String> {
    report
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| match c.gpu_index {
            Some(i) => format!("{}[gpu {i}]", c.name),
            None => c.name.clone(),
        })
        .collect()
}

/// Human-readable report, one check per line (for `gpuwatch validate`).
pub fn render(report: &ValidationReport) -> String {
    let mut s = String::new();
    let verdict = match (report.passed, report.complete) {
        (true, _) => "PASSED",
        (false, true) => "FAILED",
        (false, false) => "INCOMPLETE",
    };
    let _ = writeln!(s, "Validation {verdict}");
    for c in &report.checks {
        let mark = if c.passed { "ok  " } else { "FAIL" };
        let gpu = c.gpu_index.map(|i| format!(" gpu {i}")).unwrap_or_default();
        let _ = writeln!(s, "  {mark} {}{gpu}: {}", c.name, c.message);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_proto::test_util::set_input;
    use gpuwatch_proto::{Action, ActiveFault};

    /// A healthy node with `n` GPUs in boot `b1`.
    fn health(n: u32) -> NodeHealth {
        gpuwatch_test_support::health::healthy("", n, "b1")
    }

    fn cfg() -> ValidationSettings {
        ValidationSettings::default()
    }

    #[test]
    fn healthy_node_passes() {
        let r = validate(&health(8), Some(8), &cfg());
        assert!(r.passed && r.complete, "{}", render(&r));
        assert_eq!(r.boot_id, "b1");
        assert!(failed_checks(&r).is_empty());
    }

    #[test]
    fn wrong_count_fails() {
        let r = validate(&health(7), Some(8), &cfg());
        assert!(r.complete && !r.passed);
        assert_eq!(failed_checks(&r), vec!["gpu_count"]);
    }

    /// A GPU in MIG mode lists its MIG devices in the `mig` check; a
    /// pending MIG mode change fails it; a GPU without MIG has no such check;
    /// a MIG device NVML cannot read is named, and fails nothing.
    #[test]
    fn the_mig_check_lists_devices_and_fails_a_pending_mode_change() {
        let mut h = health(2);
        {
            let s = h.gpus[0].sample.as_mut().unwrap();
            s.mig_enabled = Some(true);
            s.mig_pending = Some(true);
            s.mig_devices = (0..7)
                .map(|i| gpuwatch_proto::MigDevice {
                    uuid: format!("MIG-{i}"),
                    gpu_instance: 7 + i,
                    profile: "1g.10gb".into(),
                    ..Default::default()
                })
                .collect();
            s.mig_devices[2] = gpuwatch_proto::MigDevice {
                error: "nvmlDeviceGetUUID: an unknown error occurred".into(),
                ..Default::default()
            };
        }
        h.gpus[1].sample.as_mut().unwrap().mig_enabled = Some(false);
        let r = validate(&h, Some(2), &cfg());
        assert!(r.passed && r.complete, "{}", render(&r));
        let mig: Vec<_> = r.checks.iter().filter(|c| c.name == checks::MIG).collect();
        assert_eq!(mig.len(), 1, "only the GPU in MIG mode: {}", render(&r));
        assert_eq!(mig[0].gpu_index, Some(0));
        assert!(
            mig[0].message.starts_with("MIG mode enabled; 7 MIG devices: GI 7 CI 0 1g.10gb MIG-0, GI 8 CI 0 1g.10gb MIG-1, unreadable (nvmlDeviceGetUUID: "),
            "{}",
            mig[0].message
        );
        // `nvidia-smi -mig 0` on a busy GPU: disabled at the next reset.
        h.gpus[0].sample.as_mut().unwrap().mig_pending = Some(false);
        let r = validate(&h, Some(2), &cfg());
        assert!(!r.passed, "{}", render(&r));
        assert_eq!(failed_checks(&r), vec!["mig[gpu 0]"]);
        assert!(
            render(&r).contains(
                "MIG mode change pending: enabled now, disabled after the next GPU reset or reboot"
            ),
            "{}",
            render(&r)
        );
        // And the other way: enabling waits for the reset too.
        let s = h.gpus[1].sample.as_mut().unwrap();
        s.mig_pending = Some(true);
        let r = validate(&h, Some(2), &cfg());
        assert_eq!(
            failed_checks(&r),
            vec!["mig[gpu 0]", "mig[gpu 1]"],
            "{}",
            render(&r)
        );
        assert!(
            render(&r).contains("disabled now, enabled after"),
            "{}",
            render(&r)
        );
    }

    #[test]
    fn a_node_count_of_single_strategy_mig_devices_is_compared_in_devices() {
        // Two GPUs in MIG mode with 7 MIG devices each: the Node says 14.
        let mut h = health(2);
        for g in &mut h.gpus {
            let s = g.sample.as_mut().unwrap();
            s.mig_enabled = Some(true);
            s.mig_devices = (0..7)
                .map(|i| gpuwatch_proto::MigDevice {
                    uuid: format!("MIG-{i}"),
                    gpu_instance: 7 + i,
                    compute_instance: 0,
                    ..Default::default()
                })
                .collect();
        }
        let r = validate_expecting(&h, Some(Expected::SingleStrategyDevices(14)), &cfg());
        assert!(r.passed && r.complete, "{}", render(&r));
        assert!(render(&r).contains("expected 14 devices"), "{}", render(&r));
        // A GPU gone with its 7 MIG devices fails in the same units.
        h.gpus.pop();
        let r = validate_expecting(&h, Some(Expected::SingleStrategyDevices(14)), &cfg());
        assert!(r.complete && !r.passed);
        assert_eq!(failed_checks(&r), vec!["gpu_count"]);
        assert!(
            render(&r).contains("NVML sees 7 on 1 GPUs"),
            "{}",
            render(&r)
        );
        // The same Node count taken as GPUs would fail a healthy node.
        assert!(!validate(&h, Some(14), &cfg()).passed);
    }

    #[test]
    fn config_count_is_the_fallback() {
        let c = ValidationSettings {
            expected_gpus: std::num::NonZeroU32::new(2),
            ..cfg()
        };
        assert!(validate(&health(2), None, &c).passed);
        // An explicit resolved count wins.
        assert!(!validate(&health(2), Some(3), &c).passed);
    }

    #[test]
    fn unknown_count_nvml_down_or_missing_samples_are_incomplete() {
        let r = validate(&health(8), None, &cfg());
        assert!(!r.complete && !r.passed);

        let mut h = health(8);
        let m = h.monitor.as_mut().unwrap();
        set_input(m, "nvml", InputState::Down, "no driver");
        let r = validate(&h, Some(8), &cfg());
        assert!(!r.complete && !r.passed);

        let mut h = health(8);
        h.gpus[3].sample = None;
        let r = validate(&h, Some(8), &cfg());
        assert!(!r.complete && !r.passed, "{}", render(&r));

        let h = NodeHealth::default();
        let r = validate(&h, Some(8), &cfg());
        assert!(!r.complete && !r.passed);
    }

    #[test]
    fn per_gpu_failures_name_the_gpu() {
        let mut h = health(4);
        let s = h.gpus[1].sample.as_mut().unwrap();
        s.remapped_rows_pending = Some(true);
        let s = h.gpus[2].sample.as_mut().unwrap();
        s.ecc_volatile_uncorrected = Some(3);
        s.pcie_link_width = Some(8);
        h.gpus[3]
            .sample
            .as_mut()
            .unwrap()
            .set_recovery_action(RecoveryAction::GpuReset);
        let mut f = ActiveFault {
            reason: "XID79".into(),
            ..Default::default()
        };
        f.set_action(Action::RebootNode);
        h.gpus[0].active_faults.push(f);
        let r = validate(&h, Some(4), &cfg());
        assert!(r.complete && !r.passed);
        assert_eq!(
            failed_checks(&r),
            vec![
                "active_faults[gpu 0]",
                "row_remap[gpu 1]",
                "ecc_uncorrected[gpu 2]",
                "pcie_link[gpu 2]",
                "recovery_action[gpu 3]",
            ]
        );
    }

    #[test]
    fn pcie_generation_is_checked_only_when_configured() {
        // Regression: idle GPUs drop to Gen1; a default gate
        // must not fail new idle nodes on the link generation.
        let mut h = health(1);
        h.gpus[0].sample.as_mut().unwrap().pcie_link_gen = Some(1);
        let r = validate(&h, Some(1), &cfg());
        assert!(r.passed, "{}", render(&r));
        assert!(
            render(&r).contains("generation 1 (not checked"),
            "{}",
            render(&r)
        );
        let c = ValidationSettings {
            pcie_gen: PcieGenCheck::GpuMaximum,
            ..cfg()
        };
        let r = validate(&h, Some(1), &c);
        assert_eq!(failed_checks(&r), vec!["pcie_link[gpu 0]"]);
        assert!(render(&r).contains("generation 1 below expected 5"));
        let c = ValidationSettings {
            pcie_gen: PcieGenCheck::AtLeast(1),
            ..cfg()
        };
        assert!(validate(&h, Some(1), &c).passed);
        let c = ValidationSettings {
            pcie_gen: PcieGenCheck::AtLeast(4),
            ..cfg()
        };
        assert!(!validate(&h, Some(1), &c).passed);
        // The width is checked against the maximum by default.
        let mut h = health(1);
        h.gpus[0].sample.as_mut().unwrap().pcie_link_width = Some(8);
        let r = validate(&h, Some(1), &cfg());
        assert!(
            render(&r).contains("width x8 below expected x16"),
            "{}",
            render(&r)
        );
        let c = ValidationSettings {
            expected_pcie_width: Some(8),
            ..cfg()
        };
        assert!(validate(&h, Some(1), &c).passed);
    }

    #[test]
    fn incomplete_until_the_kernel_log_ring_was_read() {
        // Regression: an XID 79 logged before the agent
        // started may still be unread; the gate must not pass before that.
        let mut h = health(2);
        h.monitor.as_mut().unwrap().kmsg_caught_up = false;
        let r = validate(&h, Some(2), &cfg());
        assert!(!r.complete && !r.passed);
        assert_eq!(failed_checks(&r), vec!["kmsg"]);
        assert!(
            render(&r).contains("not been read to its end"),
            "{}",
            render(&r)
        );

        let mut h = health(2);
        let m = h.monitor.as_mut().unwrap();
        set_input(m, "kmsg", InputState::Down, "Permission denied");
        m.kmsg_caught_up = false;
        m.message = "kmsg: Permission denied".into();
        let r = validate(&h, Some(2), &cfg());
        assert!(!r.complete && !r.passed);
        let text = render(&r);
        assert!(
            text.contains("kernel log is not readable (Permission denied)")
                && text.contains("cannot be ruled out"),
            "{text}"
        );
        assert!(text.starts_with("Validation INCOMPLETE"), "{text}");

        // Waived explicitly where the pod cannot open /dev/kmsg: NVML checks decide,
        // and the report says the kernel log was not checked.
        let waived = ValidationSettings {
            require_kmsg: false,
            ..cfg()
        };
        let r = validate(&h, Some(2), &waived);
        assert!(r.complete && r.passed, "{}", render(&r));
        assert!(render(&r).contains("not required (validation.require_kmsg = false)"));
    }

    #[test]
    fn node_level_faults_fail_the_validation() {
        let mut h = health(2);
        let mut f = ActiveFault {
            reason: "XID79".into(),
            ..Default::default()
        };
        f.set_action(Action::RebootNode);
        h.node_faults.push(f);
        let mut app = ActiveFault {
            reason: "XID13".into(),
            ..Default::default()
        };
        app.set_action(Action::RestartApp);
        h.node_faults.push(app);
        let r = validate(&h, Some(2), &cfg());
        assert!(r.complete && !r.passed);
        assert_eq!(failed_checks(&r), vec!["active_faults"]);
        assert!(render(&r).contains("active on the node: XID79 (reboot_node)"));
    }

    #[test]
    fn not_supported_readings_pass() {
        let mut h = health(1);
        let s = h.gpus[0].sample.as_mut().unwrap();
        s.remapped_rows_pending = None;
        s.remapped_rows_failure = None;
        s.ecc_volatile_uncorrected = None;
        s.set_recovery_action(RecoveryAction::Unspecified);
        assert!(validate(&h, Some(1), &cfg()).passed);
    }

    #[test]
    fn fabric_registration_is_checked_per_gpu() {
        let with = |state: &str, status: &str, mask: Option<u32>| {
            let mut h = health(2);
            let s = h.gpus[0].sample.as_mut().unwrap();
            s.fabric = Some(GpuFabric {
                state: state.into(),
                status: status.into(),
                clique_id: 2,
                cluster_uuid: String::new(),
                health_mask: mask,
            });
            let r = validate(&h, Some(2), &cfg());
            let c = r
                .checks
                .iter()
                .find(|c| c.name == checks::FABRIC && c.gpu_index == Some(0))
                .cloned()
                .expect("a fabric check for GPU 0");
            (r.passed, c)
        };
        let (passed, c) = with("in_progress", "", None);
        assert!(!passed && !c.passed);
        assert_eq!(
            c.message,
            "fabric registration in progress — is nvidia-fabricmanager running?"
        );
        let (passed, c) = with("not_started", "", None);
        assert!(!passed && c.message.starts_with("fabric registration not started"));
        let (passed, c) = with("completed", "insufficient_resources", None);
        assert!(!passed);
        assert!(
            c.message
                .starts_with("fabric registration failed: insufficient resources"),
            "{}",
            c.message
        );
        let (passed, c) = with("completed", "success", Some(0x1A9));
        assert!(!passed);
        assert_eq!(
            c.message,
            "fabric degraded bandwidth: degraded bandwidth (clique 2)"
        );
        let (passed, c) = with("completed", "success", Some(0x1AA));
        assert!(passed && c.passed, "{c:?}");
        assert_eq!(c.message, "registered with the NVLink fabric (clique 2)");
        let (passed, c) = with("not_supported", "", None);
        assert!(passed && c.passed);
        // GPU 1 reported nothing (an older driver): passes, and says so.
        let r = validate(&health(2), Some(2), &cfg());
        assert!(r.checks.iter().any(|c| c.name == checks::FABRIC
            && c.passed
            && c.message.starts_with("fabric state not reported")));
    }

    #[test]
    fn add_check_recomputes() {
        let mut r = validate(&health(1), Some(1), &cfg());
        assert!(r.passed);
        add_check(
            &mut r,
            check(checks::COMMAND, None, false, "exit code 1".into()),
        );
        assert!(!r.passed && r.complete);
        assert!(render(&r).contains("FAIL command: exit code 1"));
    }
}
