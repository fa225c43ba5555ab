//! The startup gate: the validation report that decides whether the startup
//! taint may go, kept current as the Node and the GPUs' health change, and the
//! expected GPU count it validates against.

use super::ValidationCallback;
use super::advertised;
use super::config::MigStrategy;
use super::device_taints::DraDevice;
use super::settings::AdvertisedSettings;
use gpuwatch_core::clock::unix_nanos;
use gpuwatch_core::validation::{self, Expected, ValidationSettings};
use gpuwatch_proto::{NodeHealth, ValidationReport};
use k8s_openapi::api::core::v1::Node;
use std::sync::Arc;
use std::time::SystemTime;

/// The expected count the startup gate validates against: the configured
/// GPU count, else the Node's label, else on a DRA Node (`dra` not empty)
/// the GPUs its ResourceSlices publish or NVML sees (by UUID), else the Node's
/// `nvidia.com/gpu` capacity ([`expected_gpus`]); a count read from the Node
/// counts MIG devices under the single MIG strategy once NVML sees GPUs in
/// MIG mode.
pub(crate) fn expected(
    node: Option<&Node>,
    vcfg: &ValidationSettings,
    mig_strategy: MigStrategy,
    health: &NodeHealth,
    dra: &[DraDevice],
) -> Option<Expected> {
    if let Some(n) = vcfg.expected_gpus {
        return Some(Expected::Gpus(n.get()));
    }
    let node = node?;
    if !dra.is_empty() && label_count(node, vcfg).is_none() {
        // Every GPU the slices publish or NVML sees: one published but gone
        // from NVML is missing hardware (the count fails); one NVML sees but
        // no slice publishes yet is the advertised check's to name.
        let mut gpus = advertised::dra_gpus(dra);
        gpus.extend(
            health
                .gpus
                .iter()
                .map(|g| g.uuid.as_str())
                .filter(|u| !u.is_empty()),
        );
        let n = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
        return Some(Expected::Gpus(n));
    }
    Some(node_count(expected_gpus(node, vcfg)?, mig_strategy, health))
}

fn label_count(node: &Node, vcfg: &ValidationSettings) -> Option<u32> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(&vcfg.expected_gpus_label))
        .and_then(|v| v.trim().parse::<u32>().ok())
}

/// A count read from the Node, in the units it counts (see [`expected`]).
pub(crate) fn node_count(n: u32, mig_strategy: MigStrategy, health: &NodeHealth) -> Expected {
    let mig = health
        .gpus
        .iter()
        .any(|g| validation::mig_devices(g).is_some());
    if mig && mig_strategy == MigStrategy::Single {
        Expected::SingleStrategyDevices(n)
    } else {
        Expected::Gpus(n)
    }
}

/// Expected GPU count: config, else the node label, else `nvidia.com/gpu` capacity.
pub(crate) fn expected_gpus(node: &Node, vcfg: &ValidationSettings) -> Option<u32> {
    if let Some(n) = vcfg.expected_gpus {
        return Some(n.get());
    }
    if let Some(n) = label_count(node, vcfg) {
        return Some(n);
    }
    node.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("nvidia.com/gpu"))
        .and_then(|q| q.0.trim().parse::<u32>().ok())
}

/// Runs `validation::validate` and, when every other check passed, the extra command.
pub(crate) async fn run_validation(
    health: Arc<NodeHealth>,
    expected: Option<Expected>,
    vcfg: ValidationSettings,
) -> ValidationReport {
    let mut report = validation::validate_expecting(&health, expected, &vcfg);
    if let Some(cmd) = vcfg.extra_command.as_ref().filter(|_| report.passed) {
        let check = crate::extra_command::run_extra_command(Some(cmd)).await;
        validation::add_check(&mut report, check);
    }
    report.time_unix_nano = Some(unix_nanos(SystemTime::now()));
    report
}

/// What the gate knows between passes.
pub(crate) struct StartupGate {
    /// The latest validation report: a passed one opens the gate.
    report: Option<ValidationReport>,
    /// Health changed in a way that fails the gate while a validation ran: its
    /// result (built from the health at spawn time) must not open the gate.
    spoiled: bool,
    /// Whether the last Node read carried the startup taint (kept across the
    /// re-reads after API errors).
    startup_seen: bool,
    /// Told every gate report (the engine shows it in `/v1/health.validation`).
    on_validation: Option<ValidationCallback>,
    vcfg: ValidationSettings,
    advertised: AdvertisedSettings,
    node_name: String,
    /// The Node's DRA devices as last listed (empty: none, or not a DRA
    /// Node): when there are some, the GPUs count as advertised once they
    /// publish them.
    dra: Vec<DraDevice>,
}

