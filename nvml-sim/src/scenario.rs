//! The scenario file: simulated GPUs, their readings, and timed injections.
//!
//! The format is documented in the crate docs and in `nvml-sim/README.md`.

use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::Path;

/// A scenario could not be read or is invalid.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The scenario file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Read {
        /// The path as given.
        path: String,
        /// What `std::fs::read_to_string` failed with.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for the scenario schema (unknown key, wrong type, ...).
    #[error("scenario {path} does not parse: {source}")]
    Parse {
        /// The file (or `<string>`).
        path: String,
        /// The TOML error (names the key and the line).
        #[source]
        source: toml::de::Error,
    },
    /// The scenario parsed but is inconsistent; every problem is listed.
    #[error("scenario {path} is invalid: {}", problems.join("; "))]
    Invalid {
        /// The file (or `<string>`).
        path: String,
        /// Each problem, naming the key.
        problems: Vec<String>,
    },
}

/// Readings a GPU can be told not to support (`not_supported`) or to fail with
/// `NVML_ERROR_UNKNOWN` (`failing`). Each name covers the NVML calls listed.
pub const READINGS: &[&str] = &[
    "temperature",           // nvmlDeviceGetTemperature
    "temperature_threshold", // nvmlDeviceGetTemperatureThreshold
    "power",                 // nvmlDeviceGetPowerUsage
    "power_limit",           // nvmlDeviceGetEnforcedPowerLimit
    "clock_event_reasons",   // nvmlDeviceGetCurrentClocks{Event,Throttle}Reasons
    "ecc",                   // nvmlDeviceGetTotalEccErrors
    "retired_pages",         // nvmlDeviceGetRetiredPages{,_v2}, ...PendingStatus
    "remapped_rows",         // nvmlDeviceGetRemappedRows, fields 142..=145
    "pcie_link",             // nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width}
    "pcie_replay_counter",   // nvmlDeviceGetPcieReplayCounter
    "nvlink",                // nvmlDeviceGetNvLinkState, ...ErrorCounter
    "recovery_action",       // field 230 NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    "persistence_mode",      // nvmlDeviceGetPersistenceMode
    "fabric",                // nvmlDeviceGetGpuFabricInfo{,V}
    "mig",    // nvmlDeviceGetMigMode, ...MaxMigDeviceCount, ...MigDeviceHandleByIndex
    "memory", // nvmlDeviceGetMemoryInfo_v2
    "events", // nvmlDeviceGetSupportedEventTypes, RegisterEvents
    "energy", // nvmlDeviceGetTotalEnergyConsumption (NOT_SUPPORTED before Volta)
];

/// The exported NVML functions a `[[hang]]` may name (every export except
/// `nvmlErrorString`, which only returns a static string). `"*"` names them all.
pub const CALLS: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
];

/// NVML error names a scenario may use (`init.error`, `init.count_error`, `hang.error`).
pub const ERROR_NAMES: &[(&str, u32)] = &[
    ("uninitialized", 1),
    ("invalid_argument", 2),
    ("not_supported", 3),
    ("no_permission", 4),
    ("insufficient_power", 8),
    ("driver_not_loaded", 9),
    ("timeout", 10),
    ("irq_issue", 11),
    ("library_not_found", 12),
    ("function_not_found", 13),
    ("corrupted_inforom", 14),
    ("gpu_is_lost", 15),
    ("reset_required", 16),
    ("operating_system", 17),
    ("lib_rm_version_mismatch", 18),
    ("in_use", 19),
    ("memory", 20),
    ("no_data", 21),
    ("insufficient_resources", 23),
    ("not_ready", 27),
    ("invalid_state", 29),
    ("unknown", 999),
];

/// The NVML return code for an error name of [`ERROR_NAMES`].
pub fn error_code(name: &str) -> Option<u32> {
    ERROR_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, code)| *code)
}

