//! NVML simulator (placeholder; being written).
