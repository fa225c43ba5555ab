//! MIG: mode, MIG device handles, instance ids, attributes.

use super::{ffi, handle_of, mig_handle_of, mig_of, non_null, put, read, slot_of};
use crate::sim::{INVALID_ARGUMENT, NOT_SUPPORTED, Ret, UNKNOWN};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::c_uint;

/// The MIG device a MIG handle names (its GPU must answer, in MIG mode; a
/// device whose MIG configuration is gone is `INVALID_ARGUMENT`, as a stale
/// handle is), with its GPU's memory in MiB. A `failing` device answers
/// `UNKNOWN`.
pub(super) fn mig_device(
    device: sys::nvmlDevice_t,
) -> Result<(crate::scenario::MigDeviceSpec, u64), Ret> {
    let (slot, index) = mig_of(device)?;
    let (mig, mib) = read(handle_of(slot), "mig", |s| (s.mig.clone(), s.memory_mib))?;
    if !mig.enabled {
        return Err(INVALID_ARGUMENT);
    }
    let d = mig.devices.get(index).cloned().ok_or(INVALID_ARGUMENT)?;
    if d.failing {
        return Err(UNKNOWN);
    }
    Ok((d, mib))
}

/// MIG mode: current and pending (`[gpu.mig] pending`, else the current
/// mode). A GPU without MIG support is told with `not_supported = ["mig"]`.
///
/// # Safety
/// `current` and `pending` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: sys::nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetMigMode", || {
        non_null(pending)?;
        let (on, next) = read(device, "mig", |s| (s.mig.enabled, s.mig.pending_mode()))?;
        // SAFETY: forwarded caller contract.
        unsafe {
            put(current, c_uint::from(on))?;
            put(pending, c_uint::from(next))
        }
    })
}

/// The most MIG devices the GPU can hold (NVML answers this whether or not
/// MIG is on).
///
/// # Safety
/// `count` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: sys::nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetMaxMigDeviceCount", || {
        read(device, "mig", |_| ())?;
        // SAFETY: forwarded caller contract.
        unsafe { put(count, crate::scenario::MAX_MIG_DEVICES as c_uint) }
    })
}

/// The MIG device at `index`: `NOT_FOUND` for an index with no device,
/// `INVALID_ARGUMENT` while MIG is off (`nvml.h`).
///
/// # Safety
/// `mig` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: sys::nvmlDevice_t,
    index: c_uint,
    mig: *mut sys::nvmlDevice_t,
) -> Ret {
    ffi("nvmlDeviceGetMigDeviceHandleByIndex", || {
        non_null(mig)?;
        let slot = slot_of(device)?;
        let state = read(device, "mig", |s| s.mig.clone())?;
        let i = index as usize;
        if !state.enabled || i >= crate::scenario::MAX_MIG_DEVICES {
            return Err(INVALID_ARGUMENT);
        }
        if i >= state.devices.len() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(mig, mig_handle_of(slot, i)) }
    })
}

/// A MIG device's GPU instance id (`INVALID_ARGUMENT` for a GPU handle).
///
/// # Safety
/// `id` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetGpuInstanceId", || {
        let (d, _) = mig_device(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(id, d.gpu_instance) }
    })
}

/// A MIG device's compute instance id (`INVALID_ARGUMENT` for a GPU handle).
///
/// # Safety
/// `id` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetComputeInstanceId", || {
        let (d, _) = mig_device(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(id, d.compute_instance) }
    })
}

/// A MIG device's slices and memory. nvml.h: "This API currently only
/// supports MIG device handles" — a GPU handle is `NOT_SUPPORTED`.
///
/// # Safety
/// `attrs` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: sys::nvmlDevice_t,
    attrs: *mut sys::nvmlDeviceAttributes_t,
) -> Ret {
    ffi("nvmlDeviceGetAttributes_v2", || {
        non_null(attrs)?;
        if mig_of(device).is_err() {
            slot_of(device)?;
            return Err(NOT_SUPPORTED);
        }
        let (d, mib) = mig_device(device)?;
        let a = d.attributes(mib).ok_or(UNKNOWN)?;
        // SM and engine counts are not simulated (0): only the slices and
        // the memory name the profile.
        let v = sys::nvmlDeviceAttributes_t {
            multiprocessorCount: 0,
            sharedCopyEngineCount: 0,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
            gpuInstanceSliceCount: a.gpu_slices,
            computeInstanceSliceCount: a.compute_slices,
            memorySizeMB: a.memory_mib,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(attrs, v) }
    })
}
