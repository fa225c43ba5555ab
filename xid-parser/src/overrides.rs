//! Per-XID policy overrides from the agent's TOML config (`[policy]` section).
//!
//! ```toml
//! [policy]
//! default_recurrence_reboots = 2
//!
//! [policy.xid."79"]
//! action = "inspect_hardware"
//! threshold = { count = 3, window_secs = 600 }
//! recurrence_reboots = 3
//! ```
//!
//! The types are plain serde structs (`deny_unknown_fields`); `Policy::new`
//! validates them and reports every problem at once ([`PolicyOverrides::validate`]).

use gpuwatch_proto::{Action, ShortName};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// The `[policy]` config section.
#[derive(Deserialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyOverrides {
    /// Per-code overrides, keyed by the XID in decimal (`"79"`).
    #[serde(default)]
    pub xid: BTreeMap<String, XidOverride>,
    /// Reboots after which a recurring reset/reboot-class fault on the same GPU
    /// escalates to `inspect_hardware`, for codes without their own
    /// `recurrence_reboots` (default 2).
    #[serde(default)]
    pub default_recurrence_reboots: Option<u32>,
}

/// Override of one XID's policy entry. Every field is optional; unset fields keep
/// the table's value.
#[derive(Deserialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct XidOverride {
    /// Action, as its short name (`ignore`, `restart_app`, `investigate`,
    /// `reset_gpu`, `reboot_node`, `inspect_hardware`). An action override
    /// replaces the table entry and the code's context rules.
    #[serde(default, deserialize_with = "deserialize_action")]
    pub action: Option<Action>,
    /// Act only once the code was seen `count` times on the same GPU within
    /// `window_secs` (applied by the health engine); below it the event is
    /// counted but does not isolate.
    #[serde(default)]
    pub threshold: Option<CountWindow>,
    /// Reboots after which this code recurring on the same GPU escalates to
    /// `inspect_hardware`.
    #[serde(default)]
    pub recurrence_reboots: Option<u32>,
}

/// A count-within-window threshold.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CountWindow {
    /// Occurrences needed (≥ 1).
    pub count: u32,
    /// Window length in seconds (≥ 1).
    pub window_secs: u64,
}

/// The action names accepted in config, for error messages.
pub(crate) fn action_names() -> String {
    Action::ALL
        .iter()
        .map(|a| a.short_name())
        .collect::<Vec<_>>()
        .join(", ")
}

fn deserialize_action<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Action>, D::Error> {
    let name = String::deserialize(de)?;
    match Action::from_short_name(&name) {
        Some(Action::Unspecified) | None => Err(serde::de::Error::custom(format!(
            "unknown action {name:?}; expected one of: {}",
            action_names()
        ))),
        Some(action) => Ok(Some(action)),
    }
}

/// One problem found in the `[policy]` section; the key is relative to `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideProblem {
    /// Key path below `[policy]`, e.g. `xid."79".threshold.count`.
    pub key: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl std::fmt::Display for OverrideProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "policy.{}: {}", self.key, self.message)
    }
}

/// Parses an override key: a decimal XID ≥ 1, no sign, no spaces, no leading zeros.
pub(crate) fn parse_xid_key(key: &str) -> Result<u32, String> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{key:?} is not an XID; expected a decimal number such as \"79\""
        ));
    }
    if key.len() > 1 && key.starts_with('0') {
        return Err(format!(
            "{key:?} has leading zeros; write it as \"{}\"",
            key.trim_start_matches('0')
        ));
    }
    match key.parse::<u32>() {
        Ok(0) => Err("XID 0 does not exist; codes start at 1".to_string()),
        Ok(code) => Ok(code),
        Err(_) => Err(format!("{key:?} is out of range for an XID")),
    }
}

