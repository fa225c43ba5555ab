//! The exported NVML C functions.
//!
//! Every function validates its pointer arguments (null → `NVML_ERROR_INVALID_ARGUMENT`),
//! never unwinds across the C boundary (each body runs under `catch_unwind`;
//! a panic becomes `NVML_ERROR_UNKNOWN`), and takes the one global lock only
//! briefly (event waits release it while they sleep).
//!
//! Device handles are the GPU's scenario slot + 1 and event-set handles are
//! set ids, both disguised as pointers: nobody dereferences an NVML handle, and
//! a stale or forged handle is rejected instead of read.
//!
//! This module holds what every export shares (the global simulator and its
//! clock, `[[hang]]`s, out-pointer writes, handle encoding); the exports sit in
//! one submodule per NVML API area.
#![allow(non_snake_case)]

mod device;
mod ecc;
mod events;
mod fields;
mod init;
mod mig;
mod nvlink;

use crate::sim::{INVALID_ARGUMENT, Ret, Sim, UNINITIALIZED, UNKNOWN};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const SUCCESS: Ret = sys::nvmlReturn_enum_NVML_SUCCESS;
const INSUFFICIENT_SIZE: Ret = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;

/// Environment variable naming the scenario file.
pub const SCENARIO_ENV: &str = "GPUWATCH_NVML_SIM_SCENARIO";
/// Suffix of the side file next to the loaded library that names the scenario
/// (`libnvml_sim.so.scenario`); it wins over [`SCENARIO_ENV`].
pub const SIDE_FILE_SUFFIX: &str = ".scenario";

struct Global {
    /// Loaded on the first init call (re-tried while it fails).
    sim: Option<Sim>,
    /// Time of the first init call: the timeline's zero.
    t0: Option<Instant>,
}

impl Global {
    fn now_ms(&self) -> u64 {
        self.t0
            .map(|t| u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    /// The driver after applying every injection due now.
    fn sim(&mut self) -> Result<&mut Sim, Ret> {
        let now = self.now_ms();
        let sim = self.sim.as_mut().ok_or(UNINITIALIZED)?;
        if sim.advance(now) > 0 {
            WAKE.notify_all();
        }
        Ok(sim)
    }
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    sim: None,
    t0: None,
});
static WAKE: Condvar = Condvar::new();

fn lock() -> MutexGuard<'static, Global> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a body with no unwinding across the boundary.
fn catch(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => UNKNOWN,
    }
}

/// Runs the body of the exported function `call`: first any `[[hang]]` on
/// it, then the body, with no unwinding across the boundary.
fn ffi(call: &'static str, f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    catch(|| {
        hang(call)?;
        f()
    })
}