impl StartupGate {
    pub(crate) fn new(
        vcfg: ValidationSettings,
        advertised: AdvertisedSettings,
        node_name: String,
        on_validation: Option<ValidationCallback>,
    ) -> StartupGate {
        StartupGate {
            report: None,
            spoiled: false,
            startup_seen: false,
            on_validation,
            vcfg,
            advertised,
            node_name,
            dra: Vec::new(),
        }
    }

    /// The Node's DRA devices were listed: a report that failed only on
    /// the advertised check is judged again when they changed (a slice
    /// published is no GPU change: no need to wait for the next run).
    pub(crate) fn set_dra_devices(
        &mut self,
        devices: &[DraDevice],
        live: Option<&Node>,
        health: &NodeHealth,
    ) {
        if self.dra != devices {
            self.dra = devices.to_vec();
            self.node_changed(live, health);
        }
    }

    pub(crate) fn report(&self) -> Option<&ValidationReport> {
        self.report.as_ref()
    }

    /// A validation report passed (the gate opens unless health changed).
    pub(crate) fn passed(&self) -> bool {
        self.report.as_ref().is_some_and(|r| r.passed)
    }

    pub(crate) fn spoiled(&self) -> bool {
        self.spoiled
    }

    pub(crate) fn vcfg(&self) -> &ValidationSettings {
        &self.vcfg
    }

    /// A validation starts from the current health.
    pub(crate) fn validation_started(&mut self) {
        self.spoiled = false;
    }

    /// The Node was read: `true` when the startup taint came back (node
    /// template re-applied, an operator re-gating the node), which voids an
    /// earlier result.
    pub(crate) fn saw_node(&mut self, has_startup: bool) -> bool {
        let had_startup = std::mem::replace(&mut self.startup_seen, has_startup);
        if !had_startup && has_startup && self.report.is_some() {
            self.report = None;
            return true;
        }
        false
    }

    /// The expected count for the live Node and `health`.
    pub(crate) fn expected(&self, live: Option<&Node>, health: &NodeHealth) -> Option<Expected> {
        expected(
            live,
            &self.vcfg,
            self.advertised.mig_strategy,
            health,
            &self.dra,
        )
    }

    /// The pure checks on `health` (no extra command), with the expected GPU
    /// count of the live Node.
    fn recheck(&self, live: Option<&Node>, health: &NodeHealth) -> ValidationReport {
        let mut r = validation::validate_expecting(health, self.expected(live, health), &self.vcfg);
        self.add_device_plugin_check(live, &mut r, health);
        r.time_unix_nano = Some(unix_nanos(SystemTime::now()));
        r
    }

    /// Adds the device-plugin check (allocatable reaches the expected count)
    /// to a report whose other checks passed; replaces an earlier one.
    fn add_device_plugin_check(
        &self,
        live: Option<&Node>,
        report: &mut ValidationReport,
        health: &NodeHealth,
    ) {
        report.checks.retain(|c| c.name != advertised::CHECK);
        report.passed = report.complete && report.checks.iter().all(|c| c.passed);
        if !report.passed {
            return;
        }
        let node = live.cloned().unwrap_or_default();
        let check = if self.dra.is_empty() {
            advertised::gate_check(&node, health, &self.advertised)
        } else {
            advertised::dra_gate_check(&self.dra, health, &self.advertised)
        };
        if let Some(check) = check {
            validation::add_check(report, check);
        }
    }

    fn tell(&self, report: &ValidationReport) {
        if let Some(f) = &self.on_validation {
            f(report.clone());
        }
    }

    /// The Node changed while the gate holds: a report that failed only on
    /// the device-plugin check is judged again at once (the device plugin
    /// advertising is a Node change, not a GPU change: no need to wait for
    /// the next validation run).
    pub(crate) fn node_changed(&mut self, live: Option<&Node>, health: &NodeHealth) {
        let Some(mut report) = self.report.clone() else {
            return;
        };
        let only_plugin = !report.passed
            && report.complete
            && report
                .checks
                .iter()
                .filter(|c| !c.passed)
                .all(|c| c.name == advertised::CHECK);
        if !only_plugin {
            return;
        }
        let before = report.checks.clone();
        for c in &mut report.checks {
            if c.name == advertised::CHECK {
                c.passed = true;
            }
        }
        report.passed = true;
        self.add_device_plugin_check(live, &mut report, health);
        if report.checks != before {
            if report.passed {
                tracing::info!(node = %self.node_name, "Device plugin now advertises the GPUs; removing the startup taint.");
            }
            self.tell(&report);
            self.report = Some(report);
        }
    }