macro_rules! state_fields {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr ),* $(,)?) => {
        /// Every reading of one simulated GPU (what NVML reports about it).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct GpuState {
            $( $(#[$doc])* pub $name: $ty, )*
            /// The GPU returns `NVML_ERROR_GPU_IS_LOST` to every call.
            pub lost: bool,
            /// The GPU is gone from enumeration (device count drops).
            pub removed: bool,
        }

        impl Default for GpuState {
            fn default() -> GpuState {
                GpuState { $( $name: $default, )* lost: false, removed: false }
            }
        }

        /// One `[[gpu]]` table: identity plus initial readings.
        #[derive(Debug, Clone, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct GpuSpec {
            /// NVML index (default: position in the file).
            pub index: Option<u32>,
            /// UUID, `GPU-` followed by the 36-character UUID.
            pub uuid: String,
            /// PCI bus id, as NVML prints it (`00000000:3B:00.0`) or short (`3b:00.0`).
            pub pci: String,
            /// What `nvmlDeviceGetName` answers (default `NVIDIA H100 80GB HBM3`;
            /// at most 95 bytes, NVML's buffer).
            #[serde(default = "default_name")]
            pub name: String,
            /// What `nvmlDeviceGetSerial` answers: the board's serial number,
            /// at most 29 bytes (nvml.h: `NVML_DEVICE_SERIAL_BUFFER_SIZE` 30).
            /// Empty (the default): `NVML_ERROR_NOT_SUPPORTED`, as NVML
            /// answers on boards without one in their infoROM (nvml.h: "For
            /// all products with an infoROM").
            #[serde(default)]
            pub serial: String,
            /// What `nvmlDeviceGetVbiosVersion` answers, at most 31 bytes
            /// (nvml.h: `NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE` 32). nvml.h
            /// documents the call "For all products": it never answers
            /// NOT_SUPPORTED. Default `96.00.99.00.01`, in the dotted
            /// hexadecimal form `nvidia-smi` prints (not a particular board's).
            #[serde(default = "default_vbios")]
            pub vbios: String,
            $( $(#[$doc])* pub $name: Option<$ty>, )*
        }

        impl GpuSpec {
            /// The initial state: the spec's readings over the defaults.
            pub fn initial_state(&self) -> GpuState {
                let mut s = GpuState::default();
                $( if let Some(v) = &self.$name { s.$name = v.clone(); } )*
                s
            }
        }

        /// One `[[inject]]` table: at `at_ms` after the first `nvmlInit`, change
        /// some readings of GPU `gpu` and/or deliver an event.
        #[derive(Debug, Clone, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Injection {
            /// Milliseconds after the first `nvmlInit` call.
            pub at_ms: u64,
            /// NVML index of the GPU (as configured in its `[[gpu]]` table).
            pub gpu: u32,
            /// Deliver an XID critical-error event with this code.
            pub xid: Option<u64>,
            /// Deliver an ECC event: `"sbe"` (single-bit) or `"dbe"` (double-bit).
            pub ecc_event: Option<String>,
            /// `true`: every call on this GPU returns `NVML_ERROR_GPU_IS_LOST`
            /// (enumeration still counts it); `false`: the GPU answers again.
            pub lost: Option<bool>,
            /// `true`: the GPU disappears from enumeration (device count drops);
            /// `false`: it is back.
            pub removed: Option<bool>,
            /// Free text shown in the timeline (not used otherwise).
            pub note: Option<String>,
            $( $(#[$doc])* pub $name: Option<$ty>, )*
        }

        impl Injection {
            /// Applies the state changes to `s`.
            pub fn apply(&self, s: &mut GpuState) {
                $( if let Some(v) = &self.$name { s.$name = v.clone(); } )*
                if let Some(v) = self.lost { s.lost = v; }
                if let Some(v) = self.removed { s.removed = v; }
            }
        }
    };
}

state_fields! {
    /// GPU core temperature, °C.
    temperature_c: u32 = 35,
    /// Slowdown threshold, °C.
    slowdown_temperature_c: u32 = 87,
    /// Shutdown threshold, °C.
    shutdown_temperature_c: u32 = 92,
    /// Power draw, mW.
    power_mw: u32 = 72_000,
    /// Enforced power limit, mW.
    power_limit_mw: u32 = 700_000,
    /// `nvmlClocksEventReasons` bitmask (1 = GPU idle, 0x20 SW thermal, 0x40 HW
    /// thermal, 0x80 HW power brake). A change delivers a clock event.
    clock_event_reasons: u64 = 1,
    /// Volatile corrected ECC errors.
    ecc_volatile_corrected: u64 = 0,
    /// Volatile uncorrected ECC errors.
    ecc_volatile_uncorrected: u64 = 0,
    /// Aggregate corrected ECC errors.
    ecc_aggregate_corrected: u64 = 0,
    /// Aggregate uncorrected ECC errors.
    ecc_aggregate_uncorrected: u64 = 0,
    /// Pages retired for multiple single-bit errors.
    retired_pages_sbe: u32 = 0,
    /// Pages retired for a double-bit error.
    retired_pages_dbe: u32 = 0,
    /// A page retirement waits for a reboot.
    retired_pages_pending: bool = false,
    /// Rows remapped for correctable errors.
    remapped_rows_correctable: u32 = 0,
    /// Rows remapped for uncorrectable errors.
    remapped_rows_uncorrectable: u32 = 0,
    /// A row remap waits for a GPU reset.
    remapped_rows_pending: bool = false,
    /// A row remap failed.
    remapped_rows_failure: bool = false,
    /// Current PCIe link generation.
    pcie_link_gen: u32 = 5,
    /// Maximum PCIe link generation.
    pcie_link_gen_max: u32 = 5,
    /// Current PCIe link width (lanes).
    pcie_link_width: u32 = 16,
    /// Maximum PCIe link width (lanes).
    pcie_link_width_max: u32 = 16,
    /// PCIe replay counter.
    pcie_replay_counter: u32 = 0,
    /// Number of NVLink links (0..n exist).
    nvlink_count: u32 = 18,
    /// Links that are down (inactive).
    nvlink_down: Vec<u32> = Vec::new(),
    /// NVLink DL replay errors (reported on every link).
    nvlink_replay_errors: u64 = 0,
    /// NVLink DL recovery errors (reported on every link).
    nvlink_recovery_errors: u64 = 0,
    /// NVLink CRC flit errors (reported on every link).
    nvlink_crc_flit_errors: u64 = 0,
    /// NVLink CRC data errors (reported on every link).
    nvlink_crc_data_errors: u64 = 0,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` value (0 none, 1 GPU reset, 2 node
    /// reboot, 3 drain P2P, 4 drain and reset).
    recovery_action: u32 = 0,
    /// What `nvmlDeviceGetPersistenceMode` answers (enabled by default, as
    /// on a GPU node).
    persistence_mode: bool = true,
    /// NVLink fabric registration (`nvmlDeviceGetGpuFabricInfo{,V}`); the
    /// `[gpu.fabric]` / `[inject.fabric]` table. An injection's table replaces
    /// the GPU's whole fabric state (fields it leaves out take their defaults).
    fabric: FabricSpec = FabricSpec::default(),
    /// What `nvmlDeviceGetTotalEnergyConsumption` counts from (mJ) at time
    /// zero, or from the injection that sets it (a driver reload restarts
    /// the count at 0; nvml.h: "energy consumption ... since the driver was
    /// last reloaded"). The count then grows by `power_mw` × elapsed time,
    /// as the GPU's energy counter integrates its power draw.
    energy_mj: u64 = 0,
    /// Total framebuffer memory, MiB (`nvmlDeviceGetMemoryInfo_v2`; an H100
    /// SXM 80 GB reports 81559).
    memory_mib: u64 = 81_559,
    /// MIG mode and the MIG devices (`[gpu.mig]` / `[inject.mig]`: an
    /// injection replaces the whole MIG state, as reconfiguring MIG does).
    mig: MigState = MigState::default(),
    /// Readings that return `NVML_ERROR_NOT_SUPPORTED` (names in [`READINGS`]).
    not_supported: Vec<String> = Vec::new(),
    /// Readings that return `NVML_ERROR_UNKNOWN` (names in [`READINGS`]).
    failing: Vec<String> = Vec::new(),
}

/// A GPU's MIG configuration: MIG mode, and the MIG devices (a GPU instance
/// with one compute instance each) NVML enumerates while it is on. The
/// default is a GPU with MIG off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MigState {
    /// `nvmlDeviceGetMigMode`'s current mode.
    pub enabled: bool,
    /// `nvmlDeviceGetMigMode`'s pending mode (what the next GPU reset
    /// applies, after `nvidia-smi -mig 1` on a busy GPU); absent: the
    /// current mode, no change pending.
    pub pending: Option<bool>,
    /// The MIG devices, in handle-index order (`[[gpu.mig.devices]]`).
    pub devices: Vec<MigDeviceSpec>,
}

/// One MIG device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDeviceSpec {
    /// `MIG-` followed by a 36-character UUID.
    pub uuid: String,
    /// `nvmlDeviceGetGpuInstanceId`.
    pub gpu_instance: u32,
    /// `nvmlDeviceGetComputeInstanceId`.
    #[serde(default)]
    pub compute_instance: u32,
    /// The profile as `nvidia-smi mig -lgi` and the device plugin name it:
    /// `"1g.10gb"` (compute instance the size of its GPU instance) or
    /// `"1c.2g.20gb"`. `nvmlDeviceGetAttributes_v2` answers its slice
    /// counts and memory.
    pub profile: String,
    /// The device's memory in MiB (`memorySizeMB`); absent: derived from the
    /// profile (see [`MigDeviceSpec::attributes`]).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Every call on this MIG device's handle answers `NVML_ERROR_UNKNOWN`
    /// (the GPU and its other MIG devices answer).
    #[serde(default)]
    pub failing: bool,
}

/// What `nvmlDeviceGetAttributes_v2` answers for a MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigAttributes {
    /// `gpuInstanceSliceCount`.
    pub gpu_slices: u32,
    /// `computeInstanceSliceCount`.
    pub compute_slices: u32,
    /// `memorySizeMB`.
    pub memory_mib: u64,
}

/// Memory slices of a MIG-capable GPU: A100, H100 and H200 split their
/// memory in eighths (NVIDIA's MIG user guide, "Supported MIG Profiles").
const MEMORY_SLICES: u64 = 8;

/// A MIG profile name: (compute slices, GPU slices, memory in GB).
fn parse_profile(p: &str) -> Option<(u32, u32, u64)> {
    let gb: u64 = p.strip_suffix("gb")?.rsplit_once('.')?.1.parse().ok()?;
    let mut parts = p.split('.');
    let (c, g) = match (parts.next()?, parts.next()?, parts.next()) {
        (c, g, Some(_)) => (
            c.strip_suffix('c')?.parse().ok()?,
            g.strip_suffix('g')?.parse().ok()?,
        ),
        (g, _, None) => {
            let g: u32 = g.strip_suffix('g')?.parse().ok()?;
            (g, g)
        }
    };
    (parts.next().is_none() && (1..=7).contains(&g) && (1..=g).contains(&c) && gb > 0)
        .then_some((c, g, gb))
}

impl MigDeviceSpec {
    /// The slice counts and memory of this device on a GPU of `gpu_mib`
    /// MiB. Without `memory_mib`, the memory is the fewest eighths of the
    /// GPU's memory that the device plugin names `<gb>gb` (it rounds the
    /// eighths up, then to the nearest GB of the GPU's total: NVIDIA
    /// go-nvlib `getMigMemorySizeGB`), so a 1g.10gb device of an 80 GB H100
    /// has one eighth.
    pub fn attributes(&self, gpu_mib: u64) -> Option<MigAttributes> {
        let (c, g, gb) = parse_profile(&self.profile)?;
        let memory_mib = match self.memory_mib {
            Some(m) => m,
            None => {
                let total_gb = gpu_mib.div_ceil(1024);
                let eighths = (1..=MEMORY_SLICES)
                    .find(|k| (k * total_gb * 2 + MEMORY_SLICES) / (2 * MEMORY_SLICES) == gb)?;
                eighths * gpu_mib / MEMORY_SLICES
            }
        };
        Some(MigAttributes {
            gpu_slices: g,
            compute_slices: c,
            memory_mib,
        })
    }
}

/// MIG devices per GPU at most (an H100 or H200 makes up to 7).
pub(crate) const MAX_MIG_DEVICES: usize = 7;

impl MigState {
    /// `nvmlDeviceGetMigMode`'s pending mode.
    pub fn pending_mode(&self) -> bool {
        self.pending.unwrap_or(self.enabled)
    }

    fn problems(&self, key: &str, gpu_mib: u64, p: &mut Vec<String>) {
        if self.devices.len() > MAX_MIG_DEVICES {
            p.push(format!(
                "{key}.mig.devices: at most {MAX_MIG_DEVICES}, got {}",
                self.devices.len()
            ));
        }
        if !self.enabled && !self.devices.is_empty() {
            p.push(format!(
                "{key}.mig.devices: MIG devices need enabled = true"
            ));
        }
        for (i, d) in self.devices.iter().enumerate() {
            let earlier = &self.devices[..i];
            if earlier.iter().any(|e| e.uuid == d.uuid) {
                p.push(format!("{key}.mig.devices: duplicate uuid {:?}", d.uuid));
            }
            if earlier.iter().any(|e| {
                (e.gpu_instance, e.compute_instance) == (d.gpu_instance, d.compute_instance)
            }) {
                p.push(format!(
                    "{key}.mig.devices: duplicate GPU instance {} compute instance {}",
                    d.gpu_instance, d.compute_instance
                ));
            }
            let as_gpu = d.uuid.strip_prefix("MIG-").map(|r| format!("GPU-{r}"));
            if !as_gpu.is_some_and(|u| valid_uuid(&u)) {
                p.push(format!(
                    "{key}.mig.devices: uuid expected MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got {:?}",
                    d.uuid
                ));
            }
            if parse_profile(&d.profile).is_none() {
                p.push(format!(
                    "{key}.mig.devices: profile expected <g>g.<n>gb or <c>c.<g>g.<n>gb (1 <= c <= g <= 7), got {:?}",
                    d.profile
                ));
            } else if d.attributes(gpu_mib).is_none() {
                p.push(format!(
                    "{key}.mig.devices: profile {:?} is no number of eighths of the GPU's {gpu_mib} MiB; set memory_mib",
                    d.profile
                ));
            }
        }
    }
}

/// The fabric states, by NVML value (`NVML_GPU_FABRIC_STATE_*`).
pub const FABRIC_STATES: [&str; 4] = ["not_supported", "not_started", "in_progress", "completed"];

/// A GPU's NVLink fabric registration as NVML reports it
/// (`nvmlGpuFabricInfo_v3_t`). The default is a GPU without a fabric
/// (`not_supported`), as a PCIe board or a board without NVSwitches reports.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FabricSpec {
    /// `not_supported` | `not_started` | `in_progress` | `completed`.
    pub state: String,
    /// The registration's result: `success`, or an NVML error name of
    /// [`ERROR_NAMES`] (what the fabric manager answered).
    pub status: String,
    /// The fabric clique (NVLink partition) id.
    pub clique_id: u32,
    /// The cluster UUID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`); empty: all zero.
    pub cluster_uuid: String,
    /// `healthMask` (`NVML_GPU_FABRIC_HEALTH_MASK_*`: per field 0 not
    /// supported, 1 true, 2 false; degraded bandwidth at bit 0, route
    /// recovery at 2, route unhealthy at 4, access timeout recovery at 6,
    /// incorrect configuration at 8).
    pub health_mask: u32,
    /// `healthSummary` of the v3 struct (0 not supported, 1 healthy,
    /// 2 unhealthy, 3 limited capacity).
    pub health_summary: u8,
}

impl Default for FabricSpec {
    fn default() -> FabricSpec {
        FabricSpec {
            state: "not_supported".into(),
            status: "success".into(),
            clique_id: 0,
            cluster_uuid: String::new(),
            health_mask: 0,
            health_summary: 0,
        }
    }
}

impl FabricSpec {
    /// The NVML state value (`nvmlGpuFabricState_t`).
    pub fn state_value(&self) -> u8 {
        FABRIC_STATES
            .iter()
            .position(|s| *s == self.state)
            .and_then(|i| u8::try_from(i).ok())
            .unwrap_or(0)
    }

    /// The NVML return code of `status`.
    pub fn status_code(&self) -> u32 {
        if self.status == "success" {
            0
        } else {
            error_code(&self.status).unwrap_or(999)
        }
    }

    /// The cluster UUID's 16 bytes (all zero when empty).
    pub fn cluster_uuid_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        let hex: String = self.cluster_uuid.chars().filter(|c| *c != '-').collect();
        for (i, b) in out.iter_mut().enumerate() {
            *b = hex
                .get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
        }
        out
    }

    fn problems(&self, key: &str, p: &mut Vec<String>) {
        if !FABRIC_STATES.contains(&self.state.as_str()) {
            p.push(format!(
                "{key}.fabric.state: expected one of {}, got {:?}",
                FABRIC_STATES.join(", "),
                self.state
            ));
        }
        if self.status != "success" && error_code(&self.status).is_none() {
            p.push(format!(
                "{key}.fabric.status: expected \"success\" or an NVML error name, got {:?}",
                self.status
            ));
        }
        if !self.cluster_uuid.is_empty() && !valid_uuid(&format!("GPU-{}", self.cluster_uuid)) {
            p.push(format!(
                "{key}.fabric.cluster_uuid: expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got {:?}",
                self.cluster_uuid
            ));
        }
        if self.health_summary > 3 {
            p.push(format!("{key}.fabric.health_summary: expected 0 to 3"));
        }
    }
}

