//! Boot identity and boot time.
//!
//! * Boot id: `/proc/sys/kernel/random/boot_id` (a UUID the kernel draws at
//!   boot). The path is overridable (`--boot-id-path`) so tests can simulate a
//!   new boot.
//! * Boot time: the wall-clock time at which the kernel log's clock read 0.
//!   `/dev/kmsg` timestamps come from the kernel's `local_clock()`, which runs
//!   with `CLOCK_MONOTONIC` (both stop during suspend), so the offset that maps
//!   a record timestamp to wall time is `CLOCK_REALTIME − CLOCK_MONOTONIC`,
//!   sampled back to back. `/proc/stat`'s `btime` is `CLOCK_REALTIME −
//!   CLOCK_BOOTTIME` at one-second resolution: it includes time spent
//!   suspended (records logged after a resume would be placed too early), so it
//!   is only the fallback when the clocks cannot be read. The offset moves when
//!   the wall clock is stepped (NTP), so long-running readers recompute it per
//!   batch of records ([`boot_time_unix_nanos`] is two vDSO calls).

use nix::time::{ClockId, clock_gettime};
use std::path::{Path, PathBuf};

/// Default location of the kernel's boot id.
pub(crate) const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Errors reading boot information.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The boot id file could not be read.
    #[error("cannot read boot id from {path}: {source}")]
    Read {
        /// The boot id file (`kmsg.boot_id_path`, `--boot-id-path`).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The boot id file was empty or not a single token.
    #[error("boot id file {path} does not contain a boot id (got {content:?})")]
    Invalid {
        /// The boot id file (`kmsg.boot_id_path`, `--boot-id-path`).
        path: PathBuf,
        /// What it contained (truncated).
        content: String,
    },
}

/// Reads the boot id from `path` (trimmed; must be one non-empty token).
pub(crate) fn read_boot_id(path: &Path) -> Result<String, BootError> {
    let text = std::fs::read_to_string(path).map_err(|source| BootError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let id = text.trim();
    if id.is_empty() || id.len() > 128 || id.contains(char::is_whitespace) {
        return Err(BootError::Invalid {
            path: path.to_path_buf(),
            content: text.chars().take(64).collect(),
        });
    }
    Ok(id.to_string())
}

fn clock_nanos(id: ClockId) -> Option<u64> {
    let ts = clock_gettime(id).ok()?;
    let secs = u64::try_from(ts.tv_sec()).ok()?;
    let nanos = u64::try_from(ts.tv_nsec()).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Current `CLOCK_MONOTONIC` in microseconds (the kernel log's time base).
pub(crate) fn monotonic_usec() -> u64 {
    clock_nanos(ClockId::CLOCK_MONOTONIC).map_or(0, |n| n / 1000)
}

/// Parses the `btime` line of `/proc/stat` content (seconds since the epoch).
pub(crate) fn parse_proc_stat_btime(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Wall-clock time (Unix epoch nanoseconds) at which the kernel log clock
/// was 0: `CLOCK_REALTIME − CLOCK_MONOTONIC`, or `/proc/stat` btime when the
/// clocks cannot be read, or 0 when neither is available.
pub fn boot_time_unix_nanos() -> u64 {
    // Read MONOTONIC on both sides of REALTIME and use the midpoint so a
    // preemption between the calls costs at most half the gap.
    let m1 = clock_nanos(ClockId::CLOCK_MONOTONIC);
    let r = clock_nanos(ClockId::CLOCK_REALTIME);
    let m2 = clock_nanos(ClockId::CLOCK_MONOTONIC);
    if let (Some(m1), Some(r), Some(m2)) = (m1, r, m2) {
        let mono = m1 + (m2.saturating_sub(m1)) / 2;
        return r.saturating_sub(mono);
    }
    std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(parse_proc_stat_btime)
        .map_or(0, |s| s.saturating_mul(1_000_000_000))
}

/// Wall time of a kernel log timestamp given the boot time.
pub(crate) fn wall_time_unix_nanos(boot_time_unix_nanos: u64, monotonic_usec: u64) -> u64 {
    boot_time_unix_nanos.saturating_add(monotonic_usec.saturating_mul(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_id_is_trimmed_and_validated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("boot_id");
        std::fs::write(&p, "0f5c8a1e-1111-2222-3333-444455556666\n").unwrap();
        assert_eq!(
            read_boot_id(&p).unwrap(),
            "0f5c8a1e-1111-2222-3333-444455556666"
        );
        std::fs::write(&p, "  \n").unwrap();
        assert!(matches!(read_boot_id(&p), Err(BootError::Invalid { .. })));
        std::fs::write(&p, "two tokens").unwrap();
        assert!(matches!(read_boot_id(&p), Err(BootError::Invalid { .. })));
        assert!(matches!(
            read_boot_id(&dir.path().join("missing")),
            Err(BootError::Read { .. })
        ));
    }

    #[test]
    fn real_boot_id_is_readable() {
        // Every Linux test machine has one; the agent depends on it.
        let id = read_boot_id(Path::new(BOOT_ID_PATH)).unwrap();
        assert_eq!(id.len(), 36, "{id}");
    }

    #[test]
    fn btime_parses_from_proc_stat_text() {
        let stat = "cpu  1 2 3\nintr 5\nctxt 9\nbtime 1718000000\nprocesses 4\n";
        assert_eq!(parse_proc_stat_btime(stat), Some(1_718_000_000));
        assert_eq!(parse_proc_stat_btime("cpu 1\n"), None);
    }

    #[test]
    fn boot_time_agrees_with_proc_stat_btime() {
        // REALTIME − MONOTONIC is at or after btime (REALTIME − BOOTTIME), and
        // without suspend they agree to within btime's one-second resolution.
        let ours = boot_time_unix_nanos();
        let btime = parse_proc_stat_btime(&std::fs::read_to_string("/proc/stat").unwrap()).unwrap()
            * 1_000_000_000;
        assert!(ours + 1_000_000_000 >= btime, "ours={ours} btime={btime}");
        let now = gpuwatch_core::clock::unix_nanos(std::time::SystemTime::now());
        assert!(ours < now);
        assert_eq!(wall_time_unix_nanos(ours, 0), ours);
        assert_eq!(wall_time_unix_nanos(10, 2), 2010);
    }
}
