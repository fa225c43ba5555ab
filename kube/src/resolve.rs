//! `[kube]` checked and typed in one pass: [`KubeConfig::resolve`] turns the
//! file's values into [`KubeSettings`] or names every problem (key paths
//! relative to `[kube]`), so that the check and the resolution cannot drift.

use super::config::{KubeConfig, TaintConfig};
use super::quarantine::Budget;
use super::settings::{
    KubeSettings, Parsed, Taint, TaintEffect, TaintSettings, fault_keys, isolating_action,
};
use gpuwatch_core::names::{check_label_key, is_dns_label, is_qualified_name_part};
use gpuwatch_proto::Action;
use std::collections::BTreeMap;

impl KubeConfig {
    /// Problems with the settings (empty when valid); key names relative to
    /// `[kube]`. The problems [`KubeConfig::resolve`] reports.
    pub fn validate(&self) -> Vec<String> {
        self.resolve().err().unwrap_or_default()
    }

    /// Checks the settings and types them in one pass: the resolved settings,
    /// or every problem (key names relative to `[kube]`).
    pub fn resolve(&self) -> Result<KubeSettings, Vec<String>> {
        let mut p = Vec::new();
        self.check_conditions(&mut p);
        let hardware_not_ready = self.hardware_not_ready_actions(&mut p);
        let taints = self.resolve_taints(&mut p);
        self.check_names(&mut p);
        self.check_pacing(&mut p);
        let budget = self.check_quarantine(&mut p);
        let device_effect = self.check_device_taint_effect(&mut p);
        if self.condition_flap_limit > 0 && self.condition_flap_window_secs == 0 {
            p.push("condition_flap_window_secs: must be greater than 0 while condition_flap_limit is set".into());
        }
        match (taints, budget, device_effect) {
            (Some(taints), Some(budget), Some(device_effect)) if p.is_empty() => {
                Ok(KubeSettings::from_parts(
                    self,
                    Parsed {
                        hardware_not_ready,
                        taints,
                        budget,
                        device_effect,
                    },
                ))
            }
            _ => Err(p),
        }
    }

    fn check_conditions(&self, p: &mut Vec<String>) {
        if self.field_manager.is_empty() || self.field_manager.len() > 128 {
            p.push("field_manager: expected 1 to 128 characters".into());
        }
        for (key, name) in [
            ("ready_condition_type", &self.ready_condition_type),
            ("problem_condition_type", &self.problem_condition_type),
            ("network_condition_type", &self.network_condition_type),
        ] {
            if !is_condition_type(name) {
                p.push(format!(
                    "{key}: {name:?} is not a valid condition type (letters, digits, '.', '-', '_', '/'; starts with a letter)"
                ));
            }
        }
        if self.ready_condition && self.ready_condition_type == self.problem_condition_type {
            p.push("problem_condition_type: must differ from ready_condition_type".into());
        }
        if self.network_condition_type == self.problem_condition_type
            || (self.ready_condition && self.network_condition_type == self.ready_condition_type)
        {
            p.push("network_condition_type: must differ from the GPU condition types".into());
        }
    }

    fn hardware_not_ready_actions(&self, p: &mut Vec<String>) -> Vec<Action> {
        let mut actions = Vec::new();
        for a in &self.hardware_not_ready_actions {
            match isolating_action(a) {
                Some(act) => actions.push(act),
                None => p.push(format!(
                    "hardware_not_ready_actions: {a:?} is not one of reset_gpu, reboot_node, inspect_hardware"
                )),
            }
        }
        actions
    }

    /// The fault taint, the per-action ones and the startup taint, when each is valid.
    fn resolve_taints(&self, p: &mut Vec<String>) -> Option<TaintSettings> {
        let fault = self.check_taint("fault_taint", &self.fault_taint, p);
        let mut by_action = BTreeMap::new();
        for (action, t) in &self.fault_taint_actions {
            let act = isolating_action(action);
            if act.is_none() {
                p.push(format!(
                    "fault_taint_actions: {action:?} is not one of reset_gpu, reboot_node, inspect_hardware"
                ));
            }
            let taint = self.check_taint(&format!("fault_taint_actions.{action}"), t, p);
            if let (Some(act), Some(taint)) = (act, taint) {
                by_action.insert(act, taint);
            }
        }
        let startup = self.check_taint("startup_taint", &self.startup_taint, p);
        let fault_keys = fault_keys(
            &self.fault_taint.key,
            self.fault_taint_actions.values().map(|t| &t.key),
        );
        if fault_keys.contains(&self.startup_taint.key) {
            p.push("startup_taint.key: must differ from the fault taint keys".into());
        }
        Some(TaintSettings {
            fault: fault?,
            fault_by_action: by_action,
            startup: startup?,
        })
    }

