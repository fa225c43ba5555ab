//! Scans the fake 8-NIC sysfs tree of `benches/nic.rs` a given number of
//! times with one `NicReader`, for counting the syscalls of a scan: run it
//! under `strace -c -f` with 1 and with 101 scans, and the difference of the
//! totals over 100 is one steady-state scan (the tree's creation and the
//! first scan, which lays the node out, cancel out); with 0 and 1 scans, the
//! difference is the first scan.
//!
//! Run: `cargo build --profile bench -p gpuwatch-benches --example nic_scan`,
//! then `strace -c -f target/release/examples/nic_scan 101` (prints the ports
//! read and the mean time per scan after the first).

use gpuwatch::NicReader;
use gpuwatch_test_support::sysfs::FakeSysfs;
use std::time::Instant;

fn main() {
    let scans: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(101);
    let fake = FakeSysfs::node_of(8);
    let mut reader = NicReader::new(fake.root().to_path_buf());
    let mut ports = 0;
    let mut started = None;
    for i in 0..scans {
        if i == 1 {
            started = Some(Instant::now());
        }
        let scan = reader.scan(Instant::now());
        assert!(scan.complete && scan.problems.is_empty(), "{scan:?}");
        ports = scan.ports.len();
    }
    match started {
        Some(t) => println!(
            "{scans} scans of {ports} ports; {:.1} µs per scan after the first",
            t.elapsed().as_secs_f64() * 1e6 / f64::from(scans - 1)
        ),
        None => println!("{scans} scans of {ports} ports"),
    }
}