    /// A new health arrived while the gate holds: a cached passing report,
    /// or one being built, no longer opens the gate when the new health
    /// fails the pure checks (a fault appeared, a GPU left, another boot):
    /// the full validation, extra command included, runs again.
    pub(crate) fn health_changed(
        &mut self,
        live: Option<&Node>,
        health: &NodeHealth,
        validating: bool,
    ) {
        let fresh = self.recheck(live, health);
        if fresh.passed {
            return;
        }
        if validating && !self.spoiled {
            tracing::info!(node = %self.node_name, checks = %validation::failed_checks(&fresh).join(","), "GPU health changed while validation ran; its result will not remove the startup taint.");
            self.spoiled = true;
        }
        if self.passed() {
            tracing::info!(node = %self.node_name, checks = %validation::failed_checks(&fresh).join(","), "GPU health changed after validation passed; the startup taint stays.");
            self.tell(&fresh);
            self.report = Some(fresh);
        }
    }

    /// A validation finished with `report`. `None`: its result was stale
    /// (health failed the gate while it ran) and the current health was
    /// judged instead; otherwise the report as kept (device-plugin check
    /// added), for the caller to count and announce.
    pub(crate) fn record(
        &mut self,
        live: Option<&Node>,
        health: &NodeHealth,
        report: ValidationReport,
    ) -> Option<ValidationReport> {
        if std::mem::take(&mut self.spoiled) && report.passed {
            // Built from the health at spawn time; the health failed the gate
            // meanwhile. Judge the current health instead (the command runs
            // again at the next attempt if that passes).
            let fresh = self.recheck(live, health);
            tracing::info!(node = %self.node_name, "Validation result is stale (GPU health changed while it ran); validating again.");
            self.tell(&fresh);
            // Passing now: run the whole validation again at once; failing:
            // show why and retry at the next interval.
            self.report = if fresh.passed { None } else { Some(fresh) };
            return None;
        }
        let mut report = report;
        self.add_device_plugin_check(live, &mut report, health);
        self.tell(&report);
        self.report = Some(report.clone());
        Some(report)
    }

