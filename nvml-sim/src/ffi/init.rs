//! Loading the scenario, init and shutdown, error strings, system versions.

use super::{SCENARIO_ENV, SIDE_FILE_SUFFIX, WAKE, catch, ffi, hang, lock, put_str, with_sim};
use crate::scenario::Scenario;
use crate::sim::{Ret, Sim, UNKNOWN};
use std::ffi::{CStr, CString, OsStr, c_char, c_uint};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

/// The path this library was loaded from.
fn own_path() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = nvmlInit_v2 as unsafe extern "C" fn() -> Ret as *const libc::c_void;
    // SAFETY: dladdr only reads the loader's tables for an address inside this object.
    let rc = unsafe { libc::dladdr(addr, &mut info) };
    if rc == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader while we are loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}

/// Keeps this library mapped for the life of the process (like the real
/// driver's state, the timeline and init counts survive `dlclose`).
fn pin(path: &std::path::Path) {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: c is a valid C string; RTLD_NOLOAD only takes another reference to
    // an object that is already loaded (us) and RTLD_NODELETE marks it resident.
    // The handle is deliberately never closed.
    unsafe {
        libc::dlopen(
            c.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        );
    }
}

/// Where the scenario comes from: the side file next to the library, else the env.
fn scenario_path() -> Result<PathBuf, String> {
    if let Some(lib) = own_path() {
        pin(&lib);
        let mut side = lib.into_os_string();
        side.push(SIDE_FILE_SUFFIX);
        let side = PathBuf::from(side);
        if let Ok(text) = std::fs::read_to_string(&side) {
            let p = text.trim();
            if p.is_empty() {
                return Err(format!("side file {} is empty", side.display()));
            }
            return Ok(PathBuf::from(p));
        }
    }
    match std::env::var_os(SCENARIO_ENV) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(format!(
            "no scenario: set {SCENARIO_ENV} to a scenario file"
        )),
    }
}

fn do_init(call: &'static str) -> Result<(), Ret> {
    {
        let mut g = lock();
        if g.t0.is_none() {
            g.t0 = Some(Instant::now());
        }
        if g.sim.is_none() {
            let loaded =
                scenario_path().and_then(|p| Scenario::load(&p).map_err(|e| e.to_string()));
            match loaded {
                Ok(s) => g.sim = Some(Sim::new(s)),
                Err(msg) => {
                    eprintln!("nvml-sim: {msg}");
                    return Err(UNKNOWN);
                }
            }
        }
    }
    // After loading, so a hang on init applies from the very first call.
    hang(call)?;
    let mut g = lock();
    let now = g.now_ms();
    let sim = g.sim.as_mut().ok_or(UNKNOWN)?;
    sim.advance(now);
    sim.init(now)
}

/// Loads the scenario on first use (see the crate docs) and initialises.
///
/// # Safety
/// None beyond NVML's: callable from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    catch(|| do_init("nvmlInit_v2"))
}

/// Same as [`nvmlInit_v2`]; the flags are accepted and ignored.
///
/// # Safety
/// None beyond NVML's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    catch(|| do_init("nvmlInitWithFlags"))
}

/// Releases one init reference.
///
/// # Safety
/// None beyond NVML's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    let r = ffi("nvmlShutdown", || with_sim(|s| s.shutdown()));
    WAKE.notify_all();
    r
}

/// A static description of a return code.
///
/// # Safety
/// None: the returned pointer is a static NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        20 => c"Insufficient Memory",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// Writes the scenario's driver version.
///
/// # Safety
/// `version` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    ffi("nvmlSystemGetDriverVersion", || {
        let v = with_sim(|s| s.driver_version().map(str::to_owned))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(version, length, &v) }
    })
}

/// Writes the NVML library version (`12.<driver version>`).
///
/// # Safety
/// `version` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    ffi("nvmlSystemGetNVMLVersion", || {
        let v = with_sim(|s| s.driver_version().map(|v| format!("12.{v}")))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(version, length, &v) }
    })
}