/// Blocks the calling thread while a `[[hang]]` on `call` is on, without
/// holding the global lock (other calls go on, as they do when one caller is
/// stuck in the driver); then fails with the hang's error, if it has one.
fn hang(call: &'static str) -> Result<(), Ret> {
    let (h, t0) = {
        let mut g = lock();
        let now = g.now_ms();
        let t0 = g.t0;
        match (g.sim.as_mut(), t0) {
            (Some(sim), Some(t0)) => match sim.hang(call, now) {
                Some(h) => (h, t0),
                None => return Ok(()),
            },
            _ => return Ok(()),
        }
    };
    match h.until_ms {
        Some(ms) => {
            let until = t0 + Duration::from_millis(ms);
            loop {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                std::thread::sleep(until - now);
            }
        }
        // A hang that never ends: the caller stays here until the process exits.
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
    match h.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn with_sim<T>(f: impl FnOnce(&mut Sim) -> Result<T, Ret>) -> Result<T, Ret> {
    with_sim_at(|sim, _| f(sim))
}

/// [`with_sim`] for readings that change with time (the energy counter): the
/// body also gets the milliseconds since the first init.
fn with_sim_at<T>(f: impl FnOnce(&mut Sim, u64) -> Result<T, Ret>) -> Result<T, Ret> {
    let mut g = lock();
    let now = g.now_ms();
    f(g.sim()?, now)
}

fn non_null<T>(p: *const T) -> Result<(), Ret> {
    if p.is_null() {
        Err(INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Writes `v` through an out-pointer after checking it.
///
/// # Safety
/// `p` must be null or valid for a write of `T` (NVML's contract with callers).
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    non_null(p)?;
    // SAFETY: non-null checked above; validity is the caller's NVML contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    non_null(buf)?;
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: buf is non-null and, per the caller's contract, holds `len` bytes;
    // we write s.len() + 1 <= len bytes; the regions cannot overlap (s is ours).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

fn handle_of(slot: usize) -> sys::nvmlDevice_t {
    std::ptr::without_provenance_mut(slot + 1)
}

/// A GPU handle is `slot + 1`; a MIG device handle also carries its index
/// above [`MIG_SHIFT`]. A GPU call on a MIG handle is `INVALID_ARGUMENT`.
const MIG_SHIFT: u32 = 16;

fn slot_of(device: sys::nvmlDevice_t) -> Result<usize, Ret> {
    let addr = device.addr();
    if addr >> MIG_SHIFT != 0 {
        return Err(INVALID_ARGUMENT);
    }
    addr.checked_sub(1).ok_or(INVALID_ARGUMENT)
}

fn mig_handle_of(slot: usize, index: usize) -> sys::nvmlDevice_t {
    std::ptr::without_provenance_mut(((index + 1) << MIG_SHIFT) | (slot + 1))
}

/// The (GPU slot, MIG device index) of a MIG device handle.
fn mig_of(device: sys::nvmlDevice_t) -> Result<(usize, usize), Ret> {
    let addr = device.addr();
    let index = (addr >> MIG_SHIFT).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    let slot = (addr & ((1 << MIG_SHIFT) - 1))
        .checked_sub(1)
        .ok_or(INVALID_ARGUMENT)?;
    Ok((slot, index))
}

fn set_id(set: sys::nvmlEventSet_t) -> Result<u64, Ret> {
    match u64::try_from(set.addr()) {
        Ok(0) | Err(_) => Err(INVALID_ARGUMENT),
        Ok(id) => Ok(id),
    }
}

/// Reads one state value of a GPU for a named reading.
fn read<T>(
    device: sys::nvmlDevice_t,
    reading: &str,
    f: impl FnOnce(&crate::scenario::GpuState) -> T,
) -> Result<T, Ret> {
    let slot = slot_of(device)?;
    with_sim(|s| s.reading(slot, reading).map(f))
}

/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: a versioned struct of a version
/// the library does not know.
const VERSION_MISMATCH: Ret = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

#[cfg(test)]
mod tests {
    use super::device::{nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetUUID};
    use super::events::nvmlEventSetWait_v2;
    use super::*;

    #[test]
    fn null_pointers_are_invalid_arguments_not_crashes() {
        // SAFETY: null out-pointers are exactly what is being tested; the
        // functions must reject them before touching anything.
        unsafe {
            assert_eq!(
                nvmlDeviceGetCount_v2(std::ptr::null_mut()),
                INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetUUID(handle_of(0), std::ptr::null_mut(), 80),
                INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlEventSetWait_v2(std::ptr::null_mut(), std::ptr::null_mut(), 0),
                INVALID_ARGUMENT
            );
            let mut h: sys::nvmlDevice_t = std::ptr::null_mut();
            // Not initialised in this process: a clean error, not a crash.
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut h), UNINITIALIZED);
        }
    }

    #[test]
    fn short_string_buffer_is_insufficient_size() {
        let mut buf = [1 as c_char; 4];
        // SAFETY: buf is valid for 4 bytes.
        let r = unsafe { put_str(buf.as_mut_ptr(), 4, "GPU-0") };
        assert_eq!(r, Err(INSUFFICIENT_SIZE));
        // SAFETY: as above.
        unsafe { put_str(buf.as_mut_ptr(), 4, "abc") }.unwrap();
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
    }

    /// `CALLS` (what a `[[hang]]` may name) is every function this module
    /// exports except `nvmlErrorString`, and every export checks for hangs.
    #[test]
    fn hang_call_names_are_exactly_the_exports() {
        let src = [
            include_str!("ffi.rs")
                .split("#[cfg(test)]")
                .next()
                .expect("the non-test part"),
            include_str!("ffi/device.rs"),
            include_str!("ffi/ecc.rs"),
            include_str!("ffi/events.rs"),
            include_str!("ffi/fields.rs"),
            include_str!("ffi/init.rs"),
            include_str!("ffi/mig.rs"),
            include_str!("ffi/nvlink.rs"),
        ]
        .concat();
        let mut exported: Vec<&str> = src
            .split("pub unsafe extern \"C\" fn ")
            .skip(1)
            .filter_map(|rest| rest.split('(').next())
            .filter(|name| *name != "$fn" && *name != "nvmlErrorString")
            .collect();
        // The u32_reading! macro's instances.
        for inst in src.split("u32_reading!(").skip(1) {
            let name = inst
                .lines()
                .find(|l| l.trim_start().starts_with("nvml"))
                .and_then(|l| l.trim().split(',').next())
                .expect("macro instance names a function");
            exported.push(name);
        }
        exported.sort_unstable();
        let mut calls = crate::CALLS.to_vec();
        calls.sort_unstable();
        assert_eq!(exported, calls);
    }

    #[test]
    fn mig_handles_round_trip_and_are_not_gpu_handles() {
        let h = mig_handle_of(3, 6);
        assert_eq!(mig_of(h), Ok((3, 6)));
        assert_eq!(
            slot_of(h),
            Err(INVALID_ARGUMENT),
            "a GPU call on a MIG handle"
        );
        assert_eq!(mig_of(handle_of(3)), Err(INVALID_ARGUMENT));
    }

    #[test]
    fn handles_round_trip_and_null_is_rejected() {
        assert_eq!(slot_of(handle_of(5)), Ok(5));
        assert_eq!(slot_of(std::ptr::null_mut()), Err(INVALID_ARGUMENT));
        assert_eq!(set_id(std::ptr::null_mut()), Err(INVALID_ARGUMENT));
    }
}
