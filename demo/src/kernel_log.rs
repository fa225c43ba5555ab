//! Where the demo's kernel lines go: a private FIFO of kmsg-format records
//! (the default), or, with `--kmsg`, this machine's real `/dev/kmsg`.
//!
//! Fake XID lines in a machine's real kernel log reach every other tool that
//! reads it — on a GPU node the other monitors (most do not filter the user
//! facility), on a laptop or a CI host whatever watches its log — and plain
//! `dmesg` shows them like the driver's own. So the demo writes into
//! `/dev/kmsg` only when asked, never where an NVIDIA driver is loaded, and as
//! root sets `printk_devkmsg=on` while it runs (the default `ratelimit` drops
//! all but 10 writes per open), restoring it afterwards.

use crate::DemoError;
use std::io::Write;
use std::path::{Path, PathBuf};

pub(crate) const PRINTK_DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";
/// Present when an NVIDIA kernel module is loaded.
pub(crate) const NVIDIA_DRIVER_PROC: &str = "/proc/driver/nvidia";
pub(crate) const DEV_KMSG: &str = "/dev/kmsg";

/// Where the demo's kernel lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelLogKind {
    /// This machine's `/dev/kmsg` (records land as facility user).
    Device,
    /// A private FIFO of kmsg-format records, read through `--kmsg-path`.
    Fifo,
}

/// Chooses the kernel log from `--kmsg` and the machine, with the sentence
/// the demo prints about it; an error when `--kmsg` cannot be honoured.
pub(crate) fn choose_kernel_log(
    force_kmsg: bool,
    driver_loaded: bool,
    kmsg_writable: bool,
) -> Result<(KernelLogKind, String), String> {
    if !force_kmsg {
        return Ok((
            KernelLogKind::Fifo,
            "The agent reads the demo's lines from a private FIFO (--kmsg-path); this machine's \
             kernel log is not touched."
                .to_string(),
        ));
    }
    if driver_loaded {
        return Err(format!(
            "an NVIDIA driver is loaded here ({NVIDIA_DRIVER_PROC}); the demo does not write fake \
             XIDs into a GPU node's kernel log, where other monitors would read them (run \
             without --kmsg to use a FIFO)"
        ));
    }
    if !kmsg_writable {
        return Err(format!(
            "{DEV_KMSG} is not writable (run as root, or without --kmsg)"
        ));
    }
    Ok((
        KernelLogKind::Device,
        format!(
            "--kmsg: the demo writes into this machine's kernel log ({DEV_KMSG}) as \
             user-facility records."
        ),
    ))
}

/// Whether this process may write `/dev/kmsg` and lift its rate limit.
pub(crate) fn kmsg_writable() -> bool {
    std::fs::OpenOptions::new()
        .append(true)
        .open(DEV_KMSG)
        .is_ok()
        && std::fs::OpenOptions::new()
            .write(true)
            .open(PRINTK_DEVKMSG)
            .is_ok()
}

/// The kernel log the demo writes its scripted lines into.
pub(crate) struct KernelLog {
    pub kind: KernelLogKind,
    /// What the agent reads (`--kmsg-path`).
    pub path: PathBuf,
    file: std::fs::File,
    /// FIFO records: the last sequence number written.
    seq: u64,
}

impl KernelLog {
    /// Opens the kernel log of `kind`; the FIFO is created in `dir`.
    pub(crate) fn open(kind: KernelLogKind, dir: &Path) -> Result<KernelLog, DemoError> {
        match kind {
            KernelLogKind::Device => KernelLog::device(),
            KernelLogKind::Fifo => KernelLog::fifo(dir),
        }
    }

    fn device() -> Result<KernelLog, DemoError> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(DEV_KMSG)
            .map_err(crate::setup_err(format!(
                "cannot open {DEV_KMSG} for writing"
            )))?;
        Ok(KernelLog {
            kind: KernelLogKind::Device,
            path: PathBuf::from(DEV_KMSG),
            file,
            seq: 0,
        })
    }

    /// A FIFO in `dir`, opened read-write: the open does not wait for a reader,
    /// and the agent never sees end-of-file between the two boots.
    fn fifo(dir: &Path) -> Result<KernelLog, DemoError> {
        let path = dir.join("kmsg.fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(
            |e| DemoError::Setup {
                what: format!("cannot create the FIFO {}", path.display()),
                source: std::io::Error::from(e),
            },
        )?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(crate::setup_err(format!("cannot open {}", path.display())))?;
        Ok(KernelLog {
            kind: KernelLogKind::Fifo,
            path,
            file,
            seq: 0,
        })
    }

    /// Writes one driver line at the driver's own `level` (`<4>` for NVRM's
    /// XID lines). The kernel turns a userspace write into facility user; in
    /// the FIFO the record is written as the kernel would log the driver's
    /// line.
    pub(crate) fn write(&mut self, message: &str, level: u8) -> std::io::Result<()> {
        let level = level & 7;
        let record = match self.kind {
            KernelLogKind::Device => format!("<{level}>{message}\n"),
            KernelLogKind::Fifo => {
                self.seq += 1;
                let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
                    .map_err(std::io::Error::from)?;
                let usec = now.tv_sec() as u64 * 1_000_000 + now.tv_nsec() as u64 / 1_000;
                format!("{level},{},{usec},-;{message}\n", self.seq)
            }
        };
        self.file.write_all(record.as_bytes())
    }

    /// Where the narration says a line went.
    pub(crate) fn label(&self) -> &'static str {
        match self.kind {
            KernelLogKind::Device => "/dev/kmsg",
            KernelLogKind::Fifo => "FIFO",
        }
    }

    /// The sequence number of the newest record in `/dev/kmsg` (`None` for the
    /// FIFO, or an unreadable device).
    pub(crate) fn last_seq(&self) -> Option<u64> {
        match self.kind {
            KernelLogKind::Device => last_kmsg_seq(&self.path),
            KernelLogKind::Fifo => None,
        }
    }
}

