//! NVLink fabric registration as NVML reports it (`nvmlGpuFabricInfoV_t`):
//! the state names, the health mask, and what of it is a problem. Shared by
//! nvml-sim, the poller, the engine and validation so they agree on one
//! reading of the mask.
//!
//! The numbers are NVML's (`nvml.h`, `NVML_GPU_FABRIC_STATE_*` and
//! `NVML_GPU_FABRIC_HEALTH_MASK_*`): every health field is a small unsigned
//! value at its shift, `0` meaning "not supported", `1` "true" (the condition
//! holds) and `2` "false"; the incorrect-configuration field is `1` for none
//! and `2..=5` for the kind of misconfiguration.
//!
//! ```
//! use gpuwatch_proto::GpuFabric;
//! use gpuwatch_proto::fabric::{self, Problem};
//!
//! let f = GpuFabric { state: "completed".into(), status: "success".into(), health_mask: Some(0b10_0001), ..Default::default() };
//! assert_eq!(fabric::problem(&f), Some(Problem::DegradedBandwidth));
//! assert!(fabric::is_pending(&GpuFabric { state: "in_progress".into(), ..Default::default() }));
//! ```

use crate::GpuFabric;

/// No NVLink fabric on this GPU (PCIe boards, NVLink bridges without NVSwitch).
pub const NOT_SUPPORTED: &str = "not_supported";
/// The fabric manager has not started registering the GPU.
pub const NOT_STARTED: &str = "not_started";
/// Registration is under way.
pub const IN_PROGRESS: &str = "in_progress";
/// Registration finished; `status` says how.
pub const COMPLETED: &str = "completed";
/// The status of a registration that succeeded.
pub const SUCCESS: &str = "success";

/// The state names, by NVML value (`NVML_GPU_FABRIC_STATE_NOT_SUPPORTED` = 0
/// .. `NVML_GPU_FABRIC_STATE_COMPLETED` = 3).
pub const STATES: [&str; 4] = [NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED];

/// The state name of an NVML state value.
pub fn state_name(raw: u8) -> Option<&'static str> {
    STATES.get(usize::from(raw)).copied()
}

/// The NVML value of a state name.
pub fn state_value(name: &str) -> Option<u8> {
    STATES
        .iter()
        .position(|s| *s == name)
        .and_then(|i| u8::try_from(i).ok())
}

const DEGRADED_BW_SHIFT: u32 = 0;
const ROUTE_RECOVERY_SHIFT: u32 = 2;
const ROUTE_UNHEALTHY_SHIFT: u32 = 4;
const ACCESS_TIMEOUT_RECOVERY_SHIFT: u32 = 6;
const INCORRECT_CONFIGURATION_SHIFT: u32 = 8;
/// A true/false field's value holding (`..._TRUE`).
const TRUE: u32 = 1;

fn field(mask: u32, shift: u32, width: u32) -> u32 {
    (mask >> shift) & width
}

/// What the fabric health mask says, field by field, in words (only the
/// fields that hold; a field the GPU does not support is left out).
pub fn health_notes(mask: u32) -> Vec<&'static str> {
    let mut notes = Vec::new();
    if field(mask, DEGRADED_BW_SHIFT, 3) == TRUE {
        notes.push("degraded bandwidth");
    }
    if field(mask, ROUTE_RECOVERY_SHIFT, 3) == TRUE {
        notes.push("route recovery in progress");
    }
    if field(mask, ROUTE_UNHEALTHY_SHIFT, 3) == TRUE {
        notes.push("route unhealthy");
    }
    if field(mask, ACCESS_TIMEOUT_RECOVERY_SHIFT, 3) == TRUE {
        notes.push("access timeout recovery in progress");
    }
    if let Some(c) = incorrect_configuration(mask) {
        notes.push(c);
    }
    notes
}

/// The misconfiguration the mask reports (`INCORRECT_CONFIGURATION_*` 2..=5).
fn incorrect_configuration(mask: u32) -> Option<&'static str> {
    match field(mask, INCORRECT_CONFIGURATION_SHIFT, 15) {
        2 => Some("incorrect configuration: system GUID"),
        3 => Some("incorrect configuration: chassis serial number"),
        4 => Some("incorrect configuration: no fabric partition"),
        5 => Some("incorrect configuration: insufficient NVLinks"),
        _ => None,
    }
}

/// One thing wrong with a GPU's fabric registration, in the order a sample
/// is checked for them (the first that holds is the GPU's fabric problem).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Problem {
    /// Registration completed with a failure status.
    RegistrationFailed,
    /// Not registered (not started or in progress) when it should be: the GPU
    /// left `completed`, or stayed unregistered past the wait.
    NotRegistered,
    /// A route through the fabric is unhealthy.
    RouteUnhealthy,
    /// The GPU's fabric bandwidth is degraded (NVLinks to the NVSwitches lost).
    DegradedBandwidth,
    /// The fabric is misconfigured for this GPU (system GUID, chassis serial,
    /// partition, NVLink count).
    IncorrectConfiguration,
}

impl Problem {
    /// Every problem, in check order.
    pub const ALL: [Problem; 5] = [
        Problem::RegistrationFailed,
        Problem::NotRegistered,
        Problem::RouteUnhealthy,
        Problem::DegradedBandwidth,
        Problem::IncorrectConfiguration,
    ];

