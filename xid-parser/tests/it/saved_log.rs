//! `saved_log::read_events` (block reads, whole-buffer marker search, lines and
//! NUL pieces cut around hits, borrowed events) against `read_events_plain`, the
//! plain per-line definition: the same events and the same counts, whatever the
//! read sizes.

use gpuwatch_proto::FaultEvent;
use std::io::Read;
use std::sync::Arc;
use xid_parser::Policy;
use xid_parser::saved_log::{
    BLOCK_BYTES, LogCounts, LogOptions, MAX_LINE_BYTES, read_events, read_events_plain,
};

fn read(
    input: &mut dyn Read,
    policy: &Arc<Policy>,
    opts: LogOptions,
) -> (Vec<FaultEvent>, LogCounts) {
    let mut events = Vec::new();
    let mut counts = LogCounts::default();
    read_events(input, policy, opts, &mut counts, |ev| {
        events.push(ev.to_event());
        Ok::<(), ()>(())
    })
    .expect("in-memory reads do not fail");
    (events, counts)
}

/// Hands out at most `step` bytes per read, so lines straddle every refill.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn fixed_log_at_every_read_size() {
    let policy = Arc::new(Policy::default());
    let mut input = Vec::new();
    for i in 0..40u32 {
        let t = 100 + i;
        input.extend_from_slice(
            format!(
                "[{t}.000001] usb 1-1: new high-speed USB device number {i}\n\
                 [{t}.000002] pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0\n\
                 Mar  3 12:00:{:02} node sshd[12]: Accepted publickey for root\n\
                 [{t}.000003] nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n\
                 Mar  3 12:00:{:02} node python[7]: NVRM: Xid (PCI:0000:3b:00): 79, fake\n\
                 [{t}.000004] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=python, Graphics Exception\n\
                 [{t}.000005] NVRM: Xid (PCI:0000:3b:00): 119, pid=1, Timeout waiting for RPC from GSP\n\
                 [{t}.000006] NVRM: GPU0 RPC history (CPU -> GSP):\n\
                 [{t}.000007] random: crng init done\n\
                 bin\0ary NVRM: Xid (PCI:0000:3b:00): 13, x\n\
                 \n",
                i % 60,
                i % 60
            )
            .as_bytes(),
        );
        if i % 13 == 0 {
            input.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 3 + i as usize));
            input.push(b'\n');
        }
    }
    input.extend_from_slice(b"[999.0] NVRM: Xid (PCI:0000:3c:00): 48, DBE (0x1)");
    for opts in [
        LogOptions::default(),
        LogOptions {
            accept_user_facility: true,
            yearless_now: Some(1_700_000_000_000_000_000),
        },
    ] {
        let (want, want_counts) = read_events_plain(&input, &policy, opts);
        assert!(want.len() > 100, "{}", want.len());
        for step in [usize::MAX, 7, 4096, MAX_LINE_BYTES + 1, BLOCK_BYTES / 3] {
            let (got, counts) = read(&mut Trickle { data: &input, step }, &policy, opts);
            assert_eq!(got, want, "step {step}, {opts:?}");
            assert_eq!(counts, want_counts, "step {step}, {opts:?}");
        }
        if !opts.accept_user_facility {
            // Only user-space lines with a marker are counted.
            assert_eq!(want_counts.skipped_non_kernel_lines, 40);
        }
    }
}

/// Hands out reads of pseudo-random sizes (1 byte up to a few blocks), so
/// markers, newlines and NUL runs fall on every kind of read boundary.
struct Jitter<'a> {
    data: &'a [u8],
    rng: u64,
}

