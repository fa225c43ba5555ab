//! Deterministic inputs for gpuwatch's criterion benches.
//!
//! - [`mixed_log`]: a realistic kernel log, mostly non-GPU lines (USB, network,
//!   filesystems, systemd, audit) with rare NVRM / AER lines, like a busy node's
//!   ring buffer.
//! - [`xid_storm`]: an XID storm (XID 13/31/43/79/94 lines, several GPUs).
#![warn(unreachable_pub)]
#![deny(missing_docs)]

use xid_parser::{RecordMeta, Scanner, parse_line};

/// A small deterministic PRNG (xorshift64*), so inputs are identical run to run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence depends only on `seed` (0 is taken as 1:
    /// xorshift never leaves the all-zero state).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    /// The next 64 bits of the sequence.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A value in `0..n` (`0..1` for `n = 0`), by modulo: slightly biased to
    /// low values, which the generated logs do not care about.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

const NOISE: &[&str] = &[
    "usb 1-1.4: new high-speed USB device number 7 using xhci_hcd",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "systemd[1]: Started Journal Service.",
    "audit: type=1400 audit(1709450000.123:42): apparmor=\"STATUS\" operation=\"profile_load\" profile=\"unconfined\" name=\"nvidia_modprobe\" pid=812 comm=\"apparmor_parser\"",
    "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 0): PCIe slot advertised sufficient power (75W).",
    "bond0: (slave eth1): link status definitely up, 100000 Mbps full duplex",
    "device vethb2c4e1f entered promiscuous mode",
    "cni0: port 3(vethb2c4e1f) entered forwarding state",
    "kauditd_printk_skb: 14 callbacks suppressed",
    "perf: interrupt took too long (2502 > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
    "xfs filesystem being remounted at /var/lib/kubelet/pods/3f1c/volumes supports timestamps until 2038",
    "TCP: request_sock_TCP: Possible SYN flooding on port 10250. Sending cookies.",
    "overlayfs: upper fs does not support RENAME_WHITEOUT.",
    "kvm: already loaded vendor module 'kvm_intel'",
    "random: crng init done",
];

const GPU: &[&str] = &[
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    "NVRM: Xid (PCI:0000:86:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_14 faulted @ 0x7f2f_cca58000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
];

/// XID lines of a storm (one per line, no prefix).
pub const STORM: &[&str] = &[
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    "NVRM: Xid (PCI:0000:86:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_14 faulted @ 0x7f2f_cca58000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "NVRM: Xid (PCI:0000:cb:00): 43, pid=29012, name=python3, Ch 00000008",
    "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:07:00): 94, pid=4142, name=python, Contained: SM (0x1). RST: No, D-RST: No",
];

/// A `dmesg`-format log of about `bytes` bytes, ~1 GPU-related line per 500.
pub fn mixed_log(bytes: usize) -> Vec<u8> {
    let mut rng = Rng::new(0x5eed);
    let mut out = Vec::with_capacity(bytes + 256);
    let mut t: u64 = 5_000_000;
    while out.len() < bytes {
        t += rng.below(20_000);
        let msg = if rng.below(500) == 0 {
            GPU[rng.below(GPU.len() as u64) as usize]
        } else {
            NOISE[rng.below(NOISE.len() as u64) as usize]
        };
        out.extend_from_slice(
            format!("[{:>5}.{:06}] {msg}\n", t / 1_000_000, t % 1_000_000).as_bytes(),
        );
    }
    out
}

/// The messages (no timestamp prefix) of a mixed log, for message-level benches.
pub fn mixed_messages(n: usize) -> Vec<String> {
    let mut rng = Rng::new(0x5eed);
    (0..n)
        .map(|_| {
            if rng.below(500) == 0 {
                GPU[rng.below(GPU.len() as u64) as usize].to_owned()
            } else {
                NOISE[rng.below(NOISE.len() as u64) as usize].to_owned()
            }
        })
        .collect()
}

/// `n` XID storm lines in `dmesg` format.
pub fn xid_storm(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let t = 1_000_000 + i as u64 * 10;
            format!(
                "[{:>5}.{:06}] {}",
                t / 1_000_000,
                t % 1_000_000,
                STORM[i % STORM.len()]
            )
        })
        .collect()
}

/// The gpuwatch hot path the benches measure, on saved-log lines: every line is
/// prefiltered ([`Scanner::interesting_line`]; `gpuwatch scan` searches whole
/// buffers instead, and skips it for the lines of a storm); a candidate that is
/// the driver's XID line as the kernel prints it is read in one step
/// ([`Scanner::push_kernel_xid_line`]), any other is parsed ([`parse_line`]:
/// format detection, prefix, UTF-8) and pushed through the [`Scanner`] (message
/// parse + multi-record assembly + classification). Each event is handed out
/// borrowed ([`Scanner::push_view`]: an XID line that is its own event is never
/// copied).
/// Returns the number of events.
pub fn scan_lines(
    lines: &[&[u8]],
    scanner: &mut Scanner,
    out: &mut Vec<gpuwatch_proto::FaultEvent>,
) -> usize {
    scan_lines_with(lines, scanner, out, Keep::Borrowed)
}

/// [`scan_lines`] with owned events ([`Scanner::push`]), each recycled once
/// counted ([`Scanner::recycle`]): a reader that needs owned events but keeps
/// none.
pub fn scan_lines_recycling(
    lines: &[&[u8]],
    scanner: &mut Scanner,
    out: &mut Vec<gpuwatch_proto::FaultEvent>,
) -> usize {
    scan_lines_with(lines, scanner, out, Keep::Recycled)
}

/// [`scan_lines`] as a reader that keeps its events runs it (the agent's kmsg
/// reader sends them to another thread): owned events, each dropped instead of
/// recycled, so every event allocates its strings anew.
pub fn scan_lines_dropping(
    lines: &[&[u8]],
    scanner: &mut Scanner,
    out: &mut Vec<gpuwatch_proto::FaultEvent>,
) -> usize {
    scan_lines_with(lines, scanner, out, Keep::Dropped)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    Borrowed,
    Recycled,
    Dropped,
}

fn scan_lines_with(
    lines: &[&[u8]],
    scanner: &mut Scanner,
    out: &mut Vec<gpuwatch_proto::FaultEvent>,
    keep: Keep,
) -> usize {
    let mut n = 0;
    for l in lines {
        if !Scanner::interesting_line(l) {
            continue;
        }
        if keep == Keep::Borrowed
            && scanner.push_kernel_xid_line(l, &mut |ev| {
                n += 1;
                std::hint::black_box(ev);
            })
        {
            continue;
        }
        let line = parse_line(l);
        let meta = RecordMeta {
            monotonic_usec: line.monotonic_usec,
            ..Default::default()
        };
        if keep == Keep::Borrowed {
            scanner.push_view(meta, &line.message, &mut |ev| {
                n += 1;
                std::hint::black_box(ev);
            });
            continue;
        }
        scanner.push(meta, &line.message, out);
        n += out.len();
        for ev in out.drain(..) {
            if keep == Keep::Recycled {
                // Done with it: its buffers serve the next events.
                scanner.recycle(ev);
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic_and_sized() {
        let a = mixed_log(100_000);
        assert!(a.len() >= 100_000);
        assert_eq!(a, mixed_log(100_000));
        let storm = xid_storm(10);
        assert!(storm[3].contains(": 79,"));
    }
}