    /// The stable name (the `fabric_problem` attribute of a fabric fault).
    pub fn name(self) -> &'static str {
        match self {
            Problem::RegistrationFailed => "registration_failed",
            Problem::NotRegistered => "not_registered",
            Problem::RouteUnhealthy => "route_unhealthy",
            Problem::DegradedBandwidth => "degraded_bandwidth",
            Problem::IncorrectConfiguration => "incorrect_configuration",
        }
    }

    /// The problem of a `fabric_problem` attribute value.
    pub fn from_name(name: &str) -> Option<Problem> {
        Problem::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The short reason of a fault with this problem.
    pub fn reason(self) -> &'static str {
        match self {
            Problem::RegistrationFailed => "GPUFabricRegistrationFailed",
            Problem::NotRegistered => "GPUFabricNotRegistered",
            Problem::RouteUnhealthy => "GPUFabricRouteUnhealthy",
            Problem::DegradedBandwidth => "GPUFabricDegradedBandwidth",
            Problem::IncorrectConfiguration => "GPUFabricMisconfigured",
        }
    }
}

/// Registration not finished (`not_started` or `in_progress`).
pub fn is_pending(f: &GpuFabric) -> bool {
    f.state == NOT_STARTED || f.state == IN_PROGRESS
}

/// What is wrong with a registration that finished (failure status, or the
/// health mask); `None` while it is pending (the caller decides whether
/// pending is a problem yet) or when it is fine.
pub fn problem(f: &GpuFabric) -> Option<Problem> {
    if f.state != COMPLETED {
        return None;
    }
    if f.status != SUCCESS {
        return Some(Problem::RegistrationFailed);
    }
    let mask = f.health_mask?;
    if field(mask, ROUTE_UNHEALTHY_SHIFT, 3) == TRUE {
        Some(Problem::RouteUnhealthy)
    } else if field(mask, DEGRADED_BW_SHIFT, 3) == TRUE {
        Some(Problem::DegradedBandwidth)
    } else {
        incorrect_configuration(mask).map(|_| Problem::IncorrectConfiguration)
    }
}

/// An NVML return code as the status word of a finished registration
/// (`nvmlReturn_t`; `0` is success).
pub fn status_name(ret: u32) -> String {
    let name = match ret {
        0 => SUCCESS,
        1 => "uninitialized",
        2 => "invalid_argument",
        3 => "not_supported",
        4 => "no_permission",
        5 => "already_initialized",
        6 => "not_found",
        7 => "insufficient_size",
        8 => "insufficient_power",
        9 => "driver_not_loaded",
        10 => "timeout",
        11 => "irq_issue",
        12 => "library_not_found",
        13 => "function_not_found",
        14 => "corrupted_inforom",
        15 => "gpu_is_lost",
        16 => "reset_required",
        17 => "operating_system",
        18 => "lib_rm_version_mismatch",
        19 => "in_use",
        20 => "memory",
        21 => "no_data",
        23 => "insufficient_resources",
        25 => "argument_version_mismatch",
        27 => "not_ready",
        29 => "invalid_state",
        999 => "unknown",
        n => return format!("nvml_error_{n}"),
    };
    name.into()
}

/// A status word in a sentence ("the NVML status insufficient_resources").
pub fn status_words(status: &str) -> String {
    match status {
        "insufficient_resources" => {
            "insufficient resources (the fabric manager could not set up the GPU's routes)".into()
        }
        "timeout" => "timed out".into(),
        "unknown" => "an unknown error".into(),
        "not_supported" => "not supported by this fabric".into(),
        s => s.replace('_', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(mask: Option<u32>) -> GpuFabric {
        GpuFabric {
            state: COMPLETED.into(),
            status: SUCCESS.into(),
            health_mask: mask,
            ..Default::default()
        }
    }

    #[test]
    fn every_state_round_trips_through_its_nvml_value() {
        for (i, s) in STATES.iter().enumerate() {
            let v = u8::try_from(i).unwrap();
            assert_eq!(state_name(v), Some(*s));
            assert_eq!(state_value(s), Some(v));
        }
        assert_eq!(state_name(4), None);
    }

    #[test]
    fn health_mask_fields_are_read_at_their_shifts() {
        // Every field "false" (2): healthy.
        let healthy = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8;
        assert_eq!(problem(&completed(Some(healthy))), None);
        assert!(health_notes(healthy).is_empty());
        assert_eq!(problem(&completed(Some(0))), None, "nothing supported");
        assert_eq!(
            problem(&completed(Some(healthy & !0b11 | 1))),
            Some(Problem::DegradedBandwidth)
        );
        let unhealthy = healthy & !(0b11 << 4) | 1 << 4;
        assert_eq!(
            problem(&completed(Some(unhealthy & !0b11 | 1))),
            Some(Problem::RouteUnhealthy),
            "an unhealthy route outranks degraded bandwidth"
        );
        // Recoveries in progress are noted, not problems by themselves.
        let recovering = 1 << 2 | 1 << 6;
        assert_eq!(problem(&completed(Some(recovering))), None);
        assert_eq!(
            health_notes(recovering),
            [
                "route recovery in progress",
                "access timeout recovery in progress"
            ]
        );
        assert_eq!(
            problem(&completed(Some(4 << 8))),
            Some(Problem::IncorrectConfiguration)
        );
        assert_eq!(
            health_notes(4 << 8),
            ["incorrect configuration: no fabric partition"]
        );
    }

    #[test]
    fn a_failed_or_pending_registration() {
        let mut f = completed(None);
        f.status = status_name(23);
        assert_eq!(problem(&f), Some(Problem::RegistrationFailed));
        assert!(status_words(&f.status).starts_with("insufficient resources"));
        f.state = IN_PROGRESS.into();
        assert_eq!(problem(&f), None);
        assert!(is_pending(&f));
        f.state = NOT_SUPPORTED.into();
        assert!(!is_pending(&f) && problem(&f).is_none());
        for p in Problem::ALL {
            assert_eq!(Problem::from_name(p.name()), Some(p));
        }
    }
}
