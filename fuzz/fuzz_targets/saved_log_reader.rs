//! Fuzzes the saved-log reader `gpuwatch scan` uses (`xid_parser::saved_log`):
//! input detection (gzip by magic bytes, multi-member; `nvidia-bug-report.log`
//! kernel-log sections), the block reader with its whole-buffer marker search,
//! long lines and NUL padding, with reads of every size.
//!
//! Invariants: no panic; the events and line counts equal the plain definition
//! (`read_events_plain`: every line split on `\n`, NUL pieces apart, decoded and
//! pushed through a `Scanner`, no prefilter, no blocks), whether the text comes plain, gzip'd (one
//! or two members), or as the kernel-log section of a bug report (plain or
//! gzip'd) whose other sections repeat the same text and are never read.
#![no_main]

use flate2::{Compression, write::GzEncoder};
use gpuwatch_proto::FaultEvent;
use libfuzzer_sys::fuzz_target;
use std::io::{BufReader, Read, Write};
use std::sync::{Arc, OnceLock};
use xid_parser::saved_log::{
    LogCounts, LogOptions, ReadError, open_log, read_events, read_events_plain,
};
use xid_parser::Policy;

static POLICY: OnceLock<Arc<Policy>> = OnceLock::new();

const BUG_REPORT_START: &[u8] = b"Start of NVIDIA bug report log file";
const SEPARATOR: &[u8] = b"____________________________________________\n";

/// Hands out at most `step` bytes per read.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    step: usize,
}

impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn gzip(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(part).expect("in memory");
        out.extend(enc.finish().expect("in memory"));
    }
    out
}

/// Events and line counts of `input` read through `open_log` and `read_events`;
/// Err: the input is not valid gzip.
fn read(
    input: Vec<u8>,
    step: usize,
    policy: &Arc<Policy>,
) -> std::io::Result<(Vec<FaultEvent>, LogCounts)> {
    let reader = BufReader::with_capacity(
        1 + step % 4096,
        Trickle {
            data: input,
            at: 0,
            step,
        },
    );
    let mut text = open_log(Box::new(reader))?;
    let mut events = Vec::new();
    let mut counts = LogCounts::default();
    read_events(
        &mut text,
        policy,
        LogOptions::default(),
        &mut counts,
        |ev| {
            events.push(ev.to_event());
            Ok::<(), ()>(())
        },
    )
    .map_err(|e| match e {
        ReadError::Read(e) => e,
        ReadError::Sink(()) => unreachable!("the sink never fails"),
    })?;
    Ok((events, counts))
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, text)) = data.split_first() else {
        return;
    };
    let policy = POLICY.get_or_init(|| Arc::new(Policy::default()));
    // Text that would itself be read as gzip or as a bug report is not plain text.
    if text.starts_with(&[0x1f, 0x8b])
        || memchr::memmem::find(&text[..text.len().min(512)], BUG_REPORT_START).is_some()
        || memchr::memmem::find(text, &SEPARATOR[..20]).is_some()
    {
        // Never panics; invalid gzip is an error.
        let _ = read(text.to_vec(), 1 + usize::from(sel), policy);
        return;
    }
    let want = read_events_plain(text, policy, LogOptions::default());
    let step = 1 + usize::from(sel >> 2) * 97;
    let input = match sel & 3 {
        0 => text.to_vec(),
        1 => {
            let cut = text.len() * usize::from(sel >> 4) / 16;
            gzip(&[&text[..cut], &text[cut..]])
        }
        _ => {
            let mut report = Vec::new();
            report.extend_from_slice(BUG_REPORT_START);
            report.extend_from_slice(b".\nnvidia-bug-report.sh Version: 0\n");
            report.extend_from_slice(SEPARATOR);
            report.extend_from_slice(b"*** /etc/modprobe.d/nvidia.conf\n");
            report.extend_from_slice(text);
            report.extend_from_slice(b"\n");
            report.extend_from_slice(SEPARATOR);
            report.extend_from_slice(b"*** /var/log/kern.log\n");
            report.extend_from_slice(text);
            if !text.is_empty() && !text.ends_with(b"\n") {
                report.push(b'\n');
            }
            report.extend_from_slice(SEPARATOR);
            report.extend_from_slice(b"*** ls: /dev/nvidia*\n");
            report.extend_from_slice(text);
            if sel & 3 == 3 {
                gzip(&[&report])
            } else {
                report
            }
        }
    };
    let got = read(input, step, policy).expect("valid input reads");
    assert_eq!(got.1, want.1, "line counts, mode {}", sel & 3);
    assert_eq!(got.0, want.0, "events, mode {}", sel & 3);
});
