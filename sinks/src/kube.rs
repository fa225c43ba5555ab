//! Kubernetes node writer (placeholder config; being written).

use serde::Deserialize;

/// Node writer settings (`[kube]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeConfig {
    /// Write conditions, taints and Events on the agent's own Node.
    pub enabled: bool,
}

impl KubeConfig {
    /// Problems with the settings (empty when valid).
    pub fn validate(&self) -> Vec<String> {
        Vec::new()
    }
}
