//! Which pod a faulting process belongs to: a kernel line that names a pid
//! (`NVRM: Xid (PCI:…): 13, pid=7101, name=python, …`) is attributed at once,
//! when it is read, from `<proc_root>/<pid>/cgroup` — the process often dies
//! right after its fault, so there is no later chance.
//!
//! Where the cgroup shapes come from: kubelet's container manager names a
//! pod's cgroup `pod<uid>` under `kubepods[/<qos>]` with the cgroupfs driver
//! (`/kubepods/besteffort/pod<uid>/<container id>`) and
//! `kubepods[-<qos>]-pod<uid with _ for ->.slice` under `kubepods.slice` with
//! the systemd driver; Guaranteed pods have no QoS level. The container's
//! own cgroup is the runtime's: `cri-containerd-<id>.scope`, `crio-<id>.scope`,
//! `docker-<id>.scope` (systemd) or the bare id (cgroupfs). cgroup v2 has one
//! `0::<path>` line; v1 has one line per hierarchy, and the first that names
//! a pod is used.
//!
//! A pid can be reused: the process's start time (`<proc_root>/<pid>/stat`
//! field 22, clock ticks since boot) must not be later than the kernel
//! record's own timestamp, or the process now holding the pid is not the one
//! that faulted. A process outside any pod (a host daemon, a Slurm job) is
//! said so, never guessed.

pub(crate) mod podresources;

use gpuwatch_proto::{FaultEvent, PodRef, PodRole};
use std::path::Path;

/// The attribute saying how the pid was attributed when no pod was found:
/// `not_in_pod`, `process_exited`, `pid_reused`, `unreadable`.
pub(crate) const ATTRIBUTION: &str = "pod_attribution";
/// The cgroup of a process that is not in a pod (what it is instead).
pub(crate) const CGROUP: &str = "process.cgroup";

/// What `<proc_root>/<pid>` says about a faulting process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attribution {
    /// In a pod: its UID, and the container's id where the cgroup names it.
    Pod {
        /// The pod UID (`metadata.uid`), with dashes.
        uid: String,
        /// The container runtime's id of the container.
        container_id: Option<String>,
    },
    /// A live process outside every pod; its cgroup path.
    NotInPod(String),
    /// No such process any more.
    Exited,
    /// The process holding the pid started after the fault.
    Reused,
    /// The files could not be read (permissions, a proc root that is not
    /// one); the error in words.
    Unreadable(String),
}

/// Attributes `ev` (when it names a pid) from `proc_root`: its pod as a
/// [`PodRole::Caused`] entry of `pods` with the UID and container id (the
/// engine adds the name, namespace and container name), or [`ATTRIBUTION`]
/// saying why there is none.
/// `ticks_per_sec` converts the process start time (`sysconf(_SC_CLK_TCK)`).
pub(crate) fn annotate(ev: &mut FaultEvent, proc_root: &Path, ticks_per_sec: u64) {
    let Some(pid) = ev.pid else {
        return;
    };
    match attribute(proc_root, pid, ev.monotonic_usec, ticks_per_sec) {
        Attribution::Pod { uid, container_id } => {
            let mut pod = PodRef {
                uid,
                container_id: container_id.unwrap_or_default(),
                ..Default::default()
            };
            pod.set_role(PodRole::Caused);
            ev.pods.push(pod);
        }
        Attribution::NotInPod(cgroup) => {
            ev.attributes
                .insert(ATTRIBUTION.into(), "not_in_pod".into());
            ev.attributes.insert(CGROUP.into(), cgroup);
        }
        Attribution::Exited => {
            ev.attributes
                .insert(ATTRIBUTION.into(), "process_exited".into());
        }
        Attribution::Reused => {
            ev.attributes
                .insert(ATTRIBUTION.into(), "pid_reused".into());
        }
        Attribution::Unreadable(why) => {
            tracing::debug!(pid, error = %why, "Cannot read the faulting process's cgroup.");
            ev.attributes
                .insert(ATTRIBUTION.into(), "unreadable".into());
        }
    }
}

/// What `<proc_root>/<pid>` says about the process that printed a record at
/// `record_usec` (µs since boot; `None`: no guard against pid reuse).
pub(crate) fn attribute(
    proc_root: &Path,
    pid: u32,
    record_usec: Option<u64>,
    ticks_per_sec: u64,
) -> Attribution {
    let dir = proc_root.join(pid.to_string());
    let read = |name: &str| read_proc_file(&dir.join(name));
    let cgroup = match read("cgroup") {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Attribution::Exited,
        Err(e) => return Attribution::Unreadable(format!("{}: {e}", dir.join("cgroup").display())),
    };
    if let (Some(at), Ok(stat)) = (record_usec, read("stat"))
        && let Some(ticks) = start_ticks(&stat)
        && ticks_per_sec > 0
    {
        let started_usec = ticks.saturating_mul(1_000_000) / ticks_per_sec;
        // One tick of slack: the start time is rounded down to a tick.
        if started_usec > at.saturating_add(1_000_000 / ticks_per_sec) {
            return Attribution::Reused;
        }
    }
    match pod_of_cgroup(&cgroup) {
        Some((uid, container_id)) => Attribution::Pod { uid, container_id },
        None => Attribution::NotInPod(own_cgroup(&cgroup).to_owned()),
    }
}