    /// `device_taint_effect`: a DeviceTaintRule's effect that isolates the
    /// device (`None` only marks it), `NoExecute` only when opted in.
    fn check_device_taint_effect(&self, p: &mut Vec<String>) -> Option<TaintEffect> {
        match TaintEffect::parse(&self.device_taint_effect) {
            Some(e @ TaintEffect::NoSchedule) => Some(e),
            Some(e @ TaintEffect::NoExecute) if self.allow_no_execute => Some(e),
            Some(TaintEffect::NoExecute) => {
                p.push("device_taint_effect: NoExecute evicts the pods using the device (and the device-taint eviction controller does not honour PodDisruptionBudgets); set allow_no_execute = true to opt in".into());
                None
            }
            _ => {
                p.push(format!(
                    "device_taint_effect: {:?} is not one of NoSchedule, NoExecute",
                    self.device_taint_effect
                ));
                None
            }
        }
    }

    fn check_names(&self, p: &mut Vec<String>) {
        if !is_dns_label(&self.event_namespace) {
            p.push(format!(
                "event_namespace: {:?} is not a valid namespace name (RFC 1123 label)",
                self.event_namespace
            ));
        }
        for r in &self.allocatable_resources {
            let name = r.strip_suffix('*').unwrap_or(r);
            if !name.contains('/') || name.chars().any(|c| c.is_whitespace()) {
                p.push(format!(
                    "allocatable_resources: {r:?} is not an extended resource name (domain/name, optional trailing *)"
                ));
            }
        }
        if self.expected_allocatable == Some(0) {
            p.push(
                "expected_allocatable: must be at least 1 (leave unset to count healthy GPUs)"
                    .into(),
            );
        }
        if let Some(url) = &self.api_server_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            p.push(format!(
                "api_server_url: {url:?} must start with http:// or https://"
            ));
        }
    }

    fn check_pacing(&self, p: &mut Vec<String>) {
        for (key, v) in [
            ("validation_interval_secs", self.validation_interval_secs),
            ("not_advertised_grace_secs", self.not_advertised_grace_secs),
            ("event_queue_capacity", self.event_queue_capacity as u64),
            ("event_burst", u64::from(self.event_burst)),
            ("events_per_minute", u64::from(self.events_per_minute)),
            ("event_dedup_window_secs", self.event_dedup_window_secs),
            ("event_patch_interval_secs", self.event_patch_interval_secs),
            ("min_write_interval_ms", self.min_write_interval_ms),
            ("backoff_initial_ms", self.backoff_initial_ms),
            ("backoff_max_ms", self.backoff_max_ms),
            ("resync_secs", self.resync_secs),
            ("watch_timeout_secs", u64::from(self.watch_timeout_secs)),
            ("request_timeout_secs", self.request_timeout_secs),
        ] {
            if v == 0 {
                p.push(format!("{key}: must be greater than 0"));
            }
        }
        if self.normal_event_spread_secs > 300 {
            p.push(format!(
                "normal_event_spread_secs: {} is longer than 300",
                self.normal_event_spread_secs
            ));
        }
        if self.backoff_max_ms < self.backoff_initial_ms {
            p.push("backoff_max_ms: must be at least backoff_initial_ms".into());
        }
    }

    /// Checks the quarantine settings; the budget, when it parses.
    fn check_quarantine(&self, p: &mut Vec<String>) -> Option<Budget> {
        let budget = Budget::parse(&self.quarantine_budget)
            .map_err(|e| p.push(format!("quarantine_budget: {e}")))
            .ok();
        if let Err(e) = check_label_selector(&self.quarantine_node_selector) {
            p.push(format!("quarantine_node_selector: {e}"));
        }
        if let Some(ns) = &self.quarantine_namespace
            && !is_dns_label(ns)
        {
            p.push(format!(
                "quarantine_namespace: {ns:?} is not a valid namespace name (RFC 1123 label)"
            ));
        }
        if !(1..=30).contains(&self.quarantine_retry_secs) {
            p.push(format!(
                "quarantine_retry_secs: {} is outside 1..=30 (a freed slot must be taken within a minute)",
                self.quarantine_retry_secs
            ));
        }
        if !(15..=3600).contains(&self.quarantine_lease_duration_secs) {
            p.push(format!(
                "quarantine_lease_duration_secs: {} is outside 15..=3600",
                self.quarantine_lease_duration_secs
            ));
        }
        budget
    }

    /// Checks one taint; the taint, when valid.
    fn check_taint(&self, key: &str, t: &TaintConfig, p: &mut Vec<String>) -> Option<Taint> {
        let mut valid = true;
        if let Err(e) = check_label_key(&t.key) {
            p.push(format!("{key}.key: {:?} {e}", t.key));
            valid = false;
        }
        match TaintEffect::parse(&t.effect) {
            None => p.push(format!(
                "{key}.effect: {:?} is not one of NoSchedule, PreferNoSchedule, NoExecute",
                t.effect
            )),
            Some(TaintEffect::NoExecute) if !self.allow_no_execute && key != "startup_taint" => {
                p.push(format!(
                    "{key}.effect: NoExecute evicts running pods; set allow_no_execute = true to opt in"
                ));
            }
            Some(effect) => {
                return valid.then(|| Taint {
                    key: t.key.clone(),
                    effect,
                });
            }
        }
        None
    }
}

