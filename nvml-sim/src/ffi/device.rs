//! Device enumeration, identity and the polled readings: temperature, power,
//! PCIe link, clock-event reasons, persistence mode, memory.

use super::mig::mig_device;
use super::{
    VERSION_MISMATCH, ffi, handle_of, mig_of, non_null, put, put_str, read, slot_of, with_sim,
    with_sim_at,
};
use crate::scenario::nvml_bus_id;
use crate::sim::{INVALID_ARGUMENT, NOT_SUPPORTED, Ret, UNKNOWN};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{CStr, c_char, c_uint, c_ulonglong};

/// PCI device id reported for every GPU (H100 SXM5) and subsystem id.
const PCI_DEVICE_ID: c_uint = 0x2330_10DE;
const PCI_SUBSYSTEM_ID: c_uint = 0x16C1_10DE;

/// Number of GPUs not removed.
///
/// # Safety
/// `deviceCount` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> Ret {
    ffi("nvmlDeviceGetCount_v2", || {
        non_null(deviceCount)?;
        let n = with_sim(|s| s.device_count())?;
        // SAFETY: forwarded caller contract.
        unsafe { put(deviceCount, n) }
    })
}

/// Handle of the GPU at an enumeration position.
///
/// # Safety
/// `device` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    ffi("nvmlDeviceGetHandleByIndex_v2", || {
        non_null(device)?;
        let slot = with_sim(|s| s.handle_by_index(index))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(device, handle_of(slot)) }
    })
}

/// Handle of the GPU with a UUID.
///
/// # Safety
/// `uuid` must be null or a NUL-terminated string; `device` null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    ffi("nvmlDeviceGetHandleByUUID", || {
        non_null(uuid)?;
        non_null(device)?;
        // SAFETY: non-null; NUL termination is the caller's contract.
        let wanted = unsafe { CStr::from_ptr(uuid) }.to_bytes().to_vec();
        let slot = with_sim(|s| {
            let slot = s
                .scenario()
                .gpu
                .iter()
                .position(|g| g.uuid.as_bytes().eq_ignore_ascii_case(&wanted))
                .ok_or(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
            s.gpu(slot)?;
            Ok(slot)
        })?;
        // SAFETY: forwarded caller contract.
        unsafe { put(device, handle_of(slot)) }
    })
}

/// The GPU's UUID.
///
/// # Safety
/// `uuid` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    ffi("nvmlDeviceGetUUID", || {
        non_null(uuid)?;
        if mig_of(device).is_ok() {
            let v = mig_device(device)?.0.uuid;
            // SAFETY: forwarded caller contract.
            return unsafe { put_str(uuid, length, &v) };
        }
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.gpu(slot).map(|(g, _)| g.uuid.clone()))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(uuid, length, &v) }
    })
}

/// The GPU's product name.
///
/// # Safety
/// `name` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    ffi("nvmlDeviceGetName", || {
        non_null(name)?;
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.gpu(slot).map(|(g, _)| g.name.clone()))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(name, length, &v) }
    })
}

/// The GPU's serial number (`NOT_SUPPORTED` when the scenario has none, as
/// NVML answers for a board without one in its infoROM).
///
/// # Safety
/// `serial` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: sys::nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> Ret {
    ffi("nvmlDeviceGetSerial", || {
        non_null(serial)?;
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.gpu(slot).map(|(g, _)| g.serial.clone()))?;
        if v.is_empty() {
            return Err(NOT_SUPPORTED);
        }
        // SAFETY: forwarded caller contract.
        unsafe { put_str(serial, length, &v) }
    })
}

/// The GPU's VBIOS version (nvml.h: "For all products", so never
/// `NOT_SUPPORTED`).
///
/// # Safety
/// `version` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: sys::nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> Ret {
    ffi("nvmlDeviceGetVbiosVersion", || {
        non_null(version)?;
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.gpu(slot).map(|(g, _)| g.vbios.clone()))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(version, length, &v) }
    })
}

/// Energy consumed since the driver was loaded, mJ (`NOT_SUPPORTED` where
/// the scenario says `energy` is, as before Volta).
///
/// # Safety
/// `energy` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: sys::nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetTotalEnergyConsumption", || {
        non_null(energy)?;
        let slot = slot_of(device)?;
        let v = with_sim_at(|s, now| s.total_energy_mj(slot, now))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(energy, v) }
    })
}

fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// PCI information (bus id in NVML's `00000000:3B:00.0` form).
///
/// # Safety
/// `pci` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    ffi("nvmlDeviceGetPciInfo_v3", || {
        non_null(pci)?;
        let slot = slot_of(device)?;
        let raw = with_sim(|s| s.gpu(slot).map(|(g, _)| g.pci.clone()))?;
        let bus_id = nvml_bus_id(&raw).ok_or(UNKNOWN)?;
        let hex = |r: std::ops::Range<usize>| {
            bus_id
                .get(r)
                .and_then(|h| c_uint::from_str_radix(h, 16).ok())
                .ok_or(UNKNOWN)
        };
        let (domain, bus, dev) = (hex(0..8)?, hex(9..11)?, hex(12..14)?);
        let info = sys::nvmlPciInfo_t {
            busIdLegacy: c_array(&bus_id[4..]),
            domain,
            bus,
            device: dev,
            pciDeviceId: PCI_DEVICE_ID,
            pciSubSystemId: PCI_SUBSYSTEM_ID,
            busId: c_array(&bus_id),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(pci, info) }
    })
}