/// Reads a small `/proc` file: one `read(2)` where it fits the buffer. This
/// runs for every kernel-log event naming a pid, on the reader thread, and
/// `fs::read_to_string` spends three more system calls on each such file (a
/// `statx` for a size procfs reports as 0, a 32-byte probe read, and a read
/// for end of file). A short read is the whole file: procfs serves these
/// files through `seq_file`, whose read fills the caller's buffer until the
/// content ends (`seq_read_iter` in the kernel's `fs/seq_file.c`); a regular
/// file (a test's fake proc root) ends where a read comes up short too.
fn read_proc_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = match file.read(&mut buf[len..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Field 22 of `/proc/<pid>/stat` (the start time in clock ticks since boot).
/// The command name (field 2) is in parentheses and may hold blanks and
/// parentheses itself, so fields are counted from the last `)`.
fn start_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow; the start time is the 20th of them.
    after.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// The path of the process's cgroup: the v2 line (`0::/…`), else the first
/// v1 line's.
fn own_cgroup(cgroup: &str) -> &str {
    let paths = || cgroup.lines().filter_map(|l| l.splitn(3, ':').nth(2));
    cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| paths().next())
        .unwrap_or("")
        .trim()
}

/// The pod UID and container id a cgroup file names, from the first line
/// whose path has a kubepods pod segment.
pub(crate) fn pod_of_cgroup(cgroup: &str) -> Option<(String, Option<String>)> {
    cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find_map(|path| pod_of_path(path.trim()))
}

fn pod_of_path(path: &str) -> Option<(String, Option<String>)> {
    if !path.contains("kubepods") {
        return None;
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (at, uid) = segments
        .iter()
        .enumerate()
        .find_map(|(i, s)| pod_uid_of_segment(s).map(|u| (i, u)))?;
    let container = segments.get(at + 1).and_then(|s| container_of_segment(s));
    Some((uid, container))
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_with_underscores>.slice`
/// (systemd): the UID with dashes.
fn pod_uid_of_segment(s: &str) -> Option<String> {
    let raw = if let Some(slice) = s.strip_suffix(".slice") {
        slice.rsplit_once("-pod")?.1.replace('_', "-")
    } else {
        s.strip_prefix("pod")?.to_owned()
    };
    is_uid(&raw).then_some(raw)
}

/// A UID as kubelet formats it (`8-4-4-4-12` hex digits).
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The container id of the segment under the pod's: a runtime scope
/// (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`) or a
/// bare id (cgroupfs). Conmon's `crio-conmon-<id>.scope` is not a container.
fn container_of_segment(s: &str) -> Option<String> {
    let id = match s.strip_suffix(".scope") {
        Some(scope) => {
            if scope.starts_with("crio-conmon-") {
                return None;
            }
            ["cri-containerd-", "crio-", "docker-", "cri-dockerd-"]
                .iter()
                .find_map(|p| scope.strip_prefix(p))?
        }
        None => s,
    };
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// `sysconf(_SC_CLK_TCK)`: the unit of a process's start time (100 on
/// Linux; never 0 here).
pub(crate) fn clock_ticks_per_sec() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|&v| v > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_file_is_read_whole_whatever_its_size() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0, 1, 4095, 4096, 4097, 20_000] {
            let text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            let path = dir.path().join(format!("f{len}"));
            std::fs::write(&path, &text).unwrap();
            assert_eq!(read_proc_file(&path).unwrap(), text, "{len} bytes");
        }
        // The real thing: this process's own files, as `fs` reads them.
        let own = Path::new("/proc/self");
        assert_eq!(
            read_proc_file(&own.join("cgroup")).unwrap(),
            std::fs::read_to_string(own.join("cgroup")).unwrap()
        );
        let stat = read_proc_file(&own.join("stat")).unwrap();
        assert!(
            stat.ends_with('\n') && start_ticks(&stat).is_some(),
            "{stat:?}"
        );
        let missing = read_proc_file(&dir.path().join("gone")).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }

    const UID: &str = "1f2e3d4c-5b6a-4789-8abc-def012345678";
    const CID: &str = "4f1c0e8b6a2d9c7e5b3a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100";

    #[test]
    fn every_kubelet_cgroup_shape_names_the_pod() {
        let u = UID.replace('-', "_");
        for (cgroup, container) in [
            // cgroup v2, systemd driver, Burstable, containerd.
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n"
                ),
                Some(CID),
            ),
            // Guaranteed: no QoS slice; CRI-O.
            (
                format!("0::/kubepods.slice/kubepods-pod{u}.slice/crio-{CID}.scope\n"),
                Some(CID),
            ),
            // BestEffort, docker (cri-dockerd).
            (
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/docker-{CID}.scope\n"
                ),
                Some(CID),
            ),
            // cgroupfs driver.
            (
                format!("0::/kubepods/besteffort/pod{UID}/{CID}\n"),
                Some(CID),
            ),
            (format!("0::/kubepods/pod{UID}/{CID}\n"), Some(CID)),
            // cgroup v1: several hierarchies; the first one naming a pod wins.
            (
                format!(
                    "12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:cpuset:/\n1:name=systemd:/system.slice/containerd.service\n"
                ),
                Some(CID),
            ),
            // The pod's own cgroup (a process in the sandbox, no container segment).
            (format!("0::/kubepods.slice/kubepods-pod{u}.slice\n"), None),
            // Conmon is not the container.
            (
                format!("0::/kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{CID}.scope\n"),
                None,
            ),
        ] {
            let got = pod_of_cgroup(&cgroup);
            assert_eq!(
                got,
                Some((UID.to_owned(), container.map(str::to_owned))),
                "{cgroup}"
            );
        }
    }

    #[test]
    fn processes_outside_pods_are_not_guessed() {
        for cgroup in [
            "0::/system.slice/nvidia-persistenced.service\n",
            "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/kubepods.slice/kubepods-burstable.slice\n",
            "0::/kubepods/podnot-a-uid/abc\n",
        ] {
            assert_eq!(pod_of_cgroup(cgroup), None, "{cgroup}");
        }
        assert_eq!(
            own_cgroup("0::/system.slice/slurmstepd.scope/job_42\n"),
            "/system.slice/slurmstepd.scope/job_42"
        );
        assert_eq!(
            own_cgroup("4:memory:/slurm/uid_0/job_9\n3:cpu:/x\n"),
            "/slurm/uid_0/job_9"
        );
    }

    #[test]
    fn start_time_is_field_22_even_when_the_command_has_parentheses() {
        let stat = "7101 (py (thon) x) S 1 7101 7101 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 123456 1000 10 18446744073709551615";
        assert_eq!(start_ticks(stat), Some(123_456));
        assert_eq!(start_ticks("garbage"), None);
    }

    /// A fake proc root with one process: its cgroup and a stat whose start
    /// time is `start_ticks`.
    fn proc_root(pid: u32, cgroup: &str, start_ticks: u64) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(pid.to_string());
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("cgroup"), cgroup).unwrap();
        std::fs::write(
            p.join("stat"),
            format!(
                "{pid} (python) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start_ticks} 0 0"
            ),
        )
        .unwrap();
        dir
    }

    #[test]
    fn a_pid_is_attributed_unless_its_process_is_gone_or_newer_than_the_fault() {
        let cg = format!("0::/kubepods/pod{UID}/{CID}\n");
        // Started at 50 s after boot (5000 ticks at 100/s); the fault at 60 s.
        let root = proc_root(7101, &cg, 5000);
        let a = attribute(root.path(), 7101, Some(60_000_000), 100);
        assert_eq!(
            a,
            Attribution::Pod {
                uid: UID.into(),
                container_id: Some(CID.into())
            }
        );
        // The fault was at 40 s: the process now holding the pid is newer.
        assert_eq!(
            attribute(root.path(), 7101, Some(40_000_000), 100),
            Attribution::Reused
        );
        assert_eq!(
            attribute(root.path(), 7102, Some(60_000_000), 100),
            Attribution::Exited
        );
        let host = proc_root(42, "0::/system.slice/dcgm.service\n", 10);
        assert_eq!(
            attribute(host.path(), 42, Some(60_000_000), 100),
            Attribution::NotInPod("/system.slice/dcgm.service".into())
        );
        let mut ev = FaultEvent {
            pid: Some(7101),
            monotonic_usec: Some(60_000_000),
            ..Default::default()
        };
        annotate(&mut ev, root.path(), 100);
        assert_eq!(ev.pods.len(), 1);
        assert_eq!(ev.pods[0].uid, UID);
        assert_eq!(ev.pods[0].container_id, CID);
        assert_eq!(ev.pods[0].role(), PodRole::Caused);
        let mut gone = FaultEvent {
            pid: Some(9),
            ..Default::default()
        };
        annotate(&mut gone, root.path(), 100);
        assert_eq!(gone.attributes[ATTRIBUTION], "process_exited");
    }

    #[test]
    fn the_agent_s_own_process_is_read_from_the_real_proc() {
        // This test process is not in a pod (or is, under a CI runner in
        // Kubernetes): either way the real /proc answers without error.
        let me = std::process::id();
        let a = attribute(Path::new("/proc"), me, None, clock_ticks_per_sec());
        assert!(
            matches!(a, Attribution::Pod { .. } | Attribution::NotInPod(_)),
            "{a:?}"
        );
    }
}
