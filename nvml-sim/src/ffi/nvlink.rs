//! NVLink state and error counters, NVLink fabric registration.

use super::{VERSION_MISMATCH, ffi, non_null, put, read};
use crate::sim::{INVALID_ARGUMENT, NOT_SUPPORTED, Ret};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{c_uint, c_ulonglong};

fn nvlink<T>(
    device: sys::nvmlDevice_t,
    link: c_uint,
    f: impl FnOnce(&crate::scenario::GpuState) -> Result<T, Ret>,
) -> Result<T, Ret> {
    read(device, "nvlink", |s| {
        if link >= s.nvlink_count {
            return Err(INVALID_ARGUMENT);
        }
        f(s)
    })?
}

/// NVLink state of one link (1 active, 0 down).
///
/// # Safety
/// `isActive` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: sys::nvmlDevice_t,
    link: c_uint,
    isActive: *mut sys::nvmlEnableState_t,
) -> Ret {
    ffi("nvmlDeviceGetNvLinkState", || {
        non_null(isActive)?;
        let v = nvlink(device, link, |s| Ok(!s.nvlink_down.contains(&link)))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(isActive, c_uint::from(v)) }
    })
}

/// NVLink error counter (0 replay, 1 recovery, 2 CRC flit, 3 CRC data) of one link.
///
/// # Safety
/// `counterValue` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: sys::nvmlDevice_t,
    link: c_uint,
    counter: c_uint,
    counterValue: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetNvLinkErrorCounter", || {
        non_null(counterValue)?;
        let v = nvlink(device, link, |s| match counter {
            0 => Ok(s.nvlink_replay_errors),
            1 => Ok(s.nvlink_recovery_errors),
            2 => Ok(s.nvlink_crc_flit_errors),
            3 => Ok(s.nvlink_crc_data_errors),
            _ => Err(NOT_SUPPORTED),
        })?;
        // SAFETY: forwarded caller contract.
        unsafe { put(counterValue, v) }
    })
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`: the struct's size with the
/// version in the top byte, as nvml.h builds it.
const FABRIC_INFO_V2: c_uint =
    std::mem::size_of::<sys::nvmlGpuFabricInfo_v2_t>() as c_uint | (2 << 24);
/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)` (adds `healthSummary`).
const FABRIC_INFO_V3: c_uint =
    std::mem::size_of::<sys::nvmlGpuFabricInfo_v3_t>() as c_uint | (3 << 24);

/// The GPU's fabric registration, the first NVML call for it (no health mask).
///
/// # Safety
/// `info` must be null or valid for a write of `nvmlGpuFabricInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: sys::nvmlDevice_t,
    info: *mut sys::nvmlGpuFabricInfo_t,
) -> Ret {
    ffi("nvmlDeviceGetGpuFabricInfo", || {
        non_null(info)?;
        let f = read(device, "fabric", |s| s.fabric.clone())?;
        let v = sys::nvmlGpuFabricInfo_t {
            clusterUuid: f.cluster_uuid_bytes(),
            status: f.status_code(),
            cliqueId: f.clique_id,
            state: f.state_value(),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}

/// The GPU's fabric registration with its health (`nvmlGpuFabricInfo_v2_t`
/// or `_v3_t`, by the `version` the caller set; any other version is
/// `ARGUMENT_VERSION_MISMATCH`, as NVML answers it).
///
/// # Safety
/// `info` must be null or point to a struct of the version in its `version`
/// field, valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: sys::nvmlDevice_t,
    info: *mut sys::nvmlGpuFabricInfoV_t,
) -> Ret {
    ffi("nvmlDeviceGetGpuFabricInfoV", || {
        non_null(info)?;
        // SAFETY: non-null; `version` is the first field of every version.
        let version = unsafe { std::ptr::addr_of!((*info).version).read() };
        if version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3 {
            return Err(VERSION_MISMATCH);
        }
        let f = read(device, "fabric", |s| s.fabric.clone())?;
        let v2 = sys::nvmlGpuFabricInfo_v2_t {
            version,
            clusterUuid: f.cluster_uuid_bytes(),
            status: f.status_code(),
            cliqueId: f.clique_id,
            state: f.state_value(),
            healthMask: f.health_mask,
        };
        if version == FABRIC_INFO_V3 {
            let v3 = sys::nvmlGpuFabricInfo_v3_t {
                version,
                clusterUuid: v2.clusterUuid,
                status: v2.status,
                cliqueId: v2.cliqueId,
                state: v2.state,
                healthMask: v2.healthMask,
                healthSummary: f.health_summary,
            };
            // SAFETY: the caller's struct is v3 (its version says so).
            unsafe { put(info, v3) }
        } else {
            // SAFETY: the caller's struct is v2: only its fields are written
            // (v2 is v3's prefix).
            unsafe { put(info.cast::<sys::nvmlGpuFabricInfo_v2_t>(), v2) }
        }
    })
}