fn default_name() -> String {
    "NVIDIA H100 80GB HBM3".to_string()
}

fn default_vbios() -> String {
    "96.00.99.00.01".to_string()
}

fn default_driver_version() -> String {
    "570.133.20".to_string()
}

/// `[driver]`: driver version and initialisation / enumeration failures.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverSpec {
    /// `nvmlSystemGetDriverVersion`.
    #[serde(default = "default_driver_version")]
    pub version: String,
    /// `nvmlInit_v2` / `nvmlInitWithFlags` fail with this error (a name of
    /// [`ERROR_NAMES`], e.g. `"driver_not_loaded"`).
    pub init_error: Option<String>,
    /// Only the first N init calls fail (absent: see `init_fail_until_ms`, else always).
    pub init_fail_count: Option<u32>,
    /// Init calls fail until this many ms after the first init call.
    pub init_fail_until_ms: Option<u64>,
    /// `nvmlDeviceGetCount_v2` fails with this error.
    pub count_error: Option<String>,
    /// Only the first N successful-init count calls fail (absent: always).
    pub count_fail_count: Option<u32>,
}

impl Default for DriverSpec {
    fn default() -> DriverSpec {
        DriverSpec {
            version: default_driver_version(),
            init_error: None,
            init_fail_count: None,
            init_fail_until_ms: None,
            count_error: None,
            count_fail_count: None,
        }
    }
}