/// Calls `f` with each record of a kmsg device, oldest first, until the end;
/// records overwritten while reading (`EPIPE`) are skipped.
fn each_record(path: &Path, mut f: impl FnMut(xid_parser::KmsgRecord<'_>)) {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(n) if n > 0 => {
                if let Ok(rec) = xid_parser::parse_kmsg_record(&buf[..n]) {
                    f(rec);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            _ => return,
        }
    }
}

/// Sequence number of the newest record in a kmsg device.
pub(crate) fn last_kmsg_seq(path: &Path) -> Option<u64> {
    let mut last = None;
    each_record(path, |rec| last = Some(rec.seq));
    last
}

/// The records of `path` after `after_seq` whose message is one of `messages`,
/// formatted as `dmesg -x` prints them (`user  :warn  : [  704.029133] …`).
pub(crate) fn dmesg_x_view(path: &Path, after_seq: u64, messages: &[String]) -> Vec<String> {
    const FACILITIES: [&str; 4] = ["kern", "user", "mail", "daemon"];
    const LEVELS: [&str; 8] = [
        "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
    ];
    let mut out = Vec::new();
    each_record(path, |rec| {
        let msg = String::from_utf8_lossy(rec.message);
        if rec.seq > after_seq && messages.iter().any(|m| *m == msg) {
            let facility = FACILITIES.get(usize::from(rec.facility)).unwrap_or(&"?");
            let level = LEVELS[usize::from(rec.level & 7)];
            out.push(format!(
                "{facility:<6}:{level:<6}: [{:>12.6}] {msg}",
                rec.ts_usec as f64 / 1e6
            ));
        }
    });
    out
}

/// `printk_devkmsg=on` while the demo writes `/dev/kmsg`; the old value comes
/// back on drop.
pub(crate) struct PrintkGuard(Option<String>);

impl PrintkGuard {
    /// Lifts the rate limit for the `Device` kernel log; nothing for the FIFO.
    pub(crate) fn for_kind(kind: KernelLogKind) -> Result<PrintkGuard, DemoError> {
        if kind != KernelLogKind::Device {
            return Ok(PrintkGuard(None));
        }
        let old = std::fs::read_to_string(PRINTK_DEVKMSG)
            .map_err(crate::setup_err(format!("cannot read {PRINTK_DEVKMSG}")))?;
        std::fs::write(PRINTK_DEVKMSG, "on\n")
            .map_err(crate::setup_err(format!("cannot set {PRINTK_DEVKMSG}=on")))?;
        Ok(PrintkGuard(Some(old.trim().to_string())))
    }
}

impl Drop for PrintkGuard {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(PRINTK_DEVKMSG, format!("{old}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_log_choice_never_writes_into_a_gpu_nodes_log() {
        use KernelLogKind::{Device, Fifo};
        let kind = |k, d, w| choose_kernel_log(k, d, w).map(|(kind, _)| kind);
        // (--kmsg, driver loaded, /dev/kmsg writable): the FIFO unless asked.
        assert_eq!(kind(false, false, true), Ok(Fifo));
        assert_eq!(kind(false, true, true), Ok(Fifo));
        assert_eq!(kind(false, false, false), Ok(Fifo));
        assert_eq!(kind(true, false, true), Ok(Device));
        let refused = choose_kernel_log(true, true, true).unwrap_err();
        assert!(refused.contains("NVIDIA driver is loaded"), "{refused}");
        assert!(choose_kernel_log(true, false, false).is_err());
        let (_, why) = choose_kernel_log(false, true, true).unwrap();
        assert!(why.contains("FIFO") && why.contains("--kmsg-path"), "{why}");
    }
}
