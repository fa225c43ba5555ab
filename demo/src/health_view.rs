//! What `/v1/health` says about the GPUs and the node, as the narration
//! compares and words it: one view per GPU, the line for a GPU whose view
//! changed, why a GPU does not validate, and which rule would clear a fault.

use crate::script::display_pci;
use gpuwatch_proto::{GpuSample, NodeHealth, RecoveryAction, ShortName};

/// One GPU as `/v1/health` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuView {
    pub pci: String,
    /// NVML index, once NVML confirmed it in this boot.
    pub index: Option<u64>,
    pub verdict: String,
    pub action: String,
    pub faults: Vec<String>,
    /// The GPU has an NVML sample (false: lost, or not polled yet).
    pub answering: bool,
}

impl GpuView {
    pub(crate) fn label(&self) -> String {
        match self.index {
            Some(i) => format!("GPU {i}"),
            None => format!("the GPU at {}", display_pci(&self.pci)),
        }
    }

    fn state(&self) -> String {
        let mut s = self.verdict.clone();
        if !self.faults.is_empty() {
            s.push_str(&format!(" ({}): {}", self.action, self.faults.join(", ")));
        }
        if !self.answering {
            s.push_str(" — not answering NVML");
        }
        s
    }

    /// Same health, ignoring whether NVML confirmed the index yet.
    fn same_as(&self, other: &GpuView) -> bool {
        (&self.verdict, &self.action, &self.faults, self.answering)
            == (
                &other.verdict,
                &other.action,
                &other.faults,
                other.answering,
            )
    }
}

pub(crate) fn gpu_views(h: &NodeHealth) -> Vec<GpuView> {
    h.gpus
        .iter()
        .map(|g| GpuView {
            pci: display_pci(&g.pci_address),
            index: g.index.map(u64::from),
            verdict: g.verdict().short_name().to_string(),
            action: g.action().short_name().to_string(),
            faults: g.active_faults.iter().map(|f| f.reason.clone()).collect(),
            answering: g.sample.is_some(),
        })
        .collect()
}

/// The narration line for a GPU whose view changed (`None`: nothing to say —
/// unchanged, or first seen healthy).
pub(crate) fn gpu_change(prev: Option<&GpuView>, cur: &GpuView) -> Option<String> {
    let label = cur.label();
    let healthy = cur.verdict == "healthy" && cur.faults.is_empty();
    match prev {
        Some(p) if p.same_as(cur) => None,
        None if healthy => None,
        None => Some(format!("{label} {}", cur.state())),
        Some(p) if healthy => Some(format!(
            "{label} recovered: {} → healthy, no active fault",
            p.verdict
        )),
        Some(p) if p.verdict != cur.verdict => {
            Some(format!("{label} {} → {}", p.verdict, cur.state()))
        }
        Some(p) if !p.answering && cur.answering => {
            Some(format!("{label} answers NVML again; still {}", cur.state()))
        }
        Some(_) => Some(format!("{label} {}", cur.state())),
    }
}

/// Why a GPU does not validate, from its NVML sample in `/v1/health`
/// (`None`: the GPU does not answer NVML).
pub(crate) fn sample_problems(sample: Option<&GpuSample>) -> Vec<String> {
    let Some(sample) = sample else {
        return vec!["it does not answer NVML".to_string()];
    };
    let mut out = Vec::new();
    for (set, text) in [
        (sample.remapped_rows_failure, "remapped_rows_failure=true"),
        (sample.remapped_rows_pending, "remapped_rows_pending=true"),
        (sample.retired_pages_pending, "retired_pages_pending=true"),
    ] {
        if set == Some(true) {
            out.push(text.to_string());
        }
    }
    match sample.recovery_action() {
        RecoveryAction::None | RecoveryAction::Unspecified => {}
        a => out.push(format!("recovery_action={}", a.short_name())),
    }
    if let (Some(w), Some(m)) = (sample.pcie_link_width, sample.pcie_link_width_max)
        && w < m
    {
        out.push(format!("PCIe link x{w}/x{m}"));
    }
    out
}

/// The rule that would clear a fault of this action (from the engine's
/// documented recovery rules).
pub(crate) fn clear_rule(action: &str) -> &'static str {
    match action {
        "inspect_hardware" => {
            "inspect_hardware clears only after a reboot in which the GPU validates for inspect_clear_quiet_secs, or when another GPU (new UUID) sits at this address"
        }
        "reboot_node" => "reboot_node clears after a reboot in which the GPU validates",
        "reset_gpu" => "reset_gpu clears once the GPU validates after a reset or a reboot",
        _ => "it clears when its condition is gone or its active window passes",
    }
}

