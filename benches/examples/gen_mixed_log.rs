//! Writes the benches' mixed kernel log (`gpuwatch_benches::mixed_log`) to stdout:
//! `gen_mixed_log [BYTES]` (default 64 MiB). Used by `benches/scripts/rg-compare.sh`.

use std::io::Write;

fn main() -> std::io::Result<()> {
    let bytes = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(64 << 20);
    std::io::stdout()
        .lock()
        .write_all(&gpuwatch_benches::mixed_log(bytes))
}
