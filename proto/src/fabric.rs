//! NVLink fabric registration as NVML reports it (`nvmlGpuFabricInfoV_t`):
//! the state names, the health mask, and what of it is a problem. Shared by
//! the poller, the engine, validation and the metrics so they agree on one
//! reading of the mask and one wording of its problems.
//!
//! The schema carries the state and status as names ([`GpuFabric`]'s
//! strings, on the wire and in JSON); [`Reading::of`] parses them once into
//! a [`FabricState`] where a consumer judges them.
//!
//! The numbers are NVML's (`nvml.h`, `NVML_GPU_FABRIC_STATE_*` and
//! `NVML_GPU_FABRIC_HEALTH_MASK_*`): every health field is a small unsigned
//! value at its shift, `0` meaning "not supported", `1` "true" (the condition
//! holds) and `2` "false"; the incorrect-configuration field is `1` for none
//! and `2..=5` for the kind of misconfiguration.
//!
//! ```
//! use gpuwatch_proto::GpuFabric;
//! use gpuwatch_proto::fabric::{FabricState, Problem, Reading};
//!
//! let f = GpuFabric { state: "completed".into(), status: "success".into(), health_mask: Some(0b10_0001), ..Default::default() };
//! let r = Reading::of(&f);
//! assert_eq!(r.state, FabricState::Completed);
//! assert_eq!(r.problem(), Some(Problem::DegradedBandwidth));
//! assert_eq!(r.problem_text(Problem::DegradedBandwidth), "degraded bandwidth");
//! assert!(Reading::of(&GpuFabric { state: "in_progress".into(), ..Default::default() }).is_pending());
//! ```

use crate::GpuFabric;
use std::fmt;

/// The status of a registration that succeeded.
const SUCCESS: &str = "success";

/// A registration's state (`nvmlGpuFabricState_t`). A name this build does
/// not know (a newer driver's state, or the poller's `unknown_<n>` for a
/// value past `completed`) is kept as it came in `Other`, never taken for a
/// known state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FabricState {
    /// No NVLink fabric on this GPU (PCIe boards, NVLink bridges without
    /// NVSwitch).
    NotSupported,
    /// The fabric manager has not started registering the GPU.
    NotStarted,
    /// Registration is under way.
    InProgress,
    /// Registration finished; the status says how.
    Completed,
    /// Any other name, as it came.
    Other(String),
}

impl FabricState {
    /// The known states, by NVML value (`NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`
    /// = 0 .. `NVML_GPU_FABRIC_STATE_COMPLETED` = 3).
    const BY_VALUE: [FabricState; 4] = [
        FabricState::NotSupported,
        FabricState::NotStarted,
        FabricState::InProgress,
        FabricState::Completed,
    ];

    /// The state of a schema name (an exact match; anything else is `Other`).
    pub fn parse(name: &str) -> FabricState {
        Self::BY_VALUE
            .into_iter()
            .find(|s| s.as_str() == name)
            .unwrap_or_else(|| FabricState::Other(name.to_owned()))
    }

    /// The state of an NVML value; a value past `completed` is
    /// `Other("unknown_<value>")`.
    pub fn from_nvml(raw: u8) -> FabricState {
        Self::BY_VALUE
            .into_iter()
            .nth(usize::from(raw))
            .unwrap_or_else(|| FabricState::Other(format!("unknown_{raw}")))
    }

    /// The NVML value of a known state.
    pub fn nvml_value(&self) -> Option<u8> {
        Self::BY_VALUE
            .iter()
            .position(|s| s == self)
            .and_then(|i| u8::try_from(i).ok())
    }

    /// The schema name (`not_supported`, `not_started`, `in_progress`,
    /// `completed`, or the `Other` name).
    pub fn as_str(&self) -> &str {
        match self {
            FabricState::NotSupported => "not_supported",
            FabricState::NotStarted => "not_started",
            FabricState::InProgress => "in_progress",
            FabricState::Completed => "completed",
            FabricState::Other(name) => name,
        }
    }

    /// Registration not finished (`not_started` or `in_progress`).
    pub fn is_pending(&self) -> bool {
        matches!(self, FabricState::NotStarted | FabricState::InProgress)
    }
}

impl fmt::Display for FabricState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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
fn health_notes(mask: u32) -> Vec<&'static str> {
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

    /// The name of a fault event with this problem.
    pub fn title(self) -> &'static str {
        match self {
            Problem::RegistrationFailed => "GPU fabric registration failed",
            Problem::NotRegistered => "GPU not registered with the NVLink fabric",
            Problem::RouteUnhealthy => "GPU fabric route unhealthy",
            Problem::DegradedBandwidth => "GPU fabric bandwidth degraded",
            Problem::IncorrectConfiguration => "GPU fabric misconfigured",
        }
    }
}

