//! Device validation (placeholder config; being written).

use serde::Deserialize;

/// Device validation settings (`[validation]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// GPUs the node must have; unset: from the node label or `nvidia.com/gpu` capacity.
    pub expected_gpus: Option<u32>,
}

impl ValidationConfig {
    /// Problems with the settings (empty when valid).
    pub fn validate(&self) -> Vec<String> {
        Vec::new()
    }
}