fn next(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

impl Read for Jitter<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = match next(&mut self.rng) % 4 {
            0 => 1 + next(&mut self.rng) as usize % 16,
            1 => 1 + next(&mut self.rng) as usize % 4096,
            2 => 1 + next(&mut self.rng) as usize % (MAX_LINE_BYTES + 100),
            _ => usize::MAX,
        };
        let n = want.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Random logs of lines that start, continue and end held events, user-space
/// lines with markers, NUL padding, lines around the length limit (with and
/// without markers, at the front and back) and no final newline.
fn random_log(rng: &mut u64) -> Vec<u8> {
    const LINES: &[&str] = &[
        "[  1.000001] usb 1-1: new high-speed USB device number 3",
        "[  1.000002] pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
        "[  1.000003] nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
        "[  1.000004] nvidia 0000:01:00.0:   device [10de:2330] error status/mask=00000001/0000e000",
        "[  1.000005] nvidia 0000:01:00.0:    [ 0] RxErr",
        "[  1.000006] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=python, Graphics Exception",
        "[  1.000007] NVRM: Xid (PCI:0000:3b:00): 119, pid=1, Timeout waiting for RPC from GSP",
        "[  1.000008] NVRM: GPU0 RPC history (CPU -> GSP):",
        "[  1.000009] NVRM:     entry 1",
        "[  1.000010] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[  1.000011] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "[  1.000012] random: crng init done",
        "Mar  3 12:00:01 node python[7]: NVRM: Xid (PCI:0000:3b:00): 79, fake",
        "Mar  3 12:00:02 node sshd[12]: Accepted publickey for root",
        "Mar  3 12:00:03 node kernel: [ 9.5] NVRM: Xid (PCI:0000:3c:00): 48, DBE (0x1)",
        "6,17,2000000,-;NVRM: Xid (PCI:0000:3d:00): 31, pid=2, name=x, Ch 00000008",
        "14,18,2000001,-;NVRM: Xid (PCI:0000:3d:00): 31, user space",
        "6,19,2000002,-;NVRM: Xid (PCI:0000:3e:00): 43, pid=3, name=\\x41bc, Ch 00000001",
        "[  1.000013] sxid: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress",
        "[  1.000014] sxid: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 32",
        "[  1.000015] mce: [Hardware Error]: Machine check events logged",
        "[  1.000016] EDAC MC0: 1 CE memory read error",
        "[  1.000017] CPU0: Core temperature above threshold, cpu clock throttled",
        "garbage\0\0\0\0[  2.0] NVRM: Xid (PCI:0000:3f:00): 79, x",
        "\0\0\0\0\0\0\0\0",
        "",
        "    [",
    ];
    let mut log = Vec::new();
    let n = 20 + next(rng) % 200;
    for _ in 0..n {
        match next(rng) % 20 {
            0 => {
                // Around the limit: too long by 1 or fitting exactly (`\n` and
                // a `\r` allowed), with a marker at either end or none.
                let len = MAX_LINE_BYTES + (next(rng) % 4) as usize;
                let mut line = vec![b'x'; len];
                match next(rng) % 3 {
                    0 => line[..4].copy_from_slice(b"Xid "),
                    1 => line[len - 4..].copy_from_slice(b"NVRM"),
                    _ => {}
                }
                log.extend_from_slice(&line);
            }
            1 => log.extend(std::iter::repeat_n(b'y', 3 * MAX_LINE_BYTES)),
            _ => {
                let l = LINES[next(rng) as usize % LINES.len()];
                log.extend_from_slice(l.as_bytes());
            }
        }
        log.push(b'\n');
    }
    if next(rng).is_multiple_of(2) {
        log.pop();
    }
    log
}

#[test]
fn random_logs_at_random_read_sizes() {
    let policy = Arc::new(Policy::default());
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut events = 0;
    for round in 0..60 {
        let input = random_log(&mut rng);
        let opts = LogOptions {
            accept_user_facility: round % 3 == 0,
            yearless_now: None,
        };
        let (want, want_counts) = read_events_plain(&input, &policy, opts);
        events += want.len();
        let seed = next(&mut rng);
        let (got, counts) = read(
            &mut Jitter {
                data: &input,
                rng: seed | 1,
            },
            &policy,
            opts,
        );
        assert_eq!(got, want, "round {round}");
        assert_eq!(counts, want_counts, "round {round}");
    }
    assert!(events > 500, "{events}");
}
