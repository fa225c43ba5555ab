//! A GPU's MIG devices while MIG mode is on: each device's UUID (the id the
//! NVIDIA device plugin gives pods for `nvidia.com/mig-*`), its GPU instance
//! id and compute instance id. nvml-wrapper 0.13 enumerates the MIG handles
//! (`nvmlDeviceGetMaxMigDeviceCount`, `nvmlDeviceGetMigDeviceHandleByIndex`)
//! but does not wrap `nvmlDeviceGetGpuInstanceId` /
//! `nvmlDeviceGetComputeInstanceId`; those two are called through the
//! function table it loaded, like the fabric calls.
#![allow(unsafe_code)]

use gpuwatch_proto::MigDevice;
use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use std::os::raw::c_uint;

/// The NVML call a failed enumeration is counted under.
pub(super) const CALL: &str = "nvmlDeviceGetMigDeviceHandleByIndex";

/// Whether MIG mode is on now (`None`: the GPU has no MIG support).
pub(super) fn enabled(dev: &Device<'_>) -> Result<bool, NvmlError> {
    // NVML_DEVICE_MIG_ENABLE.
    dev.mig_mode().map(|m| m.current == 1)
}

/// The MIG devices of `dev` (MIG mode on). A slot without a device answers
/// `NOT_FOUND` and is skipped.
pub(super) fn devices(dev: &Device<'_>) -> Result<Vec<MigDevice>, NvmlError> {
    let max = dev.mig_device_count()?;
    let mut out = Vec::new();
    for i in 0..max {
        let mig = match dev.mig_device_by_index(i) {
            Ok(m) => m,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(e),
        };
        out.push(MigDevice {
            uuid: mig.uuid()?,
            gpu_instance: instance_id(&mig, Which::Gpu)?,
            compute_instance: instance_id(&mig, Which::Compute)?,
        });
    }
    Ok(out)
}

enum Which {
    Gpu,
    Compute,
}

fn instance_id(mig: &Device<'_>, which: Which) -> Result<u32, NvmlError> {
    let lib = mig.nvml().lib();
    let sym = match which {
        Which::Gpu => lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        Which::Compute => lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    };
    let Ok(get) = sym else {
        return Err(NvmlError::NotSupported);
    };
    let mut id: c_uint = 0;
    // SAFETY: the handle is a MIG device handle NVML just returned, alive
    // with `mig`; `id` is the one `unsigned int` the call writes.
    nvml_try(unsafe { get(mig.handle(), &raw mut id) })?;
    Ok(id)
}
