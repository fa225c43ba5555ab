//! Field values (`nvmlDeviceGetFieldValues`).

use super::{SUCCESS, ffi, non_null, slot_of, with_sim};
use crate::sim::{INVALID_ARGUMENT, NOT_SUPPORTED, Ret};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{c_int, c_uint};
use std::time::{SystemTime, UNIX_EPOCH};

/// Field ids the simulator answers (from nvml.h).
const FI_PCIE_REPLAY_COUNTER: c_uint = sys::field_id::NVML_FI_DEV_PCIE_REPLAY_COUNTER;
const FI_REMAPPED_COR: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_COR;
const FI_REMAPPED_UNC: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_UNC;
const FI_REMAPPED_PENDING: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_PENDING;
const FI_REMAPPED_FAILURE: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_FAILURE;
const FI_GPU_RECOVERY_ACTION: c_uint = sys::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;

/// Field values: remapped rows (142..=145), GPU recovery action (230), PCIe
/// replay counter (94); any other field is `NOT_SUPPORTED` in its own slot.
///
/// # Safety
/// `values` must be null or valid for `valuesCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: sys::nvmlDevice_t,
    valuesCount: c_int,
    values: *mut sys::nvmlFieldValue_t,
) -> Ret {
    ffi("nvmlDeviceGetFieldValues", || {
        non_null(values)?;
        let n = usize::try_from(valuesCount).map_err(|_| INVALID_ARGUMENT)?;
        let slot = slot_of(device)?;
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        // SAFETY: non-null; the caller provides `valuesCount` initialised entries.
        let fields = unsafe { std::slice::from_raw_parts_mut(values, n) };
        with_sim(|s| {
            s.gpu(slot)?;
            for f in fields.iter_mut() {
                let (reading, value): (&str, fn(&crate::scenario::GpuState) -> u32) = match f
                    .fieldId
                {
                    FI_REMAPPED_COR => ("remapped_rows", |s| s.remapped_rows_correctable),
                    FI_REMAPPED_UNC => ("remapped_rows", |s| s.remapped_rows_uncorrectable),
                    FI_REMAPPED_PENDING => {
                        ("remapped_rows", |s| u32::from(s.remapped_rows_pending))
                    }
                    FI_REMAPPED_FAILURE => {
                        ("remapped_rows", |s| u32::from(s.remapped_rows_failure))
                    }
                    FI_GPU_RECOVERY_ACTION => ("recovery_action", |s| s.recovery_action),
                    FI_PCIE_REPLAY_COUNTER => ("pcie_replay_counter", |s| s.pcie_replay_counter),
                    _ => ("", |_| 0),
                };
                f.timestamp = now_us;
                f.latencyUsec = 0;
                f.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                let r = if reading.is_empty() {
                    Err(NOT_SUPPORTED)
                } else {
                    s.reading(slot, reading).map(value)
                };
                match r {
                    Ok(v) => {
                        f.nvmlReturn = SUCCESS;
                        f.value = sys::nvmlValue_t { uiVal: v };
                    }
                    Err(e) => f.nvmlReturn = e,
                }
            }
            Ok(())
        })
    })
}