/// A label selector as the API server parses it (`k8s.io/apimachinery/pkg/labels`
/// `Parse`): comma-separated `key`, `!key`, `key=value`, `key==value`,
/// `key!=value`, `key in (a,b)`, `key notin (a,b)`.
fn check_label_selector(sel: &str) -> Result<(), String> {
    if sel.trim().is_empty() {
        return Err("must not be empty (the fleet would be every Node)".into());
    }
    for req in split_requirements(sel) {
        let req = req.trim();
        let (key, values) = if let Some(k) = req.strip_prefix('!') {
            (k, Vec::new())
        } else if let Some((k, rest)) = req.split_once(" notin ").or_else(|| req.split_once(" in "))
        {
            let set = rest.trim();
            let Some(inner) = set.strip_prefix('(').and_then(|s| s.strip_suffix(')')) else {
                return Err(format!("{req:?}: a set is written (a,b)"));
            };
            (k, inner.split(',').map(str::trim).collect())
        } else if let Some((k, v)) = req
            .split_once("!=")
            .or_else(|| req.split_once("=="))
            .or_else(|| req.split_once('='))
        {
            (k, vec![v.trim()])
        } else {
            (req, Vec::new())
        };
        check_label_key(key.trim()).map_err(|e| format!("{req:?}: key {e}"))?;
        for v in values {
            if !is_label_value(v) {
                return Err(format!("{req:?}: {v:?} is not a label value"));
            }
        }
    }
    Ok(())
}

/// Splits at the commas outside `( )`.
fn split_requirements(sel: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in sel.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&sel[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&sel[start..]);
    out
}

/// A label value: empty, or what a qualified name's name part may be (at
/// most 63 alphanumerics, `-`, `_`, `.`, starting and ending with an
/// alphanumeric).
fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_qualified_name_part(v)
}

fn is_condition_type(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 316
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_as_the_api_server_parses_them() {
        for ok in [
            "nvidia.com/gpu.present=true",
            "nvidia.com/gpu.present==true,node-role.kubernetes.io/gpu",
            "!node.kubernetes.io/exclude-from-external-load-balancers",
            "nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3,NVIDIA-H200)",
            "tier notin (cpu), zone!=us-east-1a",
        ] {
            assert_eq!(check_label_selector(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a=b=c", "x in a,b", "-bad=x", "k=-v", "UPPER.io/x=1"] {
            assert!(check_label_selector(bad).is_err(), "{bad}");
        }
    }
}
