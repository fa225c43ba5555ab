//! One sysfs scan of an 8-NIC node by the agent's NIC reader
//! (`gpuwatch::NicReader`), over the fake sysfs tree of
//! `gpuwatch_test_support::sysfs` (8 mlx5 devices, one port each, alternately
//! InfiniBand NDR and RoCE; per port 12 error counters, 27 `hw_counters`,
//! the netdev's `carrier_changes` on RoCE ports).
//!
//! What it shows:
//!
//! - `nic_scan/8_nics` (µs per scan): the steady state, the layout cached:
//!   one listing of `class/infiniband` and one open + read + close per file.
//! - `nic_scan/8_nics_first_scan`: a fresh reader's first scan, which lays the
//!   node out (lists every port's counter directories, resolves the device
//!   links, reads `numa_node` and `dev_port`); a steady reader does this only
//!   when devices change and every 60th scan.
//!
//! - `nic_scan/bare_open_read_close` (baseline, same run): the same 348 files
//!   opened, read once into a buffer and closed, nothing parsed or kept: the
//!   floor for reading them one file at a time.
//! - `nic_scan/naive_read_to_string` (baseline): the same files with
//!   `std::fs::read_to_string` each (which also `statx`es each file and reads
//!   until end of file), parsed as numbers where they are numbers.
//!
//! The tree is a regular directory (tmpfs or ext4 in the page cache), so this
//! measures the reader's own cost: path walk, syscalls, parsing, the scan's
//! allocations. On a real node a `counters/` read also costs the driver a
//! PortCounters MAD to the firmware and a `hw_counters/` read a firmware
//! query (cached by the RDMA core for `lifespan` ms), which this does not.
//! Syscalls per scan: `benches/examples/nic_scan.rs` under `strace -c`.
//!
//! Run: `cargo bench -p gpuwatch-benches --bench nic -- --warm-up-time 1 --measurement-time 3`

use criterion::{Criterion, criterion_group, criterion_main};
use gpuwatch::{ERROR_COUNTERS, NicReader};
use gpuwatch_test_support::sysfs::FakeSysfs;
use std::fs::File;
use std::hint::black_box;
use std::io::Read;
use std::time::Instant;

fn bench(c: &mut Criterion) {
    let fake = FakeSysfs::node_of(8);
    let mut reader = NicReader::new(fake.root().to_path_buf());
    let first = reader.scan(Instant::now());
    assert!(first.complete && first.problems.is_empty() && first.ports.len() == 8);
    assert_eq!(first.ports[0].counters.len(), 12 + 27);

    // What a steady scan reads: per port its four state files and every
    // counter it reports, and the netdev's carrier_changes on RoCE ports.
    let mut files = Vec::new();
    for p in &first.ports {
        let dir = fake.port_dir(&p.id.device, p.id.port);
        for f in ["state", "phys_state", "rate", "link_layer"] {
            files.push(dir.join(f));
        }
        for counter in &p.counters {
            let sub = if ERROR_COUNTERS.contains(&counter.name.as_str()) {
                "counters"
            } else {
                "hw_counters"
            };
            files.push(dir.join(sub).join(&counter.name));
        }
        if p.carrier_changes.is_some() {
            let netdev = p.netdev.as_deref().expect("a RoCE port's netdev");
            files.push(
                fake.root()
                    .join("class/net")
                    .join(netdev)
                    .join("carrier_changes"),
            );
        }
    }
    assert_eq!(files.len(), 348);

    let mut g = c.benchmark_group("nic_scan");
    g.bench_function("bare_open_read_close", |b| {
        let mut buf = [0u8; 256];
        b.iter(|| {
            let mut n = 0;
            for f in &files {
                n += File::open(f)
                    .and_then(|mut f| f.read(&mut buf))
                    .unwrap_or(0);
            }
            black_box(n)
        });
    });
    g.bench_function("naive_read_to_string", |b| {
        b.iter(|| {
            let mut n = 0u64;
            for f in &files {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                n = n.wrapping_add(text.trim().parse::<u64>().unwrap_or(1));
            }
            black_box(n)
        });
    });
    g.bench_function("8_nics", |b| {
        b.iter(|| black_box(reader.scan(Instant::now())));
    });
    g.bench_function("8_nics_first_scan", |b| {
        b.iter(|| black_box(NicReader::new(fake.root().to_path_buf()).scan(Instant::now())));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
