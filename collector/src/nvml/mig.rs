//! A GPU's MIG mode (current and pending) and, while it is on, its MIG
//! devices: each device's UUID (the id the NVIDIA device plugin gives pods
//! for `nvidia.com/mig-*`, and PodResources lists), GPU instance id, compute
//! instance id and profile.
//!
//! nvml-wrapper 0.13 wraps `nvmlDeviceGetMigMode`,
//! `nvmlDeviceGetMaxMigDeviceCount`, `nvmlDeviceGetMigDeviceHandleByIndex`,
//! `nvmlDeviceGetUUID`, `nvmlDeviceGetAttributes_v2` and
//! `nvmlDeviceGetMemoryInfo_v2`, but not `nvmlDeviceGetGpuInstanceId` /
//! `nvmlDeviceGetComputeInstanceId`: those two are called through the
//! function table it loaded, like the fabric calls.
//!
//! A MIG device whose reads fail is kept, with the failed call in its
//! `error`: a monitoring problem of that instance, not of the GPU. Only
//! `GPU_IS_LOST` (the whole GPU fell off the bus) fails the GPU's poll.
#![allow(unsafe_code)]

use gpuwatch_proto::MigDevice;
use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::struct_wrappers::device::DeviceAttributes;
use std::os::raw::c_uint;

/// The NVML call a failed enumeration is counted under.
pub(super) const CALL: &str = "nvmlDeviceGetMigDeviceHandleByIndex";

/// MIG mode: (current, pending). `NotSupported`: no MIG on this GPU.
pub(super) fn mode(dev: &Device<'_>) -> Result<(bool, bool), NvmlError> {
    // NVML_DEVICE_MIG_ENABLE.
    dev.mig_mode().map(|m| (m.current == 1, m.pending == 1))
}

/// The MIG devices of `dev` (MIG mode on). A slot without a device answers
/// `NOT_FOUND` and is skipped; a device that fails is kept with its error,
/// and the failure is counted with `count`. `Err` only for the enumeration
/// itself, or `GpuLost` from any call.
pub(super) fn devices(
    dev: &Device<'_>,
    count: &dyn Fn(&'static str),
) -> Result<Vec<MigDevice>, NvmlError> {
    let max = dev.mig_device_count()?;
    // The GPU's memory names the profiles' memory; without it the profile
    // is left empty, the devices still listed.
    let gpu_bytes = match dev.memory_info() {
        Ok(m) => Some(m.total),
        Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost),
        Err(e) => {
            count("nvmlDeviceGetMemoryInfo_v2");
            tracing::debug!(error = %e, "NVML cannot read the GPU's memory size; MIG profiles unnamed.");
            None
        }
    };
    let mut out = Vec::new();
    for i in 0..max {
        let mig = match dev.mig_device_by_index(i) {
            Ok(m) => m,
            Err(NvmlError::NotFound) => continue,
            Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost),
            Err(e) => {
                count(CALL);
                out.push(MigDevice {
                    error: format!("{CALL} (index {i}): {e}"),
                    ..MigDevice::default()
                });
                continue;
            }
        };
        out.push(device(&mig, gpu_bytes, count)?);
    }
    Ok(out)
}

/// One MIG device: what could be read, and the first failure.
fn device(
    mig: &Device<'_>,
    gpu_bytes: Option<u64>,
    count: &dyn Fn(&'static str),
) -> Result<MigDevice, NvmlError> {
    let mut error = String::new();
    let mut read = |call: &'static str, r: Result<_, NvmlError>| match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::GpuLost) => Err(NvmlError::GpuLost),
        Err(e) => {
            count(call);
            if error.is_empty() {
                error = format!("{call}: {e}");
            }
            Ok(None)
        }
    };
    let uuid = read("nvmlDeviceGetUUID", mig.uuid().map(Value::Text))?;
    let gi = read(
        "nvmlDeviceGetGpuInstanceId",
        instance_id(mig, Which::Gpu).map(Value::Id),
    )?;
    let ci = read(
        "nvmlDeviceGetComputeInstanceId",
        instance_id(mig, Which::Compute).map(Value::Id),
    )?;
    let attrs = read(
        "nvmlDeviceGetAttributes_v2",
        mig.attributes().map(Value::Attrs),
    )?;
    let mut d = MigDevice::default();
    if let Some(Value::Text(u)) = uuid {
        d.uuid = u;
    }
    if let Some(Value::Id(v)) = gi {
        d.gpu_instance = v;
    }
    if let Some(Value::Id(v)) = ci {
        d.compute_instance = v;
    }
    if let Some(Value::Attrs(a)) = attrs {
        d.gpu_slices = a.gpu_instance_slice_count;
        d.compute_slices = a.compute_instance_slice_count;
        d.memory_mib = a.memory_size_mb;
        if let Some(total) = gpu_bytes {
            d.profile = profile_name(
                a.compute_instance_slice_count,
                a.gpu_instance_slice_count,
                a.memory_size_mb,
                total,
            );
        }
    }
    d.error = error;
    Ok(d)
}

/// One MIG device reading (the readings share one error path).
enum Value {
    Text(String),
    Id(u32),
    Attrs(DeviceAttributes),
}

/// The profile as the NVIDIA device plugin names its resource
/// (`nvidia.com/mig-<profile>`): `<g>g.<gb>gb`, or `<c>c.<g>g.<gb>gb` when
/// the compute instance has fewer slices than its GPU instance. The memory is
/// named as NVIDIA go-nvlib's `getMigMemorySizeGB` does: the device's share
/// of the GPU's memory rounded up to an eighth, times the GPU's memory in
/// whole GB (rounded up), rounded to the nearest GB.
pub(crate) fn profile_name(c: u32, g: u32, memory_mib: u64, gpu_bytes: u64) -> String {
    const GB: u64 = 1 << 30;
    const MB: u64 = 1 << 20;
    if gpu_bytes == 0 || g == 0 {
        return String::new();
    }
    // Eighths rounded up, in integers: ceil(8 × mem / total).
    let eighths = (8 * u128::from(memory_mib) * u128::from(MB)).div_ceil(u128::from(gpu_bytes));
    let total_gb = u128::from(gpu_bytes.div_ceil(GB));
    // round(eighths / 8 × total_gb), half away from zero.
    let gb = (2 * eighths * total_gb + 8) / 16;
    if c == g {
        format!("{g}g.{gb}gb")
    } else {
        format!("{c}c.{g}g.{gb}gb")
    }
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

#[cfg(test)]
mod tests {
    use super::profile_name;

    /// Profile names from the slice counts and memory NVML reports, as the
    /// device plugin names them (NVIDIA's MIG user guide profile tables).
    #[test]
    fn profiles_are_named_as_the_device_plugin_names_them() {
        // H100 SXM 80 GB: 81559 MiB.
        let h100 = 81_559 * (1 << 20);
        assert_eq!(profile_name(1, 1, 9_856, h100), "1g.10gb");
        assert_eq!(profile_name(1, 1, 19_968, h100), "1g.20gb");
        assert_eq!(profile_name(3, 3, 40_192, h100), "3g.40gb");
        assert_eq!(profile_name(7, 7, 80_896, h100), "7g.80gb");
        assert_eq!(profile_name(1, 2, 20_096, h100), "1c.2g.20gb");
        // A100 40 GB: 40536 MiB.
        let a100 = 40_536 * (1 << 20);
        assert_eq!(profile_name(1, 1, 4_864, a100), "1g.5gb");
        assert_eq!(profile_name(7, 7, 40_192, a100), "7g.40gb");
        assert_eq!(profile_name(1, 1, 100, 0), "", "no GPU memory read");
    }
}
