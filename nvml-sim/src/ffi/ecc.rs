//! Memory errors: ECC counters, retired pages, remapped rows.

use super::{INSUFFICIENT_SIZE, ffi, non_null, put, read};
use crate::sim::{INVALID_ARGUMENT, Ret};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{c_uint, c_ulonglong};

/// Total ECC errors: error type 0 corrected / 1 uncorrected, counter 0 volatile / 1 aggregate.
///
/// # Safety
/// `eccCounts` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: sys::nvmlDevice_t,
    errorType: c_uint,
    counterType: c_uint,
    eccCounts: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetTotalEccErrors", || {
        non_null(eccCounts)?;
        let v = read(device, "ecc", |s| match (errorType, counterType) {
            (0, 0) => Ok(s.ecc_volatile_corrected),
            (1, 0) => Ok(s.ecc_volatile_uncorrected),
            (0, 1) => Ok(s.ecc_aggregate_corrected),
            (1, 1) => Ok(s.ecc_aggregate_uncorrected),
            _ => Err(INVALID_ARGUMENT),
        })??;
        // SAFETY: forwarded caller contract.
        unsafe { put(eccCounts, v) }
    })
}

fn retired_pages(
    device: sys::nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Result<(), Ret> {
    non_null(count)?;
    let n = read(device, "retired_pages", |s| match cause {
        0 => Ok(s.retired_pages_sbe),
        1 => Ok(s.retired_pages_dbe),
        _ => Err(INVALID_ARGUMENT),
    })??;
    // SAFETY: count is non-null; the caller guarantees it is readable and writable.
    let room = unsafe { count.read() };
    // SAFETY: as above.
    unsafe { count.write(n) };
    if room < n {
        return Err(INSUFFICIENT_SIZE);
    }
    if n > 0 {
        non_null(addresses)?;
    }
    for i in 0..n as usize {
        let page = 0x4_0000 + (cause as u64) * 0x1000_0000 + i as u64 * 0x10;
        // SAFETY: the caller provides room for `room >= n` addresses (NVML contract).
        unsafe { addresses.add(i).write(page) };
        if !timestamps.is_null() {
            // SAFETY: as above, for the optional timestamp array.
            unsafe { timestamps.add(i).write(1_700_000_000 + i as u64) };
        }
    }
    Ok(())
}

/// Retired page addresses for a cause (0 multiple SBE, 1 DBE); count query with a small buffer.
///
/// # Safety
/// `pageCount` must be null or valid; `addresses` valid for `*pageCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: sys::nvmlDevice_t,
    cause: c_uint,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetRetiredPages", || {
        retired_pages(device, cause, pageCount, addresses, std::ptr::null_mut())
    })
}

/// Retired page addresses and timestamps.
///
/// # Safety
/// `pageCount` must be null or valid; the arrays valid for `*pageCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: sys::nvmlDevice_t,
    cause: c_uint,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetRetiredPages_v2", || {
        retired_pages(device, cause, pageCount, addresses, timestamps)
    })
}

/// Whether a page retirement waits for a reboot.
///
/// # Safety
/// `isPending` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: sys::nvmlDevice_t,
    isPending: *mut sys::nvmlEnableState_t,
) -> Ret {
    ffi("nvmlDeviceGetRetiredPagesPendingStatus", || {
        non_null(isPending)?;
        let v = read(device, "retired_pages", |s| s.retired_pages_pending)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(isPending, c_uint::from(v)) }
    })
}

/// Remapped rows: correctable, uncorrectable, pending, failure.
///
/// # Safety
/// Each out-pointer must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: sys::nvmlDevice_t,
    corrRows: *mut c_uint,
    uncRows: *mut c_uint,
    isPending: *mut c_uint,
    failureOccurred: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetRemappedRows", || {
        for p in [corrRows, uncRows, isPending, failureOccurred] {
            non_null(p)?;
        }
        let (c, u, p, f) = read(device, "remapped_rows", |s| {
            (
                s.remapped_rows_correctable,
                s.remapped_rows_uncorrectable,
                s.remapped_rows_pending,
                s.remapped_rows_failure,
            )
        })?;
        // SAFETY: all four checked non-null; validity is the caller's contract.
        unsafe {
            put(corrRows, c)?;
            put(uncRows, u)?;
            put(isPending, c_uint::from(p))?;
            put(failureOccurred, c_uint::from(f))
        }
    })
}