/// The node's state in plain words: "healthy, 8 GPUs", or "unhealthy:
/// inspect_hardware (RowRemapFailure), 8 GPUs". No action or reason is named
/// when there is none.
pub(crate) fn node_line(h: &NodeHealth, gpu_count: Option<usize>) -> String {
    let verdict = match h.verdict().short_name() {
        "" | "unspecified" => "not known yet",
        v => v,
    };
    let mut s = verdict.to_string();
    let action = h.action().short_name();
    if !matches!(action, "" | "unspecified") {
        s.push_str(&format!(": {action}"));
    }
    if !h.reason.is_empty() && !h.reason.eq_ignore_ascii_case(verdict) {
        s.push_str(&format!(" ({})", h.reason));
    }
    match gpu_count {
        Some(1) => s.push_str(", 1 GPU"),
        Some(n) => s.push_str(&format!(", {n} GPUs")),
        None => s.push_str(", GPUs not enumerated yet"),
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/v1/health` as the agent serves it, read as the demo reads it.
    fn health(v: serde_json::Value) -> NodeHealth {
        serde_json::from_value(v).expect("a NodeHealth")
    }

    fn view(verdict: &str, faults: &[&str], answering: bool) -> GpuView {
        GpuView {
            pci: "0000:ba:00.0".into(),
            index: Some(6),
            verdict: verdict.into(),
            action: if faults.is_empty() {
                "unspecified".into()
            } else {
                "investigate".into()
            },
            faults: faults.iter().map(|f| f.to_string()).collect(),
            answering,
        }
    }

    #[test]
    fn gpu_changes_are_narrated_from_health() {
        let healthy = view("healthy", &[], true);
        let hot = view("degraded", &["ThermalSlowdown"], true);
        assert_eq!(gpu_change(None, &healthy), None);
        assert_eq!(gpu_change(Some(&healthy), &healthy), None);
        assert_eq!(
            gpu_change(Some(&healthy), &hot).unwrap(),
            "GPU 6 healthy → degraded (investigate): ThermalSlowdown"
        );
        assert_eq!(
            gpu_change(Some(&hot), &healthy).unwrap(),
            "GPU 6 recovered: degraded → healthy, no active fault"
        );
        let lost = view("unhealthy", &["XID79"], false);
        let back = view("unhealthy", &["XID79"], true);
        assert!(
            gpu_change(Some(&lost), &back)
                .unwrap()
                .contains("answers NVML again; still unhealthy")
        );
        assert!(
            gpu_change(None, &lost)
                .unwrap()
                .ends_with("not answering NVML")
        );
        // Only the index became known: nothing to say.
        let mut unconfirmed = hot.clone();
        unconfirmed.index = None;
        assert_eq!(gpu_change(Some(&unconfirmed), &hot), None);
    }

    #[test]
    fn health_json_becomes_views_and_reasons() {
        let h = health(serde_json::json!({
            "verdict": "unhealthy",
            "monitor": {"inputs": [{"input": "nvml", "state": "up"}]},
            "gpus": [
                {"index": 5, "pci_address": "0000:ab:00.0", "verdict": "unhealthy",
                 "action": "inspect_hardware",
                 "active_faults": [{"reason": "RowRemapFailure", "action": "inspect_hardware"}],
                 "sample": {"remapped_rows_failure": true, "remapped_rows_pending": false,
                            "recovery_action": "none", "pcie_link_width": 8,
                            "pcie_link_width_max": 16}},
                {"pci_address": "0000:3a:00.0", "verdict": "unknown", "action": "reboot_node",
                 "active_faults": [{"reason": "XID79"}], "sample": null}
            ]
        }));
        let v = gpu_views(&h);
        assert_eq!(v[0].label(), "GPU 5");
        assert_eq!(v[0].faults, ["RowRemapFailure"]);
        assert!(v[0].answering);
        assert_eq!(v[1].label(), "the GPU at 0000:3a:00.0");
        assert!(!v[1].answering);
        assert_eq!(
            sample_problems(h.gpus[0].sample.as_ref()),
            ["remapped_rows_failure=true", "PCIe link x8/x16"]
        );
        assert_eq!(sample_problems(None), ["it does not answer NVML"]);
        assert!(clear_rule("inspect_hardware").contains("reboot"));
    }

    #[test]
    fn node_line_is_plain_words() {
        let healthy = health(
            serde_json::json!({"verdict": "healthy", "action": "unspecified",
            "reason": "Healthy", "gpus": []}),
        );
        assert_eq!(node_line(&healthy, Some(8)), "healthy, 8 GPUs");
        let bad = health(
            serde_json::json!({"verdict": "unhealthy", "action": "inspect_hardware",
            "reason": "RowRemapFailure"}),
        );
        assert_eq!(
            node_line(&bad, Some(8)),
            "unhealthy: inspect_hardware (RowRemapFailure), 8 GPUs"
        );
        assert_eq!(
            node_line(&health(serde_json::json!({})), None),
            "not known yet, GPUs not enumerated yet"
        );
    }
}
