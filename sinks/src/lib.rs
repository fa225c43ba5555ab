//! gpuwatch sinks (placeholder; being written).