/// A GPU's fabric registration with its state parsed: what the engine,
/// validation and the poller judge and word. Built from the schema's
/// [`GpuFabric`] by [`Reading::of`], turned back into it by `From`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Where the registration is.
    pub state: FabricState,
    /// The registration's result once completed: `success`, or the NVML
    /// return name of its failure ([`status_name`]); empty before.
    pub status: String,
    /// The fabric clique (NVLink partition) the GPU belongs to.
    pub clique_id: u32,
    /// The fabric's cluster UUID (canonical form); empty when not reported.
    pub cluster_uuid: String,
    /// `healthMask` (absent from NVML's v1 call).
    pub health_mask: Option<u32>,
}

impl Reading {
    /// The reading of the schema's form.
    pub fn of(f: &GpuFabric) -> Reading {
        Reading {
            state: FabricState::parse(&f.state),
            status: f.status.clone(),
            clique_id: f.clique_id,
            cluster_uuid: f.cluster_uuid.clone(),
            health_mask: f.health_mask,
        }
    }

    /// Registration not finished (`not_started` or `in_progress`).
    pub fn is_pending(&self) -> bool {
        self.state.is_pending()
    }

    /// What is wrong with a registration that finished (failure status, or
    /// the health mask); `None` while it is pending (the caller decides
    /// whether pending is a problem yet), without a fabric, in a state this
    /// build does not know, or when it is fine.
    pub fn problem(&self) -> Option<Problem> {
        if self.state != FabricState::Completed {
            return None;
        }
        if self.status != SUCCESS {
            return Some(Problem::RegistrationFailed);
        }
        let mask = self.health_mask?;
        if field(mask, ROUTE_UNHEALTHY_SHIFT, 3) == TRUE {
            Some(Problem::RouteUnhealthy)
        } else if field(mask, DEGRADED_BW_SHIFT, 3) == TRUE {
            Some(Problem::DegradedBandwidth)
        } else {
            incorrect_configuration(mask).map(|_| Problem::IncorrectConfiguration)
        }
    }

    /// What the health mask says, in words (only the fields that hold);
    /// empty without a mask.
    pub fn health_notes(&self) -> Vec<&'static str> {
        self.health_mask.map(health_notes).unwrap_or_default()
    }

    /// The problem's detail in words, as the fault event and the validation
    /// check both say it: a failed registration's status ("insufficient
    /// resources (...)"), an unfinished one's state ("in progress"), an
    /// unhealthy one's health notes ("route unhealthy, degraded
    /// bandwidth"; "unhealthy" should the mask name none).
    pub fn problem_text(&self, p: Problem) -> String {
        match p {
            Problem::RegistrationFailed => status_words(&self.status),
            Problem::NotRegistered => self.state.as_str().replace('_', " "),
            Problem::RouteUnhealthy
            | Problem::DegradedBandwidth
            | Problem::IncorrectConfiguration => {
                let notes = self.health_notes();
                if notes.is_empty() {
                    "unhealthy".into()
                } else {
                    notes.join(", ")
                }
            }
        }
    }
}

