#!/usr/bin/env python3
"""Writes a kmsg-format replay file (`PRI,SEQ,TS_USEC,FLAGS;MSG`) for gpuwatch
benchmarks: mostly ordinary kernel lines, an NVRM XID line every N records
(spread over 256 GPUs and a few codes so the engine sees distinct faults).

usage: gen-kmsg.py OUT RECORDS [XID_EVERY]
"""
import sys

NOISE = [
    "6,{seq},{ts},-;eth0: renamed from veth1a2b3c",
    "6,{seq},{ts},-;IPv6: ADDRCONF(NETDEV_CHANGE): cali1234abcd: link becomes ready",
    "4,{seq},{ts},-;nvme nvme0: I/O 512 QID 7 timeout, completion polled",
    "6,{seq},{ts},-;audit: type=1400 audit({ts}.123:42): apparmor=\"DENIED\" operation=\"open\" profile=\"cri-containerd\"",
    "6,{seq},{ts},-;EXT4-fs (nvme1n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
    "7,{seq},{ts},-;systemd[1]: Started cri-containerd-0123456789abcdef.scope.",
]
XIDS = [
    "3,{seq},{ts},-;NVRM: Xid (PCI:0000:{bus:02x}:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    "3,{seq},{ts},-;NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid=2345, name=train.py, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    "3,{seq},{ts},-;NVRM: Xid (PCI:0000:{bus:02x}:00): 31, pid=3456, name=infer, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "3,{seq},{ts},-;NVRM: Xid (PCI:0000:{bus:02x}:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
]


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    every = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    with open(out, "w", buffering=1 << 20) as f:
        xi = 0
        for seq in range(n):
            ts = 1_000_000 + seq * 10
            if every and seq % every == every - 1:
                f.write(XIDS[xi % len(XIDS)].format(seq=seq, ts=ts, bus=xi % 256) + "\n")
                xi += 1
            else:
                f.write(NOISE[seq % len(NOISE)].format(seq=seq, ts=ts) + "\n")


if __name__ == "__main__":
    main()
