//! The real `/dev/kmsg` for tests that write records into it: a lock that
//! serialises them and turns the kernel's per-open write rate limit off while
//! held, the ring as it is now, and a marker unique to the run. The ring is
//! shared with every other writer on the machine and with earlier runs of the
//! suite, so a test finds its own records by a marker and never assumes an
//! empty ring.
//!
//! The lock holds across processes too ([`LOCK_FILE`], `flock(2)`): an agent
//! under test reads every record written after its start, not only its own
//! test's, and a fault another process logs meanwhile (a second suite run, the
//! latency bench, which takes the same lock) would move the node verdict that
//! test asserts on. Serialised, a test's agent sees no other writer's faults.

use nix::fcntl::{Flock, FlockArg};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Mutex, MutexGuard};

const PRINTK_DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";

static KMSG_LOCK: Mutex<()> = Mutex::new(());

/// The file every writer of test and bench records to `/dev/kmsg` locks
/// (`flock(2)`, exclusive) while it writes and its agent reads; the bench
/// scripts name the same path.
pub const LOCK_FILE: &str = "/tmp/gpuwatch-dev-kmsg.lock";

/// Serialises the tests that write to `/dev/kmsg` and turns the kernel's
/// per-open write rate limit off (`printk_devkmsg=on`) while held; the old
/// value comes back on drop (also when the test panics).
pub struct DevKmsg {
    old: String,
    /// Holds the `flock` until dropped.
    _file_lock: Flock<std::fs::File>,
    _lock: MutexGuard<'static, ()>,
}

impl DevKmsg {
    /// Takes the lock and sets `printk_devkmsg=on`.
    pub fn acquire() -> DevKmsg {
        let lock = KMSG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let file_lock = lock_across_processes();
        let old = std::fs::read_to_string(PRINTK_DEVKMSG)
            .expect("read printk_devkmsg (tests need root on Linux)")
            .trim()
            .to_string();
        std::fs::write(PRINTK_DEVKMSG, "on\n").expect("set printk_devkmsg=on (needs root)");
        DevKmsg {
            old,
            _file_lock: file_lock,
            _lock: lock,
        }
    }

    /// Writes one record (userspace writes always land as facility user or
    /// above; the kernel never lets them claim facility kern). The trailing
    /// newline matters: without it the kernel keeps the record open for a
    /// continuation and readers do not see it until the next record arrives.
    pub fn write(&self, message: &str) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .expect("open /dev/kmsg for writing");
        f.write_all(format!("<4>{message}\n").as_bytes())
            .expect("write /dev/kmsg");
    }

    /// Writes many records through one open file.
    pub fn write_many<'a>(&self, messages: impl IntoIterator<Item = &'a str>) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .expect("open /dev/kmsg for writing");
        for m in messages {
            f.write_all(format!("<6>{m}\n").as_bytes())
                .expect("write /dev/kmsg");
        }
    }
}

/// Opens [`LOCK_FILE`] and waits for an exclusive `flock` on it (retried
/// when a signal interrupts the wait).
fn lock_across_processes() -> Flock<std::fs::File> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o666)
        .open(LOCK_FILE)
        .unwrap_or_else(|e| panic!("open {LOCK_FILE}: {e}"));
    loop {
        match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(locked) => return locked,
            Err((f, nix::errno::Errno::EINTR)) => file = f,
            Err((_, e)) => panic!("flock {LOCK_FILE}: {e}"),
        }
    }
}

impl Drop for DevKmsg {
    fn drop(&mut self) {
        let _ = std::fs::write(PRINTK_DEVKMSG, format!("{}\n", self.old));
    }
}

/// All records currently in the ring: `(seq, message)`.
pub fn ring() -> Vec<(u64, String)> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg");
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = Vec::new();
    loop {
        match f.read(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                let Some((header, rest)) = text.split_once(';') else {
                    continue;
                };
                let seq = header.split(',').nth(1).and_then(|s| s.parse().ok());
                let msg = rest.lines().next().unwrap_or("").to_string();
                if let Some(seq) = seq {
                    out.push((seq, msg));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    out
}

/// Sequence number of the record containing `needle`.
pub fn seq_of(needle: &str) -> Option<u64> {
    ring()
        .into_iter()
        .find(|(_, m)| m.contains(needle))
        .map(|(s, _)| s)
}

/// A token unique to this test run.
pub fn marker(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&(test, nanos, std::process::id()), &mut h);
    format!(
        "gwe2e{:012x}",
        std::hash::Hasher::finish(&h) & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether another process gets the lock, as the latency bench takes it
    /// (python's `fcntl.flock`): at once, or (`wait`) within a minute, since
    /// another test process may hold it for a while.
    fn another_process_can_lock(wait: bool) -> bool {
        let flags = if wait {
            "fcntl.LOCK_EX"
        } else {
            "fcntl.LOCK_EX | fcntl.LOCK_NB"
        };
        let script = format!(
            "import fcntl, os, signal, sys\n\
             signal.alarm(60)\n\
             fd = os.open('{LOCK_FILE}', os.O_WRONLY | os.O_CREAT)\n\
             try:\n    fcntl.flock(fd, {flags})\n\
             except BlockingIOError:\n    sys.exit(3)\n"
        );
        let status = std::process::Command::new("python3")
            .args(["-c", &script])
            .status()
            .expect("run python3");
        match status.code() {
            Some(0) => true,
            Some(3) => false,
            other => panic!("the python lock probe failed: {other:?}"),
        }
    }

    #[test]
    fn the_lock_holds_against_other_processes() {
        let held = DevKmsg::acquire();
        assert!(
            !another_process_can_lock(false),
            "held: another process waits"
        );
        drop(held);
        assert!(another_process_can_lock(true), "released with the guard");
    }
}