/// The GPU's enumeration position.
///
/// # Safety
/// `index` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: sys::nvmlDevice_t, index: *mut c_uint) -> Ret {
    ffi("nvmlDeviceGetIndex", || {
        non_null(index)?;
        let slot = slot_of(device)?;
        let i = with_sim(|s| s.enumeration_index(slot))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(index, i) }
    })
}

/// Core temperature (sensor 0 only).
///
/// # Safety
/// `temp` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: sys::nvmlDevice_t,
    sensorType: c_uint,
    temp: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetTemperature", || {
        non_null(temp)?;
        if sensorType != sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        let v = read(device, "temperature", |s| s.temperature_c)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(temp, v) }
    })
}

/// Shutdown (0) and slowdown (1) thresholds; others are not supported.
///
/// # Safety
/// `temp` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: sys::nvmlDevice_t,
    thresholdType: c_uint,
    temp: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetTemperatureThreshold", || {
        non_null(temp)?;
        let v = read(device, "temperature_threshold", |s| match thresholdType {
            sys::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => {
                Ok(s.shutdown_temperature_c)
            }
            sys::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => {
                Ok(s.slowdown_temperature_c)
            }
            _ => Err(NOT_SUPPORTED),
        })??;
        // SAFETY: forwarded caller contract.
        unsafe { put(temp, v) }
    })
}

macro_rules! u32_reading {
    ($(#[$doc:meta])* $fn:ident, $reading:literal, $field:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The out-pointer must be null or valid for a write.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $fn(device: sys::nvmlDevice_t, out: *mut c_uint) -> Ret {
            ffi(stringify!($fn), || {
                non_null(out)?;
                let v = read(device, $reading, |s| s.$field)?;
                // SAFETY: forwarded caller contract.
                unsafe { put(out, v) }
            })
        }
    };
}

u32_reading!(
    /// Power draw, mW.
    nvmlDeviceGetPowerUsage, "power", power_mw
);
u32_reading!(
    /// Enforced power limit, mW.
    nvmlDeviceGetEnforcedPowerLimit, "power_limit", power_limit_mw
);
u32_reading!(
    /// Current PCIe link generation.
    nvmlDeviceGetCurrPcieLinkGeneration, "pcie_link", pcie_link_gen
);
u32_reading!(
    /// Maximum PCIe link generation.
    nvmlDeviceGetMaxPcieLinkGeneration, "pcie_link", pcie_link_gen_max
);
u32_reading!(
    /// Current PCIe link width.
    nvmlDeviceGetCurrPcieLinkWidth, "pcie_link", pcie_link_width
);
u32_reading!(
    /// Maximum PCIe link width.
    nvmlDeviceGetMaxPcieLinkWidth, "pcie_link", pcie_link_width_max
);
u32_reading!(
    /// PCIe replay counter.
    nvmlDeviceGetPcieReplayCounter, "pcie_replay_counter", pcie_replay_counter
);

fn clock_reasons(device: sys::nvmlDevice_t, out: *mut c_ulonglong) -> Result<(), Ret> {
    non_null(out)?;
    let v = read(device, "clock_event_reasons", |s| s.clock_event_reasons)?;
    // SAFETY: non-null checked; validity is the caller's contract (both callers are
    // unsafe extern fns that document it).
    unsafe { put(out, v) }
}

/// Clock-event (throttle) reasons bitmask.
///
/// # Safety
/// `reasons` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: sys::nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetCurrentClocksThrottleReasons", || {
        clock_reasons(device, reasons)
    })
}

/// Clock-event reasons bitmask (newer name of the throttle reasons).
///
/// # Safety
/// `reasons` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: sys::nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetCurrentClocksEventReasons", || {
        clock_reasons(device, reasons)
    })
}

/// Persistence mode (1 enabled).
///
/// # Safety
/// `mode` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: sys::nvmlDevice_t,
    mode: *mut sys::nvmlEnableState_t,
) -> Ret {
    ffi("nvmlDeviceGetPersistenceMode", || {
        non_null(mode)?;
        let v = read(device, "persistence_mode", |s| s.persistence_mode)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(mode, c_uint::from(v)) }
    })
}

/// `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2: c_uint = std::mem::size_of::<sys::nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// The GPU's framebuffer memory: `memory_mib` in all, none of it used
/// (nothing runs on a simulated GPU). Any `version` but 2 is
/// `ARGUMENT_VERSION_MISMATCH`, as NVML answers it.
///
/// # Safety
/// `memory` must be null or point to an `nvmlMemory_v2_t`, valid for reads
/// and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    memory: *mut sys::nvmlMemory_v2_t,
) -> Ret {
    ffi("nvmlDeviceGetMemoryInfo_v2", || {
        non_null(memory)?;
        // SAFETY: non-null; `version` is the first field.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read() };
        if version != MEMORY_V2 {
            return Err(VERSION_MISMATCH);
        }
        let total = read(device, "memory", |s| s.memory_mib)? * 1024 * 1024;
        let v = sys::nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total,
            used: 0,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(memory, v) }
    })
}