/// One `[[hang]]` table: from a given time (and call count) on, calls to one
/// NVML function (or to every function) block inside the library, the way a
/// wedged driver leaves a caller stuck in an ioctl.
///
/// The hang starts with the first matching call made at or after `at_ms` once
/// `after_calls` matching calls have entered before it. Every matching call
/// that enters while the hang is on (from its start for `duration_ms`, or
/// forever) blocks until the hang ends, then answers normally — or with
/// `error` when that is set. A hang happens once; more `[[hang]]` tables make
/// it recur.
///
/// Where the behaviour comes from: NVML has no timeout or cancellation on its
/// calls, and a wedged driver leaves callers blocked in it — e.g. `nvmlInit`
/// hanging after hours on H200 with driver 570.x, which NVIDIA confirmed as a
/// driver bug (<https://github.com/NVIDIA/go-nvml/issues/152>). Whether other
/// calls block too depends on where the driver is stuck, so a hang names one
/// function or `"*"` (all of them).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HangSpec {
    /// The NVML function (a name of [`CALLS`]) or `"*"` for every one.
    pub call: String,
    /// Not before this many ms after the first `nvmlInit` call.
    #[serde(default)]
    pub at_ms: u64,
    /// Not before this many matching calls entered (they answer normally).
    #[serde(default)]
    pub after_calls: u32,
    /// How long the hang lasts from its start, in ms; absent: forever.
    pub duration_ms: Option<u64>,
    /// After blocking, the call fails with this error (a name of
    /// [`ERROR_NAMES`]) instead of answering.
    pub error: Option<String>,
    /// Why the hang is in the scenario; the simulator ignores it.
    #[serde(default)]
    pub note: String,
}

