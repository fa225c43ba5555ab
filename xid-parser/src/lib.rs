//! Kernel log parser (placeholder; being written).