    /// Whether a passed report still opens the gate for `health`: the same
    /// boot, and the pure checks still pass.
    pub(crate) fn still_passes(&mut self, live: Option<&Node>, health: &NodeHealth) -> bool {
        if !self.passed() {
            return false;
        }
        let fresh = self.recheck(live, health);
        let same_boot = self
            .report
            .as_ref()
            .is_some_and(|r| r.boot_id == health.boot_id);
        if fresh.passed && same_boot {
            return true;
        }
        tracing::info!(node = %self.node_name, checks = %validation::failed_checks(&fresh).join(","), same_boot, "GPU health changed since validation passed; the startup taint stays.");
        self.tell(&fresh);
        self.report = if same_boot { Some(fresh) } else { None };
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn gate() -> (StartupGate, Arc<Mutex<Vec<ValidationReport>>>) {
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = told.clone();
        let cb: ValidationCallback = Arc::new(move |r| seen.lock().unwrap().push(r));
        let g = StartupGate::new(
            ValidationSettings::default(),
            crate::KubeSettings::default().advertised,
            "gpu-node-1".into(),
            Some(cb),
        );
        (g, told)
    }

    fn failed_report() -> ValidationReport {
        ValidationReport {
            passed: false,
            complete: true,
            checks: vec![gpuwatch_proto::ValidationCheck {
                name: "gpu_count".into(),
                passed: false,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_failed_report_is_kept_told_and_never_opens_the_gate() {
        let (mut g, told) = gate();
        let health = NodeHealth::default();
        assert!(!g.still_passes(None, &health), "no report: closed");
        let kept = g.record(None, &health, failed_report()).unwrap();
        assert!(!kept.passed);
        assert_eq!(told.lock().unwrap().len(), 1);
        assert!(g.report().is_some_and(|r| !r.passed));
        assert!(!g.passed());
        assert!(!g.still_passes(None, &health));
    }

    /// A gate that expects two GPUs.
    fn gate_for_two() -> (StartupGate, Arc<Mutex<Vec<ValidationReport>>>) {
        let (mut g, told) = gate();
        g.vcfg.expected_gpus = std::num::NonZeroU32::new(2);
        (g, told)
    }

    /// Two healthy GPUs in boot `boot`, as the checks want them: NVML
    /// answered, the kernel log read, a sample with nothing pending.
    fn healthy(boot: &str) -> NodeHealth {
        gpuwatch_test_support::health::healthy("", 2, boot)
    }

    /// [`healthy`] with an XID 79 on GPU 1 that asks for a reboot.
    fn faulty(boot: &str) -> NodeHealth {
        use gpuwatch_proto::{Action, ActiveFault, FaultKind, Verdict};
        let mut h = healthy(boot);
        let mut f = ActiveFault {
            code: 79,
            count: 1,
            reason: "XID79".into(),
            boot_id: boot.into(),
            ..Default::default()
        };
        f.set_kind(FaultKind::Xid);
        f.set_action(Action::RebootNode);
        h.gpus[1].active_faults.push(f);
        h.gpus[1].set_action(Action::RebootNode);
        h.gpus[1].set_verdict(Verdict::Unhealthy);
        h.set_verdict(Verdict::Unhealthy);
        h
    }

    /// A Node whose device plugin advertises `n` GPUs.
    fn advertising(n: u32) -> Node {
        use k8s_openapi::api::core::v1::NodeStatus;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        Node {
            status: Some(NodeStatus {
                allocatable: Some([("nvidia.com/gpu".to_owned(), Quantity(n.to_string()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// What a validation of `health` with the extra command passing returns.
    fn validated(g: &StartupGate, live: &Node, health: &NodeHealth) -> ValidationReport {
        validation::validate_expecting(health, g.expected(Some(live), health), g.vcfg())
    }

    fn names_active_faults(r: &ValidationReport) -> bool {
        !r.passed
            && r.checks
                .iter()
                .any(|c| c.name == "active_faults" && !c.passed)
    }

    /// The extra command can run for minutes; its result is built from the
    /// health when it started. A fault that appears meanwhile keeps the
    /// gate closed when that (passing) result comes back, and the engine is
    /// told why.
    #[test]
    fn a_fault_while_the_validation_runs_voids_its_passing_result() {
        let (mut g, told) = gate_for_two();
        let live = advertising(2);
        g.saw_node(true);
        g.validation_started();
        let at_start = validated(&g, &live, &healthy("boot-a"));
        assert!(at_start.passed, "{at_start:?}");
        g.health_changed(Some(&live), &faulty("boot-a"), true);
        assert!(g.spoiled());
        assert_eq!(g.record(Some(&live), &faulty("boot-a"), at_start), None);
        assert!(!g.passed());
        assert!(!g.still_passes(Some(&live), &faulty("boot-a")));
        assert!(g.report().is_some_and(names_active_faults));
        assert!(told.lock().unwrap().iter().any(names_active_faults));
        // The fault went away: the next validation's pass opens the gate.
        g.validation_started();
        let again = validated(&g, &live, &healthy("boot-a"));
        assert!(g.record(Some(&live), &healthy("boot-a"), again).is_some());
        assert!(g.still_passes(Some(&live), &healthy("boot-a")));
    }

    /// A pass that could not be acted on yet (the taint write was refused)
    /// is dropped when the health fails in between, and stays dropped when
    /// the health is good again: only a new validation opens the gate.
    #[test]
    fn a_cached_pass_is_dropped_when_the_health_fails_in_between() {
        let (mut g, _) = gate_for_two();
        let live = advertising(2);
        g.saw_node(true);
        g.validation_started();
        let pass = validated(&g, &live, &healthy("boot-a"));
        assert!(
            g.record(Some(&live), &healthy("boot-a"), pass)
                .is_some_and(|r| r.passed)
        );
        assert!(g.passed());
        g.health_changed(Some(&live), &faulty("boot-a"), false);
        assert!(g.report().is_some_and(names_active_faults));
        g.health_changed(Some(&live), &healthy("boot-a"), false);
        assert!(!g.passed(), "the old pass does not come back");
        assert!(!g.still_passes(Some(&live), &healthy("boot-a")));
    }

    /// A pass belongs to its boot: after a reboot the gate closes and the
    /// report is dropped, so a validation runs again.
    #[test]
    fn a_pass_from_another_boot_does_not_open_the_gate() {
        let (mut g, _) = gate_for_two();
        let live = advertising(2);
        let pass = validated(&g, &live, &healthy("boot-a"));
        g.record(Some(&live), &healthy("boot-a"), pass);
        assert!(g.still_passes(Some(&live), &healthy("boot-a")));
        assert!(!g.still_passes(Some(&live), &healthy("boot-b")));
        assert!(g.report().is_none());
    }

    /// A startup taint put back after the gate opened voids the pass.
    #[test]
    fn a_returning_startup_taint_voids_a_pass() {
        let (mut g, _) = gate_for_two();
        let live = advertising(2);
        g.saw_node(true);
        let pass = validated(&g, &live, &healthy("boot-a"));
        g.record(Some(&live), &healthy("boot-a"), pass);
        assert!(g.passed());
        assert!(!g.saw_node(false), "the writer removed it");
        assert!(g.passed());
        assert!(g.saw_node(true), "put back");
        assert!(!g.passed());
    }

    /// The GPUs pass but the device plugin advertises fewer: the gate stays
    /// closed, and opens when the Node shows them advertised, without
    /// another validation run.
    #[test]
    fn the_device_plugin_catching_up_opens_the_gate_without_a_new_run() {
        let (mut g, told) = gate_for_two();
        let health = healthy("boot-a");
        let none = advertising(0);
        let checks = validated(&g, &none, &health);
        assert!(checks.passed, "the GPUs themselves pass: {checks:?}");
        let kept = g.record(Some(&none), &health, checks).unwrap();
        assert!(!kept.passed);
        let plugin = kept
            .checks
            .iter()
            .find(|c| c.name == "device_plugin")
            .unwrap();
        assert!(!plugin.passed);
        assert!(
            plugin
                .message
                .starts_with("device plugin advertises 0 of 2 GPUs"),
            "{}",
            plugin.message
        );
        assert!(!g.still_passes(Some(&none), &health));
        g.node_changed(Some(&advertising(1)), &health);
        assert!(!g.passed(), "1 of 2");
        g.node_changed(Some(&advertising(2)), &health);
        assert!(g.passed());
        assert!(g.still_passes(Some(&advertising(2)), &health));
        assert!(told.lock().unwrap().last().is_some_and(|r| r.passed));
    }

    #[test]
    fn the_startup_taint_coming_back_voids_the_report() {
        let (mut g, _) = gate();
        let health = NodeHealth::default();
        assert!(!g.saw_node(true), "first sight: nothing to void");
        g.record(None, &health, failed_report());
        assert!(!g.saw_node(true), "still there: the report stands");
        assert!(g.report().is_some());
        assert!(!g.saw_node(false), "removed");
        assert!(g.report().is_some());
        assert!(g.saw_node(true), "back again");
        assert!(g.report().is_none());
    }
    #[test]
    fn a_dra_node_expects_every_gpu_its_slices_publish_or_nvml_sees() {
        let dev = |name: &str, uuid: &str, parent: Option<&str>| DraDevice {
            driver: "gpu.nvidia.com".into(),
            pool: "n".into(),
            name: name.into(),
            uuid: uuid.into(),
            parent_uuid: parent.map(Into::into),
        };
        let vcfg = ValidationSettings::default();
        let node = Node::default();
        let h = healthy("b");
        let count = |dra: &[DraDevice]| expected(Some(&node), &vcfg, MigStrategy::None, &h, dra);
        // No slices and no capacity: unknown.
        assert_eq!(count(&[]), None);
        // GPU 1 published only through its MIG device: both counted once.
        let both = [
            dev("gpu-0", "GPU-0", None),
            dev("gpu-1-mig-1g.10gb-9-0", "MIG-1a", Some("GPU-1")),
        ];
        assert_eq!(count(&both), Some(Expected::Gpus(2)));
        // A slice not yet publishing GPU 1: still two (the advertised check
        // names it); a GPU published but gone from NVML: three, so the count
        // check fails.
        assert_eq!(count(&both[..1]), Some(Expected::Gpus(2)));
        let gone = [
            dev("gpu-0", "GPU-0", None),
            dev("gpu-1", "GPU-1", None),
            dev("gpu-2", "GPU-2", None),
        ];
        assert_eq!(count(&gone), Some(Expected::Gpus(3)));
        // The advertised check names what is missing.
        let c =
            advertised::dra_gate_check(&both[..1], &h, &crate::KubeSettings::default().advertised)
                .unwrap();
        assert!(!c.passed);
        assert!(c.message.ends_with("missing GPU-1"), "{}", c.message);
        let c = advertised::dra_gate_check(&both, &h, &crate::KubeSettings::default().advertised)
            .unwrap();
        assert!(c.passed, "{}", c.message);
    }
}
