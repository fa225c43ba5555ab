//! Short lowercase names of enum values, as used in JSON, metric attributes and CLI output.

use crate::{Action, FaultKind, InputState, PodRole, RecoveryAction, Severity, Source, Verdict};

/// A protobuf enum with a lowercase short name (`ACTION_RESET_GPU` → `reset_gpu`).
pub trait ShortName: Sized + Copy + 'static {
    /// Every value, including `Unspecified`.
    const VALUES: &'static [Self];
    /// The lowercase short name.
    fn short_name(self) -> &'static str;
    /// Parses a short name (also accepts the full proto name).
    fn from_short_name(name: &str) -> Option<Self> {
        Self::VALUES
            .iter()
            .copied()
            .find(|v| v.short_name().eq_ignore_ascii_case(name))
            .or_else(|| Self::from_proto_name(name))
    }
    /// Parses the full proto name (`ACTION_RESET_GPU`).
    fn from_proto_name(name: &str) -> Option<Self>;
}

macro_rules! short_names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl ShortName for $ty {
            const VALUES: &'static [Self] = &[$($ty::$variant),+];
            fn short_name(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
            fn from_proto_name(name: &str) -> Option<Self> {
                $ty::from_str_name(name)
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.short_name())
            }
        }
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$ty as ShortName>::from_short_name(s).ok_or_else(|| {
                    let names: Vec<&str> = Self::VALUES.iter().map(|v| v.short_name()).collect();
                    format!("unknown {} {s:?}; expected one of: {}", stringify!($ty), names.join(", "))
                })
            }
        }
    };
}

short_names!(FaultKind {
    Unspecified => "unspecified",
    Xid => "xid",
    Sxid => "sxid",
    FallenOffBus => "fallen_off_bus",
    PcieAer => "pcie_aer",
    Nvlink => "nvlink",
    Ecc => "ecc",
    PageRetirement => "page_retirement",
    RowRemap => "row_remap",
    Thermal => "thermal",
    MachineCheck => "machine_check",
    DriverError => "driver_error",
    GpuLost => "gpu_lost",
    RecoveryAction => "recovery_action",
    PcieLink => "pcie_link",
    Validation => "validation",
    Peermem => "peermem",
    Fabric => "fabric",
    Nic => "nic",
});

short_names!(Action {
    Unspecified => "unspecified",
    Ignore => "ignore",
    RestartApp => "restart_app",
    Investigate => "investigate",
    ResetGpu => "reset_gpu",
    RebootNode => "reboot_node",
    InspectHardware => "inspect_hardware",
});

short_names!(Severity {
    Unspecified => "unspecified",
    Info => "info",
    Warning => "warning",
    Error => "error",
    Critical => "critical",
});

short_names!(Source {
    Unspecified => "unspecified",
    Kmsg => "kmsg",
    LogFile => "log_file",
    NvmlEvent => "nvml_event",
    NvmlPoll => "nvml_poll",
    Validation => "validation",
    Sysfs => "sysfs",
});

short_names!(Verdict {
    Unspecified => "unspecified",
    Healthy => "healthy",
    Degraded => "degraded",
    Unhealthy => "unhealthy",
    Unknown => "unknown",
});

short_names!(RecoveryAction {
    Unspecified => "unspecified",
    None => "none",
    GpuReset => "gpu_reset",
    NodeReboot => "node_reboot",
    DrainP2p => "drain_p2p",
    DrainAndReset => "drain_and_reset",
    RecoverImexDomain => "recover_imex_domain",
    BusReset => "bus_reset",
    SystemReboot => "system_reboot",
    PfFlr => "pf_flr",
});

short_names!(InputState {
    NotReported => "not_reported",
    Up => "up",
    Down => "down",
});

short_names!(PodRole {
    Unspecified => "unspecified",
    Caused => "caused",
    Affected => "affected",
});