impl PolicyOverrides {
    /// Checks every override without stopping at the first problem: keys must be
    /// decimal XIDs, counts, windows and reboot numbers must be ≥ 1, and an
    /// override must set something.
    pub fn validate(&self) -> Vec<OverrideProblem> {
        let mut problems = Vec::new();
        if self.default_recurrence_reboots == Some(0) {
            problems.push(OverrideProblem {
                key: "default_recurrence_reboots".into(),
                message: "must be at least 1 (0 would escalate every fault to inspect_hardware)"
                    .into(),
            });
        }
        for (key, ov) in &self.xid {
            let prefix = format!("xid.{key:?}");
            if let Err(message) = parse_xid_key(key) {
                problems.push(OverrideProblem {
                    key: prefix.clone(),
                    message,
                });
            }
            if ov.action.is_none() && ov.threshold.is_none() && ov.recurrence_reboots.is_none() {
                problems.push(OverrideProblem {
                    key: prefix.clone(),
                    message: "sets nothing; expected action, threshold or recurrence_reboots"
                        .into(),
                });
            }
            if ov.action == Some(Action::Unspecified) {
                problems.push(OverrideProblem {
                    key: format!("{prefix}.action"),
                    message: format!(
                        "\"unspecified\" is not an action; expected one of: {}",
                        action_names()
                    ),
                });
            }
            if let Some(t) = ov.threshold {
                if t.count == 0 {
                    problems.push(OverrideProblem {
                        key: format!("{prefix}.threshold.count"),
                        message: "must be at least 1".into(),
                    });
                }
                if t.window_secs == 0 {
                    problems.push(OverrideProblem {
                        key: format!("{prefix}.threshold.window_secs"),
                        message: "must be at least 1 second".into(),
                    });
                }
            }
            if ov.recurrence_reboots == Some(0) {
                problems.push(OverrideProblem {
                    key: format!("{prefix}.recurrence_reboots"),
                    message: "must be at least 1; to treat the code as hardware from the start set action = \"inspect_hardware\"".into(),
                });
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented example, through serde_json (the crate has no TOML
    /// dependency; the collector's config tests parse the TOML form).
    #[test]
    fn parses_the_documented_example() {
        let ov: PolicyOverrides = serde_json::from_str(
            r#"{"default_recurrence_reboots":2,"xid":{"79":{"action":"inspect_hardware",
                "threshold":{"count":3,"window_secs":600},"recurrence_reboots":3}}}"#,
        )
        .unwrap();
        let x = &ov.xid["79"];
        assert_eq!(x.action, Some(Action::InspectHardware));
        assert_eq!(
            x.threshold,
            Some(CountWindow {
                count: 3,
                window_secs: 600
            })
        );
        assert_eq!(x.recurrence_reboots, Some(3));
        assert_eq!(ov.default_recurrence_reboots, Some(2));
        assert!(ov.validate().is_empty());
    }

    #[test]
    fn unknown_action_name_lists_the_choices() {
        let err = serde_json::from_str::<XidOverride>(r#"{"action":"reboot"}"#).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("unknown action \"reboot\""), "{msg}");
        assert!(msg.contains("inspect_hardware"), "{msg}");
        let err = serde_json::from_str::<XidOverride>(r#"{"action":"unspecified"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown action"));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<XidOverride>(r#"{"actoin":"ignore"}"#).is_err());
        assert!(
            serde_json::from_str::<CountWindow>(r#"{"count":1,"window_secs":1,"x":1}"#).is_err()
        );
        assert!(serde_json::from_str::<PolicyOverrides>(r#"{"xids":{}}"#).is_err());
    }

    #[test]
    fn keys_are_strict_decimal_xids() {
        assert_eq!(parse_xid_key("79"), Ok(79));
        assert_eq!(parse_xid_key("185"), Ok(185));
        for bad in [
            "",
            "x79",
            "79 ",
            "+79",
            "-1",
            "0",
            "079",
            "99999999999",
            "7.9",
        ] {
            assert!(parse_xid_key(bad).is_err(), "{bad:?} accepted");
        }
    }
}
