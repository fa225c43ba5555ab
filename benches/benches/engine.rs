//! The health engine's cost per kernel-log fault, on the engine thread alone
//! (`gpuwatch_core::engine::Engine::handle`: no sinks, no state file, no log
//! subscriber), on a manual clock. The events are what the kernel-log reader
//! hands the engine: the latency bench's XID 31 lines (`kmsg-latency.py`)
//! through `xid_parser::Scanner`, classified on the way, built before the
//! timing; each iteration clones one.
//!
//! What it shows (µs per event):
//!
//! - `engine_fault/new_gpu_each`: the latency bench's burst workload: every
//!   XID names a PCI address the engine has not seen, and no NVML confirms
//!   any GPU, so each event is a new fault on a new unconfirmed GPU: the
//!   join, the eviction of one of the 64 unconfirmed GPUs kept, the context
//!   rules, a new entry in the full recurrence history, an activation and the
//!   event's publication.
//! - `engine_fault/new_fault_known_gpu`: new faults (16 XID codes) spread over
//!   8 GPUs already tracked: no eviction (per event, over 16 events on a
//!   fresh engine).
//! - `engine_fault/repeat` (baseline, same run): a plain repeat of an active
//!   fault inside the dedup window, the engine's cheapest path (counters
//!   only): the floor of receiving one event.
//!
//! Run: `cargo bench -p gpuwatch-benches --bench engine -- --warm-up-time 1 --measurement-time 3`

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use gpuwatch_proto::FaultEvent;
use gpuwatch_test_support::engine::Rig;
use std::hint::black_box;
use std::sync::Arc;
use xid_parser::{Policy, RecordMeta, Scanner};

/// Distinct addresses cycled through: far more than the 64 unconfirmed GPUs
/// kept, so an address comes back only long after its GPU was evicted, and
/// twice the recurrence history's 4096 entries, so the history stays full
/// and keeps dropping its oldest entries, as in a long storm.
const ADDRESSES: u32 = 8192;

/// The kernel-log events of `lines` (`(pci bus number, XID code)`), as the
/// reader makes them: one record each, the scanner classifying.
fn events(lines: impl IntoIterator<Item = (u32, u32)>) -> Vec<FaultEvent> {
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut out = Vec::new();
    for (i, (bus, code)) in lines.into_iter().enumerate() {
        let i = i as u64;
        let message = format!(
            "NVRM: Xid (PCI:{:04x}:{:02x}:00): {code}, pid={i}, name=gpuwatch-bench-x {i}, \
             Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted \
             @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
            0x100 + (bus >> 8),
            bus & 0xff
        );
        let meta = RecordMeta {
            seq: Some(1000 + i),
            monotonic_usec: Some(5_000_000 + i * 100),
            time_unix_nano: Some(1_700_000_000_000_000_000 + i * 100_000),
            facility: Some(1),
            level: Some(4),
        };
        scanner.push(meta, &message, &mut out);
    }
    scanner.finish(&mut out);
    out
}

fn fault(rig: &mut Rig, ev: &FaultEvent) -> usize {
    rig.fault(ev.clone()).len()
}

/// An engine tracking the 64 unconfirmed GPUs it keeps at most, as a long
/// burst of new addresses leaves it, and the index of the next address.
fn full_rig(evs: &[FaultEvent]) -> (Rig, usize) {
    let mut rig = Rig::without_join_grace(None, "bench-boot");
    for ev in &evs[..200] {
        assert_eq!(fault(&mut rig, ev), 1, "a new fault is published");
    }
    (rig, 200)
}

fn bench(c: &mut Criterion) {
    let new_each = events((0..ADDRESSES).map(|bus| (bus, 31)));
    assert_eq!(new_each.len(), ADDRESSES as usize);
    let codes = [
        13u32, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95,
    ];
    let known = events(
        (0..8).map(|bus| (bus, 8)).chain(
            codes
                .iter()
                .enumerate()
                .map(|(i, &code)| (i as u32 % 8, code)),
        ),
    );
    assert_eq!(known.len(), 8 + codes.len());

    let mut g = c.benchmark_group("engine_fault");
    g.throughput(Throughput::Elements(1));

    let (mut rig, mut next) = full_rig(&new_each);
    g.bench_function("new_gpu_each", |b| {
        b.iter(|| {
            let n = fault(&mut rig, &new_each[next]);
            next = (next + 1) % new_each.len();
            black_box(n)
        })
    });

    g.throughput(Throughput::Elements(codes.len() as u64));
    g.bench_function("new_fault_known_gpu", |b| {
        b.iter_batched(
            || {
                let mut rig = Rig::without_join_grace(None, "bench-boot");
                for ev in &known[..8] {
                    fault(&mut rig, ev);
                }
                rig
            },
            |mut rig| {
                for ev in &known[8..] {
                    black_box(fault(&mut rig, ev));
                }
                rig
            },
            BatchSize::LargeInput,
        )
    });

    g.throughput(Throughput::Elements(1));
    let (mut rig, next) = full_rig(&new_each);
    let last = &new_each[next - 1];
    assert_eq!(fault(&mut rig, last), 0, "a repeat is not published again");
    g.bench_function("repeat", |b| b.iter(|| black_box(fault(&mut rig, last))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