/// A scenario file: the driver, the GPUs, and what happens to them when
/// (`[[inject]]`, `[[hang]]`); `nvml-sim/README.md` has the format.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// One line that says what the scenario shows.
    #[serde(default)]
    pub description: String,
    /// `[driver]`: its version and when initialisation or enumeration fails
    /// (default: a driver that always answers).
    #[serde(default)]
    pub driver: DriverSpec,
    /// The GPUs, in NVML enumeration order.
    #[serde(default)]
    pub gpu: Vec<GpuSpec>,
    /// Timed changes, applied in `at_ms` order (file order for equal times).
    #[serde(default)]
    pub inject: Vec<Injection>,
    /// Calls that block (see [`HangSpec`]).
    #[serde(default)]
    pub hang: Vec<HangSpec>,
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Scenario::parse(&text, &path.display().to_string())
    }

    /// Parses and validates scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let mut s: Scenario = toml::from_str(text).map_err(|source| ScenarioError::Parse {
            path: origin.to_string(),
            source,
        })?;
        for (pos, g) in s.gpu.iter_mut().enumerate() {
            if g.index.is_none() {
                g.index = u32::try_from(pos).ok();
            }
        }
        let problems = s.problems();
        if !problems.is_empty() {
            return Err(ScenarioError::Invalid {
                path: origin.to_string(),
                problems,
            });
        }
        // Stable sort: equal times keep file order.
        s.inject.sort_by_key(|i| i.at_ms);
        Ok(s)
    }

    /// Every consistency problem, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (key, name) in [
            ("driver.init_error", &self.driver.init_error),
            ("driver.count_error", &self.driver.count_error),
        ] {
            if let Some(n) = name
                && error_code(n).is_none()
            {
                p.push(format!(
                    "{key}: unknown NVML error {n:?} (expected one of {})",
                    ERROR_NAMES
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        let mut indexes = BTreeSet::new();
        let mut uuids = BTreeSet::new();
        let mut pcis = BTreeSet::new();
        for (pos, g) in self.gpu.iter().enumerate() {
            let key = format!("gpu[{pos}]");
            if let Some(i) = g.index
                && !indexes.insert(i)
            {
                p.push(format!("{key}.index: index {i} is used twice"));
            }
            if !valid_uuid(&g.uuid) {
                p.push(format!(
                    "{key}.uuid: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got {:?}",
                    g.uuid
                ));
            } else if !uuids.insert(g.uuid.to_ascii_lowercase()) {
                p.push(format!("{key}.uuid: {} is used twice", g.uuid));
            }
            match nvml_bus_id(&g.pci) {
                Some(b) => {
                    if !pcis.insert(b.clone()) {
                        p.push(format!("{key}.pci: {b} is used twice"));
                    }
                }
                None => p.push(format!(
                    "{key}.pci: expected a PCI address like 00000000:3B:00.0, got {:?}",
                    g.pci
                )),
            }
            if g.name.len() >= 96 {
                p.push(format!("{key}.name: longer than 95 bytes"));
            }
            if g.serial.len() >= 30 {
                p.push(format!("{key}.serial: longer than 29 bytes"));
            }
            if g.vbios.is_empty() || g.vbios.len() >= 32 {
                p.push(format!("{key}.vbios: expected 1 to 31 bytes"));
            }
            check_state(&key, &g.initial_state(), &mut p);
        }
        for (pos, inj) in self.inject.iter().enumerate() {
            let key = format!("inject[{pos}]");
            if !indexes.contains(&inj.gpu) {
                p.push(format!("{key}.gpu: no GPU with index {}", inj.gpu));
            }
            if let Some(e) = &inj.ecc_event
                && e != "sbe"
                && e != "dbe"
            {
                p.push(format!(
                    "{key}.ecc_event: expected \"sbe\" or \"dbe\", got {e:?}"
                ));
            }
            let mut state = GpuState::default();
            inj.apply(&mut state);
            check_state(&key, &state, &mut p);
        }
        for (pos, h) in self.hang.iter().enumerate() {
            let key = format!("hang[{pos}]");
            if h.call != "*" && !CALLS.contains(&h.call.as_str()) {
                p.push(format!(
                    "{key}.call: {:?} is not an NVML function the simulator exports \
                     (expected \"*\" or one of {})",
                    h.call,
                    CALLS.join(", ")
                ));
            }
            if h.duration_ms == Some(0) {
                p.push(format!(
                    "{key}.duration_ms: expected more than 0 ms (leave it out for a hang that never ends)"
                ));
            }
            if let Some(e) = &h.error
                && error_code(e).is_none()
            {
                p.push(format!("{key}.error: unknown NVML error {e:?}"));
            }
        }
        p
    }

    /// The scenario's GPU with this configured index.
    pub fn gpu_by_index(&self, index: u32) -> Option<&GpuSpec> {
        self.gpu.iter().find(|g| g.index == Some(index))
    }
}

fn check_state(key: &str, s: &GpuState, p: &mut Vec<String>) {
    for (field, list) in [("not_supported", &s.not_supported), ("failing", &s.failing)] {
        for r in list {
            if !READINGS.contains(&r.as_str()) {
                p.push(format!(
                    "{key}.{field}: unknown reading {r:?} (expected one of {})",
                    READINGS.join(", ")
                ));
            }
        }
    }
    for l in &s.nvlink_down {
        if *l >= 64 {
            p.push(format!("{key}.nvlink_down: link {l} out of range"));
        }
    }
    if s.nvlink_count > 64 {
        p.push(format!("{key}.nvlink_count: at most 64 links"));
    }
    s.fabric.problems(key, p);
    s.mig.problems(key, s.memory_mib, p);
}

fn valid_uuid(u: &str) -> bool {
    let Some(rest) = u.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Normalises a PCI address to NVML's bus id form `00000000:3B:00.0`
/// (8-digit domain, uppercase). Accepts `dddd:bb:dd.f`, `dddddddd:bb:dd.f`
/// and `bb:dd.f`.
pub fn nvml_bus_id(addr: &str) -> Option<String> {
    let parts: Vec<&str> = addr.trim().split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (*d, *b, *df),
        [b, df] => ("0", *b, *df),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str, max_len: usize| -> Option<u32> {
        if s.is_empty() || s.len() > max_len {
            return None;
        }
        u32::from_str_radix(s, 16).ok()
    };
    let domain = hex(domain, 8)?;
    let bus = hex(bus, 2)?;
    let dev = hex(dev, 2)?;
    let func = hex(func, 1)?;
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{domain:08X}:{bus:02X}:{dev:02X}.{func:X}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [[gpu]]
        uuid = "GPU-11111111-2222-3333-4444-555555555555"
        pci = "3b:00.0"
    "#;

    #[test]
    fn minimal_scenario_gets_defaults() {
        let s = Scenario::parse(MINIMAL, "<test>").unwrap();
        assert_eq!(s.gpu.len(), 1);
        assert_eq!(s.gpu[0].index, Some(0));
        assert_eq!(s.driver.version, "570.133.20");
        let st = s.gpu[0].initial_state();
        assert_eq!(st.pcie_link_width, 16);
        assert_eq!(st.nvlink_count, 18);
        assert!(!st.lost);
    }

    #[test]
    fn fabric_tables_and_their_injection() {
        let text = format!(
            "{MINIMAL}
            [gpu.fabric]
            state = \"completed\"
            clique_id = 7
            cluster_uuid = \"6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11\"
            health_mask = 0x1A6

            [[inject]]
            at_ms = 100
            gpu = 0
            [inject.fabric]
            state = \"in_progress\"
            "
        );
        let s = Scenario::parse(&text, "<test>").unwrap();
        let mut st = s.gpu[0].initial_state();
        assert_eq!(st.fabric.state_value(), 3);
        assert_eq!(st.fabric.clique_id, 7);
        assert_eq!(st.fabric.health_mask, 0x1A6);
        let uuid = st.fabric.cluster_uuid_bytes();
        assert_eq!(&uuid[..3], &[0x6e, 0x1c, 0x7a]);
        assert_eq!(uuid[15], 0x11);
        s.inject[0].apply(&mut st);
        assert_eq!(st.fabric.state_value(), 2);
        assert_eq!(st.fabric.status_code(), 0);
        assert_eq!(
            st.fabric.clique_id, 0,
            "an injection replaces the whole table"
        );
        assert_eq!(
            GpuState::default().fabric.state_value(),
            0,
            "no fabric by default"
        );

        let bad = format!(
            "{MINIMAL}
            [gpu.fabric]
            state = \"registered\"
            status = \"broken\"
            cluster_uuid = \"nope\"
            "
        );
        let Err(ScenarioError::Invalid { problems, .. }) = Scenario::parse(&bad, "<test>") else {
            panic!("accepted");
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[0].starts_with("gpu[0].fabric.state:"),
            "{problems:?}"
        );
    }

    #[test]
    fn mig_devices_and_their_injection() {
        let text = format!(
            "{MINIMAL}
            [gpu.mig]
            enabled = true
            [[gpu.mig.devices]]
            uuid = \"MIG-5c3a1b2e-7d4f-5a6b-8c9d-0e1f2a3b4c5d\"
            gpu_instance = 5
            profile = \"1g.10gb\"
            [[gpu.mig.devices]]
            uuid = \"MIG-5c3a1b2e-7d4f-5a6b-8c9d-0e1f2a3b4c5e\"
            gpu_instance = 6
            compute_instance = 1
            profile = \"1c.2g.20gb\"

            [[inject]]
            at_ms = 100
            gpu = 0
            [inject.mig]
            enabled = false
            "
        );
        let s = Scenario::parse(&text, "<test>").unwrap();
        let mut st = s.gpu[0].initial_state();
        assert!(st.mig.enabled);
        assert_eq!(st.mig.devices.len(), 2);
        assert_eq!(
            (
                st.mig.devices[1].gpu_instance,
                st.mig.devices[1].compute_instance
            ),
            (6, 1)
        );
        assert_eq!(st.mig.devices[0].compute_instance, 0, "defaults to 0");
        assert!(st.mig.pending_mode(), "no change pending: the current mode");
        s.inject[0].apply(&mut st);
        assert_eq!(st.mig, MigState::default(), "MIG turned off, devices gone");
        assert!(!GpuState::default().mig.enabled, "MIG off by default");

        let dev = |uuid: &str, gi: u32| {
            format!(
                "[[gpu.mig.devices]]\nuuid = \"{uuid}\"\ngpu_instance = {gi}\nprofile = \"1g.10gb\"\n"
            )
        };
        let u = "MIG-5c3a1b2e-7d4f-5a6b-8c9d-0e1f2a3b4c5d";
        let bad = format!(
            "{MINIMAL}\n[gpu.mig]\nenabled = true\n{}{}{}",
            dev(u, 1),
            dev(u, 1),
            dev("GPU-5c3a1b2e-7d4f-5a6b-8c9d-0e1f2a3b4c5d", 2)
        );
        let Err(ScenarioError::Invalid { problems, .. }) = Scenario::parse(&bad, "<test>") else {
            panic!("accepted");
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("duplicate uuid"), "{problems:?}");
        assert!(
            problems[1].contains("duplicate GPU instance 1"),
            "{problems:?}"
        );
        assert!(problems[2].contains("uuid expected MIG-"), "{problems:?}");
        let off = format!("{MINIMAL}\n[gpu.mig]\n{}", dev(u, 1));
        let Err(ScenarioError::Invalid { problems, .. }) = Scenario::parse(&off, "<test>") else {
            panic!("accepted");
        };
        assert!(problems[0].contains("need enabled = true"), "{problems:?}");
    }

    /// The slice counts and memory `nvmlDeviceGetAttributes_v2` answers for
    /// a profile, checked against the profiles NVIDIA's MIG user guide lists
    /// (the memory named as the device plugin rounds it).
    #[test]
    fn mig_profiles_answer_their_slices_and_memory() {
        let attrs = |profile: &str, gpu_mib: u64| {
            MigDeviceSpec {
                profile: profile.to_owned(),
                ..MigDeviceSpec::default()
            }
            .attributes(gpu_mib)
            .map(|a| (a.compute_slices, a.gpu_slices, a.memory_mib))
        };
        // H100 SXM 80 GB (81559 MiB).
        assert_eq!(attrs("1g.10gb", 81_559), Some((1, 1, 10_194)));
        assert_eq!(attrs("3g.40gb", 81_559), Some((3, 3, 40_779)));
        assert_eq!(attrs("7g.80gb", 81_559), Some((7, 7, 81_559)));
        assert_eq!(attrs("1c.2g.20gb", 81_559), Some((1, 2, 20_389)));
        // H200 141 GB (143771 MiB): 1g.18gb, 2g.35gb, 3g.71gb.
        assert_eq!(attrs("1g.18gb", 143_771).map(|a| a.2), Some(17_971));
        assert_eq!(attrs("2g.35gb", 143_771).map(|a| a.2), Some(35_942));
        assert_eq!(attrs("3g.71gb", 143_771).map(|a| a.2), Some(71_885));
        // Not an eighth of the memory, and not profiles at all.
        assert_eq!(attrs("1g.11gb", 81_559), None);
        for bad in [
            "1g",
            "8g.80gb",
            "2c.1g.10gb",
            "1g.10GB",
            "g.10gb",
            "1c.1g.1g.10gb",
        ] {
            assert_eq!(attrs(bad, 81_559), None, "{bad}");
        }
        let explicit = MigDeviceSpec {
            profile: "1g.11gb".to_owned(),
            memory_mib: Some(11_000),
            ..MigDeviceSpec::default()
        };
        assert_eq!(
            explicit.attributes(81_559).map(|a| a.memory_mib),
            Some(11_000)
        );
    }

    #[test]
    fn every_shipped_scenario_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut n = 0;
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
                .path();
            if path.extension().is_some_and(|e| e == "toml") {
                let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(!s.gpu.is_empty(), "{} has no GPU", path.display());
                assert!(
                    !s.description.is_empty(),
                    "{} has no description",
                    path.display()
                );
                n += 1;
            }
        }
        assert!(n >= 9, "only {n} scenarios found");
        let demo = Scenario::load(&dir.join("demo.toml")).unwrap();
        assert_eq!(demo.gpu.len(), 8);
    }

    #[test]
    fn bus_id_forms_normalise_to_nvml_form() {
        assert_eq!(nvml_bus_id("3b:00.0").as_deref(), Some("00000000:3B:00.0"));
        assert_eq!(
            nvml_bus_id("0000:3b:00.0").as_deref(),
            Some("00000000:3B:00.0")
        );
        assert_eq!(
            nvml_bus_id("00000001:DB:1F.7").as_deref(),
            Some("00000001:DB:1F.7")
        );
        assert_eq!(nvml_bus_id("3b:00"), None);
        assert_eq!(nvml_bus_id("3b:20.0"), None);
        assert_eq!(nvml_bus_id("zz:00.0"), None);
    }

    #[test]
    fn unknown_key_is_a_parse_error_naming_the_key() {
        let text = format!("{MINIMAL}\ntemprature_c = 3\n");
        let err = Scenario::parse(&text, "x.toml").unwrap_err().to_string();
        assert!(err.contains("temprature_c"), "{err}");
        assert!(err.contains("x.toml"), "{err}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = r#"
            [driver]
            init_error = "driver_gone"
            [[gpu]]
            uuid = "GPU-bad"
            pci = "nope"
            not_supported = ["fan"]
            [[gpu]]
            index = 0
            uuid = "GPU-11111111-2222-3333-4444-555555555555"
            pci = "3b:00.0"
            [[inject]]
            at_ms = 5
            gpu = 7
            ecc_event = "tbe"
        "#;
        let Err(ScenarioError::Invalid { problems, .. }) = Scenario::parse(text, "<t>") else {
            panic!("expected Invalid");
        };
        let all = problems.join("\n");
        for needle in [
            "driver.init_error",
            "gpu[0].uuid",
            "gpu[0].pci",
            "gpu[0].not_supported",
            "gpu[1].index",
            "inject[0].gpu",
            "inject[0].ecc_event",
        ] {
            assert!(all.contains(needle), "missing {needle} in {all}");
        }
    }

    #[test]
    fn hang_problems_name_their_keys() {
        let text = format!(
            "{MINIMAL}\n[[hang]]\ncall = \"nvmlDeviceGetTemprature\"\n\
             [[hang]]\ncall = \"*\"\nduration_ms = 0\nerror = \"stuck\"\n\
             [[hang]]\ncall = \"nvmlEventSetWait_v2\"\nat_ms = 5\n"
        );
        let Err(ScenarioError::Invalid { problems, .. }) = Scenario::parse(&text, "<t>") else {
            panic!("expected Invalid");
        };
        let all = problems.join("\n");
        assert_eq!(problems.len(), 3, "{all}");
        for needle in [
            "hang[0].call: \"nvmlDeviceGetTemprature\"",
            "hang[1].duration_ms",
            "hang[1].error",
        ] {
            assert!(all.contains(needle), "missing {needle} in {all}");
        }
        let ok = format!("{MINIMAL}\n[[hang]]\ncall = \"nvmlInit_v2\"\nafter_calls = 2\n");
        let s = Scenario::parse(&ok, "<t>").unwrap();
        assert_eq!(s.hang[0].after_calls, 2);
        assert_eq!(s.hang[0].duration_ms, None, "absent: forever");
    }

    #[test]
    fn injections_are_sorted_by_time_keeping_file_order() {
        let text = format!(
            "{MINIMAL}\n[[inject]]\nat_ms = 20\ngpu = 0\nxid = 2\n\
             [[inject]]\nat_ms = 10\ngpu = 0\nxid = 1\n\
             [[inject]]\nat_ms = 20\ngpu = 0\nxid = 3\n"
        );
        let s = Scenario::parse(&text, "<t>").unwrap();
        let order: Vec<u64> = s.inject.iter().filter_map(|i| i.xid).collect();
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn injection_applies_only_the_fields_it_names() {
        let inj = Injection {
            temperature_c: Some(91),
            lost: Some(true),
            ..Injection::default()
        };
        let mut s = GpuState::default();
        inj.apply(&mut s);
        assert_eq!(s.temperature_c, 91);
        assert!(s.lost);
        assert_eq!(s.power_mw, GpuState::default().power_mw);
    }
}
