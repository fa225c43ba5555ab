//! The GPU's NVLink fabric registration, read through NVML's raw symbols:
//! nvml-wrapper 0.13 has no wrapper for `nvmlDeviceGetGpuFabricInfoV` or
//! `nvmlDeviceGetGpuFabricInfo`, so this module calls them through the
//! function table nvml-wrapper already loaded (`Nvml::lib`), checking first
//! that the driver exports them (an older driver does not: not supported).
//!
//! `nvmlDeviceGetGpuFabricInfoV` (driver 550 and later) is asked for the v3
//! struct, then v2 when the library answers `ARGUMENT_VERSION_MISMATCH` (a
//! driver that knows only v2); without the symbol, the v1 call (no health
//! mask) is used.
#![allow(unsafe_code)]

use gpuwatch_proto::GpuFabric;
use gpuwatch_proto::fabric::{self, FabricState, Reading};
use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper_sys::bindings as sys;
use std::os::raw::c_uint;

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)`: the struct size with the version
/// in the top byte (`nvml.h`).
const V3: c_uint = size_of::<sys::nvmlGpuFabricInfo_v3_t>() as c_uint | (3 << 24);
/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`.
const V2: c_uint = size_of::<sys::nvmlGpuFabricInfo_v2_t>() as c_uint | (2 << 24);

/// The NVML function the read used (for the failed-call counter and the
/// call watchdog).
pub(super) const CALL: &str = "nvmlDeviceGetGpuFabricInfoV";

/// The fabric registration of `dev`. `NotSupported` (also for a driver
/// without either symbol) means the GPU has no fabric information.
pub(super) fn read(dev: &Device<'_>) -> Result<GpuFabric, NvmlError> {
    let lib = dev.nvml().lib();
    // SAFETY: the handle belongs to `dev`, alive for the call; nvml-wrapper
    // hands it out for calls it does not wrap.
    let handle = unsafe { dev.handle() };
    if let Ok(get) = &lib.nvmlDeviceGetGpuFabricInfoV {
        for version in [V3, V2] {
            // SAFETY: all-zero is a valid value of this plain C struct.
            let mut info: sys::nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
            info.version = version;
            // SAFETY: `info` is a v3 struct, large enough for either version
            // the call is told (v2 is its prefix); the handle is valid.
            let ret = unsafe { get(handle, &raw mut info) };
            if ret == sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH {
                continue;
            }
            nvml_try(ret)?;
            return Ok(from_raw(
                info.state,
                info.status,
                info.cliqueId,
                &info.clusterUuid,
                Some(info.healthMask),
            ));
        }
        return Err(NvmlError::NotSupported);
    }
    let Ok(get) = &lib.nvmlDeviceGetGpuFabricInfo else {
        return Err(NvmlError::NotSupported);
    };
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: sys::nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is the v1 struct the call writes; the handle is valid.
    nvml_try(unsafe { get(handle, &raw mut info) })?;
    Ok(from_raw(
        info.state,
        info.status,
        info.cliqueId,
        &info.clusterUuid,
        None,
    ))
}

/// The schema's form of NVML's struct: state and status by name, the
/// cluster UUID in canonical form (empty when all zero). The status only
/// means something once the registration completed; before, it is left
/// empty.
fn from_raw(
    state: u8,
    status: u32,
    clique_id: u32,
    uuid: &[u8; 16],
    health_mask: Option<u32>,
) -> GpuFabric {
    let state = FabricState::from_nvml(state);
    let status = if state == FabricState::Completed {
        fabric::status_name(status)
    } else {
        String::new()
    };
    GpuFabric::from(Reading {
        state,
        status,
        clique_id,
        cluster_uuid: canonical_uuid(uuid),
        health_mask,
    })
}

fn canonical_uuid(b: &[u8; 16]) -> String {
    if b.iter().all(|&x| x == 0) {
        return String::new();
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_fields_become_the_schema_form() {
        let uuid = [
            0x6e, 0x1c, 0x7a, 0x52, 0x3b, 0x1d, 0x4f, 0x0e, 0x9a, 0x55, 0x2f, 0x8a, 0x3c, 0x9e,
            0x0d, 0x11,
        ];
        let f = from_raw(3, 23, 4, &uuid, Some(0x1AA));
        assert_eq!(f.state, "completed");
        assert_eq!(f.status, "insufficient_resources");
        assert_eq!(f.cluster_uuid, "6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11");
        assert_eq!(f.health_mask, Some(0x1AA));
        let pending = from_raw(2, 0, 0, &[0; 16], None);
        assert_eq!(pending.state, "in_progress");
        assert_eq!(pending.status, "", "no status before completion");
        assert_eq!(pending.cluster_uuid, "");
        assert_eq!(from_raw(9, 0, 0, &[0; 16], None).state, "unknown_9");
    }

    #[test]
    fn struct_versions_are_nvml_h_s() {
        // nvml.h: v2 is 36 bytes (version, 16-byte UUID, status, clique,
        // state, padding, health mask), v3 adds the summary byte (40 with padding).
        assert_eq!(V2, 36 | 2 << 24);
        assert_eq!(V3, 40 | 3 << 24);
    }
}
