//! Writes the benches' inputs to stdout, for `benches/scripts/rg-compare.sh`:
//! `gen_mixed_log [BYTES]` the mixed kernel log (`gpuwatch_benches::mixed_log`,
//! default 64 MiB); `gen_mixed_log storm LINES` an XID storm in `dmesg` format
//! (`gpuwatch_benches::xid_storm`).

use std::io::Write;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.first().map(String::as_str) == Some("storm") {
        let lines = args
            .get(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        for l in gpuwatch_benches::xid_storm(lines) {
            out.write_all(l.as_bytes())?;
            out.write_all(b"\n")?;
        }
        return out.flush();
    }
    let bytes = args
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64 << 20);
    out.write_all(&gpuwatch_benches::mixed_log(bytes))?;
    out.flush()
}
