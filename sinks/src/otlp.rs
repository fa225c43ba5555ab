//! OTLP export of metrics and fault log records (placeholder config; being written).

use serde::Deserialize;

/// OTLP exporter settings (`[otlp]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Export over OTLP at all.
    pub enabled: bool,
}

impl OtlpConfig {
    /// Problems with the settings (empty when valid).
    pub fn validate(&self) -> Vec<String> {
        Vec::new()
    }
}
