//! Event sets: registration and waits (a wait releases the global lock while it
//! sleeps and wakes when an injection is due or the set is freed).

use super::{WAKE, ffi, handle_of, lock, non_null, put, set_id, slot_of, with_sim};
use crate::sim::{INVALID_ARGUMENT, Ret, UNINITIALIZED, UNKNOWN};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

const TIMEOUT: Ret = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;

/// Event types the GPU supports.
///
/// # Safety
/// `eventTypes` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: sys::nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetSupportedEventTypes", || {
        non_null(eventTypes)?;
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.supported_events(slot))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(eventTypes, v) }
    })
}

/// Creates an event set.
///
/// # Safety
/// `set` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) -> Ret {
    ffi("nvmlEventSetCreate", || {
        non_null(set)?;
        let id = with_sim(|s| s.event_set_create())?;
        let addr = usize::try_from(id).map_err(|_| UNKNOWN)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(set, std::ptr::without_provenance_mut(addr)) }
    })
}

/// Registers event types of a GPU in a set.
///
/// # Safety
/// None beyond NVML's (handles are checked, never dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: sys::nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: sys::nvmlEventSet_t,
) -> Ret {
    ffi("nvmlDeviceRegisterEvents", || {
        let slot = slot_of(device)?;
        let id = set_id(set)?;
        with_sim(|s| s.register(id, slot, eventTypes))
    })
}

/// Waits up to `timeoutms` for the next event of the set.
///
/// # Safety
/// `data` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeoutms: c_uint,
) -> Ret {
    ffi("nvmlEventSetWait_v2", || {
        non_null(data)?;
        let id = set_id(set)?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
        let mut g = lock();
        loop {
            let t0 = g.t0;
            let sim = g.sim()?;
            if let Some(ev) = sim.pop_event(id)? {
                let out = sys::nvmlEventData_t {
                    device: handle_of(ev.slot),
                    eventType: ev.event_type,
                    eventData: ev.data,
                    gpuInstanceId: 0,
                    computeInstanceId: 0,
                };
                // SAFETY: forwarded caller contract.
                return unsafe { put(data, out) };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TIMEOUT);
            }
            let mut sleep = deadline - now;
            if let (Some(t0), Some(due)) = (t0, sim.next_due_ms()) {
                let due_at = t0 + Duration::from_millis(due);
                sleep = sleep.min(due_at.saturating_duration_since(now));
            }
            g = WAKE
                .wait_timeout(g, sleep.max(Duration::from_millis(1)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    })
}

/// Frees an event set (waiters on it return `INVALID_ARGUMENT`).
///
/// # Safety
/// None beyond NVML's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: sys::nvmlEventSet_t) -> Ret {
    let r = ffi("nvmlEventSetFree", || {
        let id = set_id(set)?;
        let mut g = lock();
        let sim = g.sim.as_mut().ok_or(UNINITIALIZED)?;
        if !sim.has_set(id) {
            return Err(INVALID_ARGUMENT);
        }
        sim.event_set_free(id)
    });
    WAKE.notify_all();
    r
}