impl From<Reading> for GpuFabric {
    fn from(r: Reading) -> GpuFabric {
        GpuFabric {
            state: r.state.as_str().to_owned(),
            status: r.status,
            clique_id: r.clique_id,
            cluster_uuid: r.cluster_uuid,
            health_mask: r.health_mask,
        }
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
fn status_words(status: &str) -> String {
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

    fn completed(mask: Option<u32>) -> Reading {
        Reading {
            state: FabricState::Completed,
            status: SUCCESS.into(),
            clique_id: 0,
            cluster_uuid: String::new(),
            health_mask: mask,
        }
    }

    #[test]
    fn state_names_parse_exactly_and_unknown_ones_are_kept() {
        let table = [
            ("not_supported", FabricState::NotSupported),
            ("not_started", FabricState::NotStarted),
            ("in_progress", FabricState::InProgress),
            ("completed", FabricState::Completed),
            // The poller's name for an NVML value past `completed`.
            ("unknown_9", FabricState::Other("unknown_9".into())),
            // Near misses are not guessed.
            ("Completed", FabricState::Other("Completed".into())),
            ("completed ", FabricState::Other("completed ".into())),
            ("in-progress", FabricState::Other("in-progress".into())),
            ("", FabricState::Other(String::new())),
        ];
        for (name, state) in table {
            let parsed = FabricState::parse(name);
            assert_eq!(parsed, state, "{name:?}");
            assert_eq!(parsed.as_str(), name, "{name:?} is written back as it came");
            assert_eq!(parsed.to_string(), name);
        }
        let pending: Vec<_> = [
            "not_supported",
            "not_started",
            "in_progress",
            "completed",
            "x",
        ]
        .into_iter()
        .filter(|n| FabricState::parse(n).is_pending())
        .collect();
        assert_eq!(pending, ["not_started", "in_progress"]);
    }

    #[test]
    fn every_state_round_trips_through_its_nvml_value() {
        let table = [
            (0, "not_supported"),
            (1, "not_started"),
            (2, "in_progress"),
            (3, "completed"),
            (4, "unknown_4"),
            (255, "unknown_255"),
        ];
        for (raw, name) in table {
            let s = FabricState::from_nvml(raw);
            assert_eq!(s.as_str(), name);
            assert_eq!(FabricState::parse(name), s);
            let known = raw <= 3;
            assert_eq!(s.nvml_value(), known.then_some(raw), "{name}");
        }
    }

    #[test]
    fn a_reading_round_trips_through_the_schema_form() {
        let wire = GpuFabric {
            state: "unknown_7".into(),
            status: "timeout".into(),
            clique_id: 3,
            cluster_uuid: "6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11".into(),
            health_mask: Some(0x1AA),
        };
        let r = Reading::of(&wire);
        assert_eq!(r.state, FabricState::Other("unknown_7".into()));
        assert_eq!(r.problem(), None, "an unknown state is no problem by guess");
        assert_eq!(GpuFabric::from(r), wire);
    }

    #[test]
    fn health_mask_fields_are_read_at_their_shifts() {
        // Every field "false" (2): healthy.
        let healthy = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8;
        assert_eq!(completed(Some(healthy)).problem(), None);
        assert!(health_notes(healthy).is_empty());
        assert_eq!(completed(Some(0)).problem(), None, "nothing supported");
        assert_eq!(
            completed(Some(healthy & !0b11 | 1)).problem(),
            Some(Problem::DegradedBandwidth)
        );
        let unhealthy = healthy & !(0b11 << 4) | 1 << 4;
        assert_eq!(
            completed(Some(unhealthy & !0b11 | 1)).problem(),
            Some(Problem::RouteUnhealthy),
            "an unhealthy route outranks degraded bandwidth"
        );
        // Recoveries in progress are noted, not problems by themselves.
        let recovering = 1 << 2 | 1 << 6;
        assert_eq!(completed(Some(recovering)).problem(), None);
        assert_eq!(
            health_notes(recovering),
            [
                "route recovery in progress",
                "access timeout recovery in progress"
            ]
        );
        assert_eq!(
            completed(Some(4 << 8)).problem(),
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
        assert_eq!(f.problem(), Some(Problem::RegistrationFailed));
        f.state = FabricState::InProgress;
        assert_eq!(f.problem(), None);
        assert!(f.is_pending());
        f.state = FabricState::NotSupported;
        assert!(!f.is_pending() && f.problem().is_none());
        for p in Problem::ALL {
            assert_eq!(Problem::from_name(p.name()), Some(p));
        }
    }

    #[test]
    fn each_problem_is_worded_from_its_reading() {
        let failed = |status: &str| Reading {
            status: status.into(),
            ..completed(None)
        };
        let pending = |state| Reading {
            state,
            status: String::new(),
            ..completed(None)
        };
        let table = [
            (
                failed("insufficient_resources"),
                Problem::RegistrationFailed,
                "insufficient resources (the fabric manager could not set up the GPU's routes)",
            ),
            (failed("timeout"), Problem::RegistrationFailed, "timed out"),
            (
                failed("unknown"),
                Problem::RegistrationFailed,
                "an unknown error",
            ),
            (
                failed("not_supported"),
                Problem::RegistrationFailed,
                "not supported by this fabric",
            ),
            (
                failed("gpu_is_lost"),
                Problem::RegistrationFailed,
                "gpu is lost",
            ),
            (
                pending(FabricState::NotStarted),
                Problem::NotRegistered,
                "not started",
            ),
            (
                pending(FabricState::InProgress),
                Problem::NotRegistered,
                "in progress",
            ),
            (
                completed(Some(1 | 1 << 4 | 1 << 6)),
                Problem::RouteUnhealthy,
                "degraded bandwidth, route unhealthy, access timeout recovery in progress",
            ),
            (
                completed(Some(1)),
                Problem::DegradedBandwidth,
                "degraded bandwidth",
            ),
            (
                completed(Some(5 << 8)),
                Problem::IncorrectConfiguration,
                "incorrect configuration: insufficient NVLinks",
            ),
            (completed(None), Problem::RouteUnhealthy, "unhealthy"),
        ];
        for (reading, p, text) in table {
            assert_eq!(reading.problem_text(p), text, "{reading:?}");
        }
    }
}
