//! The NIC poller: reads the node's RDMA ports (InfiniBand and RoCE) from
//! sysfs into [`NicScan`]s, with no external command.
//!
//! What one scan reads, for each `<root>/class/infiniband/<dev>` (a link into
//! `/sys/devices`, followed) and each of its `ports/<n>`:
//!
//! - `state`, `phys_state`, `rate`, `link_layer` (parsed by
//!   [`gpuwatch_core::network`]; a missing or refused file is `Unknown` /
//!   `None`);
//! - the error counters of `counters/` in [`ERROR_COUNTERS`] that the port
//!   has, then every file of `hw_counters/` (driver counters: errors and a few
//!   event counts such as `np_cnp_sent`, all kept; the reader does not guess
//!   which are errors) except `lifespan`, which is a setting of the counter
//!   cache, not a counter, and except a name `counters/` already gave;
//! - for an Ethernet (RoCE) port with a netdev, `<root>/class/net/<if>/
//!   carrier_changes`.
//!
//! Read once per layout (below), not every scan: the PCI address (the name of
//! the function `<dev>/device` resolves to, kept only when it looks like
//! `0000:1a:00.0`), `device/numa_node` (-1 is `None`), `device/vendor` (an
//! Amazon function, `0x1d0f`, is an AWS EFA device: its ports are read as
//! [`LinkLayer::Efa`] whatever `link_layer` says, as the EFA driver reports
//! them ACTIVE/LinkUp unconditionally) and the port's netdev
//! (the entry of `<dev>/device/net/` whose `dev_port` is the port number less
//! one; for a one-port device without such an entry, the first by name).
//!
//! A RoCE port whose netdev cannot be found (no `<dev>/device/net/` entry:
//! on a real node, a container's own `/sys` mounted in the pod's network
//! namespace shows none of the host's netdevs there) has no
//! `carrier_changes`; that is logged once per port, with the remedy
//! (`sysfs_root` on the host's whole `/sys`).
//!
//! Counters. A value is a decimal number. A counter file whose read fails with
//! an error that will not go away (`EINVAL` or `ENOSYS` from the driver, as on
//! restricted NICs and virtual functions; `EOPNOTSUPP`, `EACCES`, `EPERM`,
//! `EISDIR`), or that says `N/A` or anything else that is not a number, is
//! [`CounterValue::Unreadable`] from then on: never opened again while the
//! reader lives, reported as unreadable in every scan, and logged once (one
//! warning per device naming all of its newly unreadable counters). A read
//! that fails with a passing error (`EIO`, `EAGAIN`, `EBUSY`, `ETIMEDOUT`,
//! `ENOMEM`: a busy firmware command) leaves the counter out of that scan and
//! is tried again in the next, logged at debug level when it starts failing.
//! A state file that cannot be read is `Unknown` in the reading, not logged.
//!
//! Problems. A port whose files vanish between the listing and the reading
//! (the device was removed mid-scan) is left out with a `problems` entry; the
//! other ports, of the same device and others, are kept. A missing
//! `class/infiniband` is a node without RDMA devices: a complete scan with no
//! ports (unless `<root>/class` is missing too: then the sysfs root is wrong,
//! and the scan is incomplete). A class directory that cannot be listed
//! (`EACCES`) gives an incomplete scan naming the error, logged once until it
//! can be listed again.
//!
//! Cost. The layout (devices, their ports, each port's file paths and counter
//! list, PCI address, NUMA node, netdev) is cached. Each scan lists the class
//! directory (one `getdents64` pass), compares its entries' names and inode
//! numbers with the cached ones (a device removed and registered again under
//! the same name gets a new kernfs inode), and rebuilds the layout when they
//! differ, when a cached path stopped existing (a counter or netdev gone, a
//! netdev renamed), and every [`RELAYOUT_EVERY`] scans (5 minutes at the
//! default 5 s), which picks up what appears after its device: the IPoIB
//! netdev of a late `ib_ipoib`, new `hw_counters`. Otherwise every file is one
//! `openat` + one `read` + `close` into a buffer the reader keeps (a sysfs
//! read returns the whole value at once), and a scan allocates only what the
//! [`NicScan`] holds.
//!
//! Progress. A sysfs read can block for seconds or never return (an mlx5
//! `hw_counters` read waits on a firmware command) and cannot be cancelled.
//! The reader records each read in its heartbeat ([`Progress`]: the file,
//! and a beat at its start and end); the agent's watchdog, on another
//! thread, reports the poller stalled once it has made no progress for
//! [`stall_deadline`], naming the file, and reports it again when it moves.

use crate::input::InputContext;
use gpuwatch_core::heartbeat::{self, Progress};
use gpuwatch_core::msg::Input;
use gpuwatch_core::network::{
    CounterReading, CounterValue, LinkLayer, NetworkSettings, NicScan, PCI_VENDOR_AMAZON,
    PhysState, PortId, PortReading, PortState, parse_link_layer, parse_pci_vendor,
    parse_phys_state, parse_rate_gbps, parse_state,
};
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::DirEntryExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The `counters/` files read (when the port has them), in this order: the
/// error counters of the IB PortCounters attribute. The data counters
/// (`port_xmit_data`, ...) are not read.
pub const ERROR_COUNTERS: [&str; 12] = [
    "link_downed",
    "link_error_recovery",
    "symbol_error",
    "port_rcv_errors",
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
    "port_xmit_discards",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "VL15_dropped",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
];

/// The layout is rebuilt at least every this many scans.
pub const RELAYOUT_EVERY: u32 = 60;

/// The `hw_counters/` file that is a setting (the counters' cache lifetime in
/// milliseconds), not a counter.
const HW_LIFESPAN: &str = "lifespan";

/// Larger than any sysfs value read here; a file that fills it is not a value.
const READ_BUF: usize = 256;

/// Reads the RDMA ports under a sysfs root (see the module documentation).
pub struct NicReader {
    root: PathBuf,
    class_dir: PathBuf,
    net_dir: PathBuf,
    layout: Vec<DeviceLayout>,
    /// The class directory's entries (name, inode) the layout was built from.
    listed: Vec<(OsString, u64)>,
    /// This scan's entries; swapped with `listed` when the layout is rebuilt.
    listing: Vec<(OsString, u64)>,
    /// A cached path stopped existing: rebuild at the next scan.
    stale: bool,
    scans_since_layout: u32,
    /// `<dev>/<port>/<counters|hw_counters>/<name>` of every counter found
    /// unreadable, kept across layouts.
    unreadable: HashSet<String>,
    /// The class directory could not be listed at the last scan (logged once).
    class_dir_failed: bool,
    /// RoCE ports (`mlx5_1/1`) already logged as having no netdev.
    netdev_missing_logged: HashSet<String>,
    buf: Box<[u8; READ_BUF]>,
    /// What the reader is doing now, for the watchdog.
    progress: Arc<Progress>,
    /// Run after the listing and before the reads (tests: a device that
    /// vanishes in between).
    #[cfg(test)]
    after_list: Option<Box<dyn FnMut() + Send>>,
}

impl std::fmt::Debug for NicReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicReader")
            .field("root", &self.root)
            .field("devices", &self.layout.len())
            .field("unreadable", &self.unreadable.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct DeviceLayout {
    name: String,
    pci_address: Option<String>,
    numa_node: Option<u32>,
    /// An AWS EFA device (`device/vendor` is Amazon's).
    efa: bool,
    ports: Vec<PortLayout>,
}

#[derive(Debug)]
struct PortLayout {
    number: u32,
    dir: PathBuf,
    state: PathBuf,
    phys_state: PathBuf,
    rate: PathBuf,
    link_layer: PathBuf,
    counters: Vec<CounterSlot>,
    netdev: Option<String>,
    carrier_changes: Option<PathBuf>,
}

#[derive(Debug)]
struct CounterSlot {
    name: String,
    path: PathBuf,
    /// `<dev>/<port>/<dir>/<name>`, the key in [`NicReader::unreadable`].
    key: String,
    unreadable: bool,
    /// The last read failed with a passing error (logged once per run of them).
    failing: bool,
}

/// What a failed read means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The path is not there (anymore).
    Gone,
    /// The driver refuses it, and will again.
    Refused,
    /// It may work next time.
    Passing,
}

fn classify(e: &io::Error) -> Failure {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENODEV | libc::ENXIO | libc::ENOTDIR) => Failure::Gone,
        Some(
            libc::EIO
            | libc::EAGAIN
            | libc::EBUSY
            | libc::ETIMEDOUT
            | libc::ENOMEM
            | libc::ENOBUFS
            | libc::EINTR,
        ) => Failure::Passing,
        _ => Failure::Refused,
    }
}

/// The port's files are gone mid-scan.
#[derive(Debug)]
struct Vanished;

/// One `open` + `read` + `close` of a small file into `buf`, recorded in
/// `progress` while it runs.
fn read_small<'b>(buf: &'b mut [u8], path: &Path, progress: &Progress) -> io::Result<&'b [u8]> {
    let _reading = progress.begin(path.as_os_str());
    let mut file = File::open(path)?;
    let n = loop {
        match file.read(buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    if n == buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "longer than any sysfs value",
        ));
    }
    Ok(&buf[..n])
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or("").trim()
}

impl NicReader {
    /// A reader of `<sysfs_root>/class/infiniband` and `<sysfs_root>/class/net`.
    /// Reads nothing until the first [`NicReader::scan`].
    pub fn new(sysfs_root: PathBuf) -> NicReader {
        NicReader {
            class_dir: sysfs_root.join("class/infiniband"),
            net_dir: sysfs_root.join("class/net"),
            root: sysfs_root,
            layout: Vec::new(),
            listed: Vec::new(),
            listing: Vec::new(),
            stale: true,
            scans_since_layout: 0,
            unreadable: HashSet::new(),
            class_dir_failed: false,
            netdev_missing_logged: HashSet::new(),
            buf: Box::new([0; READ_BUF]),
            progress: Arc::default(),
            #[cfg(test)]
            after_list: None,
        }
    }

    /// Reads every port of every RDMA device; `at` is the scan's time. Never
    /// fails: what could not be read is in the scan (see the module
    /// documentation).
    pub fn scan(&mut self, at: Instant) -> NicScan {
        let mut problems = Vec::new();
        match self.list_class_dir() {
            Ok(true) => self.class_dir_ok(),
            Ok(false) => {
                self.class_dir_ok();
                self.layout.clear();
                self.listed.clear();
                self.stale = true;
                if self.root.join("class").is_dir() {
                    return NicScan {
                        at,
                        ports: Vec::new(),
                        problems,
                        complete: true,
                    };
                }
                problems.push(format!(
                    "{} has no class directory: not a sysfs mount",
                    self.root.display()
                ));
                return NicScan {
                    at,
                    ports: Vec::new(),
                    problems,
                    complete: false,
                };
            }
            Err(e) => {
                let problem = format!("cannot list {}: {e}", self.class_dir.display());
                if !self.class_dir_failed {
                    tracing::warn!(
                        error = %e,
                        dir = %self.class_dir.display(),
                        "Cannot list the RDMA devices; NIC ports are not monitored until it can."
                    );
                    self.class_dir_failed = true;
                }
                return NicScan {
                    at,
                    ports: Vec::new(),
                    problems: vec![problem],
                    complete: false,
                };
            }
        }
        self.scans_since_layout += 1;
        if self.stale || self.listing != self.listed || self.scans_since_layout >= RELAYOUT_EVERY {
            std::mem::swap(&mut self.listing, &mut self.listed);
            self.rebuild_layout(&mut problems);
        }
        #[cfg(test)]
        if let Some(hook) = self.after_list.as_mut() {
            hook();
        }

        let mut layout = std::mem::take(&mut self.layout);
        let mut ports = Vec::with_capacity(layout.iter().map(|d| d.ports.len()).sum());
        let mut newly_unreadable: Vec<String> = Vec::new();
        let mut no_netdev: Vec<String> = Vec::new();
        for dev in &mut layout {
            let DeviceLayout {
                name,
                pci_address,
                numa_node,
                efa,
                ports: dev_ports,
            } = dev;
            for port in dev_ports.iter_mut() {
                match self.read_port(name, port, &mut newly_unreadable) {
                    Ok(mut reading) => {
                        reading.pci_address.clone_from(pci_address);
                        reading.numa_node = *numa_node;
                        if *efa {
                            reading.link_layer = LinkLayer::Efa;
                        }
                        if reading.link_layer == LinkLayer::Ethernet && reading.netdev.is_none() {
                            let id = reading.id.to_string();
                            if !self.netdev_missing_logged.contains(&id) {
                                no_netdev.push(id.clone());
                                self.netdev_missing_logged.insert(id);
                            }
                        }
                        ports.push(reading);
                    }
                    Err(Vanished) => {
                        self.stale = true;
                        tracing::debug!(device = %name, port = port.number, "An RDMA port vanished during the scan.");
                        problems.push(format!("{name}/{}: vanished during the scan", port.number));
                    }
                }
            }
            if !newly_unreadable.is_empty() {
                tracing::warn!(
                    device = %name,
                    counters = %newly_unreadable.join(", "),
                    "NIC counters unreadable; reported as unreadable and not read again."
                );
                newly_unreadable.clear();
            }
        }
        self.layout = layout;
        if !no_netdev.is_empty() {
            tracing::warn!(
                ports = %no_netdev.join(", "),
                sysfs_root = %self.root.display(),
                "RoCE ports without a netdev in sysfs: their carrier changes are not counted. \
                 In a container, set [network] sysfs_root to the host's whole /sys mounted \
                 read-only (the DaemonSet mounts it at /host/sys)."
            );
        }
        NicScan {
            at,
            ports,
            problems,
            complete: true,
        }
    }

    fn class_dir_ok(&mut self) {
        if self.class_dir_failed {
            tracing::info!(dir = %self.class_dir.display(), "The RDMA devices can be listed again.");
            self.class_dir_failed = false;
        }
    }

    /// Lists the class directory into `listing`, sorted: `Ok(false)` when it
    /// does not exist.
    fn list_class_dir(&mut self) -> io::Result<bool> {
        self.listing.clear();
        let _reading = self.progress.begin(self.class_dir.as_os_str());
        let entries = match fs::read_dir(&self.class_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            self.listing.push((entry.file_name(), entry.ino()));
        }
        self.listing.sort_unstable();
        Ok(true)
    }

    fn rebuild_layout(&mut self, problems: &mut Vec<String>) {
        self.stale = false;
        self.scans_since_layout = 0;
        let mut names: Vec<&str> = Vec::with_capacity(self.listed.len());
        for (name, _) in &self.listed {
            match name.to_str() {
                Some(n) => names.push(n),
                None => problems.push(format!(
                    "{:?}: not a UTF-8 device name; skipped",
                    name.to_string_lossy()
                )),
            }
        }
        names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
        self.layout.clear();
        for name in names {
            let _reading = self.progress.begin(self.class_dir.join(name).as_os_str());
            match device_layout(&self.class_dir, &self.net_dir, name, &self.unreadable) {
                Ok(dev) => self.layout.push(dev),
                Err(problem) => {
                    // Listed but not laid out: try again next scan.
                    self.stale = true;
                    problems.push(problem);
                }
            }
        }
    }

    /// Reads a text file: `Ok(None)` when it cannot be read (missing or
    /// refused: the reading says `Unknown`, nothing is logged, as it would be
    /// every scan), `Err` when the port itself is gone.
    fn read_text(&mut self, path: &Path, port_dir: &Path) -> Result<Option<&str>, Vanished> {
        match read_small(&mut self.buf[..], path, &self.progress) {
            Ok(bytes) => Ok(Some(text(bytes))),
            Err(e) => {
                if classify(&e) == Failure::Gone && !port_dir.is_dir() {
                    return Err(Vanished);
                }
                Ok(None)
            }
        }
    }

    fn read_port(
        &mut self,
        device: &str,
        port: &mut PortLayout,
        newly_unreadable: &mut Vec<String>,
    ) -> Result<PortReading, Vanished> {
        let link_layer = self
            .read_text(&port.link_layer, &port.dir)?
            .map_or(LinkLayer::Unknown, parse_link_layer);
        let state = self
            .read_text(&port.state, &port.dir)?
            .map_or(PortState::Unknown, parse_state);
        let phys_state = self
            .read_text(&port.phys_state, &port.dir)?
            .map_or(PhysState::Unknown, parse_phys_state);
        let rate_gbps = self
            .read_text(&port.rate, &port.dir)?
            .and_then(parse_rate_gbps);
        let mut counters = Vec::with_capacity(port.counters.len());
        for slot in &mut port.counters {
            if slot.unreadable {
                counters.push(CounterReading {
                    name: slot.name.clone(),
                    value: CounterValue::Unreadable,
                });
                continue;
            }
            let why = match read_small(&mut self.buf[..], &slot.path, &self.progress) {
                Ok(bytes) => match text(bytes).parse::<u64>() {
                    Ok(v) => {
                        slot.failing = false;
                        counters.push(CounterReading {
                            name: slot.name.clone(),
                            value: CounterValue::Value(v),
                        });
                        continue;
                    }
                    Err(_) if text(bytes) == "N/A" => "N/A".to_string(),
                    Err(_) => format!("not a number: {:?}", text(bytes)),
                },
                Err(e) => match classify(&e) {
                    Failure::Refused => e.to_string(),
                    Failure::Gone => {
                        if !port.dir.is_dir() {
                            return Err(Vanished);
                        }
                        // The counter went away: out of this scan, and the
                        // layout is rebuilt.
                        self.stale = true;
                        continue;
                    }
                    Failure::Passing => {
                        // Logged when it starts failing, not every scan.
                        if !slot.failing {
                            tracing::debug!(path = %slot.path.display(), error = %e, "Cannot read an RDMA counter for now.");
                            slot.failing = true;
                        }
                        continue;
                    }
                },
            };
            slot.unreadable = true;
            let rel = slot.key.split_once('/').map_or(&*slot.key, |(_, r)| r);
            newly_unreadable.push(format!("{rel} ({why})"));
            self.unreadable.insert(slot.key.clone());
            counters.push(CounterReading {
                name: slot.name.clone(),
                value: CounterValue::Unreadable,
            });
        }
        let carrier_changes = match (&port.carrier_changes, link_layer) {
            (Some(path), LinkLayer::Ethernet) => {
                match read_small(&mut self.buf[..], path, &self.progress) {
                    Ok(bytes) => text(bytes).parse::<u64>().ok(),
                    Err(e) => {
                        if classify(&e) == Failure::Gone {
                            // The netdev was renamed or removed.
                            self.stale = true;
                        }
                        None
                    }
                }
            }
            _ => None,
        };
        Ok(PortReading {
            id: PortId {
                device: device.to_string(),
                port: port.number,
            },
            link_layer,
            state,
            phys_state,
            rate_gbps,
            netdev: port.netdev.clone(),
            pci_address: None,
            numa_node: None,
            counters,
            carrier_changes,
        })
    }
}

/// `mlx5_10` after `mlx5_9`: the name without its trailing digits, then their
/// value, then the name.
fn natural_key(name: &str) -> (&str, Option<u64>, &str) {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (head, tail) = name.split_at(name.len() - digits);
    (head, tail.parse().ok(), name)
}

/// `0000:1a:00.0`: a domain of at least 4 hex digits, bus, device, function.
fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, min: usize, max: usize| {
        (min..=max).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let mut parts = s.split(':');
    let (Some(domain), Some(bus), Some(dev_fn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((dev, func)) = dev_fn.split_once('.') else {
        return false;
    };
    hex(domain, 4, 8)
        && hex(bus, 2, 2)
        && hex(dev, 2, 2)
        && matches!(func.as_bytes(), [b'0'..=b'7'])
}

/// The names in `dir`, sorted; empty when it is missing.
fn list_names(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        if let Ok(name) = entry?.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort_unstable();
    Ok(names)
}

fn device_layout(
    class_dir: &Path,
    net_dir: &Path,
    name: &str,
    unreadable: &HashSet<String>,
) -> Result<DeviceLayout, String> {
    let dir = class_dir.join(name);
    let gone = || format!("{name}: vanished while its layout was read");
    let device = dir.join("device");
    let pci_address = fs::canonicalize(&device)
        .ok()
        .and_then(|p| p.file_name()?.to_str().map(str::to_string))
        .filter(|a| is_pci_address(a));
    let numa_node = fs::read_to_string(device.join("numa_node"))
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let efa = fs::read_to_string(device.join("vendor"))
        .ok()
        .and_then(|t| parse_pci_vendor(&t))
        == Some(PCI_VENDOR_AMAZON);
    // The files are opened by their resolved path: no link to follow on each
    // open. A device registered again is a new class entry, laid out again.
    let ports_dir = fs::canonicalize(&dir)
        .unwrap_or_else(|_| dir.clone())
        .join("ports");
    let mut numbers: Vec<u32> = match fs::read_dir(&ports_dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|n| *n > 0)
            .collect(),
        Err(_) if !dir.is_dir() => return Err(gone()),
        Err(e) => return Err(format!("{name}: cannot list its ports: {e}")),
    };
    numbers.sort_unstable();

    let netdevs = netdevs_of(&device);
    let one_port = numbers.len() == 1;
    let mut ports = Vec::with_capacity(numbers.len());
    for number in numbers {
        let netdev = netdevs
            .iter()
            .find(|(_, p)| *p == Some(number))
            .or_else(|| netdevs.first().filter(|_| one_port))
            .map(|(n, _)| n.clone());
        ports.push(port_layout(
            &ports_dir, net_dir, name, number, netdev, unreadable,
        )?);
    }
    Ok(DeviceLayout {
        name: name.to_string(),
        pci_address,
        numa_node,
        efa,
        ports,
    })
}

/// The netdevs of the PCI function at `device` and the port each is
/// (`dev_port` + 1).
fn netdevs_of(device: &Path) -> Vec<(String, Option<u32>)> {
    let net = device.join("net");
    list_names(&net)
        .unwrap_or_default()
        .into_iter()
        .map(|n| {
            let port = fs::read_to_string(net.join(&n).join("dev_port"))
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
                .map(|p| p.saturating_add(1));
            (n, port)
        })
        .collect()
}

/// The files of port `number` of device `name`: its state files, the error
/// counters it has (the IB PortCounters first, then the driver's
/// `hw_counters`), and its netdev's `carrier_changes`.
fn port_layout(
    ports_dir: &Path,
    net_dir: &Path,
    name: &str,
    number: u32,
    netdev: Option<String>,
    unreadable: &HashSet<String>,
) -> Result<PortLayout, String> {
    let pdir = ports_dir.join(number.to_string());
    let listed = |sub: &str| match list_names(&pdir.join(sub)) {
        Ok(names) => Ok(names),
        Err(_) if !pdir.is_dir() => Err(format!(
            "{name}/{number}: vanished while its layout was read"
        )),
        Err(e) => Err(format!("{name}/{number}: cannot list {sub}: {e}")),
    };
    let present = listed("counters")?;
    let hw = listed("hw_counters")?;
    let slot = |sub: &str, counter: &str| {
        let key = format!("{name}/{number}/{sub}/{counter}");
        CounterSlot {
            name: counter.to_string(),
            path: pdir.join(sub).join(counter),
            unreadable: unreadable.contains(&key),
            failing: false,
            key,
        }
    };
    let mut counters: Vec<CounterSlot> = ERROR_COUNTERS
        .iter()
        .filter(|c| present.iter().any(|p| p == *c))
        .map(|c| slot("counters", c))
        .collect();
    for c in &hw {
        if c != HW_LIFESPAN && !counters.iter().any(|s| s.name == *c) {
            counters.push(slot("hw_counters", c));
        }
    }
    Ok(PortLayout {
        number,
        state: pdir.join("state"),
        phys_state: pdir.join("phys_state"),
        rate: pdir.join("rate"),
        link_layer: pdir.join("link_layer"),
        counters,
        carrier_changes: netdev
            .as_ref()
            .map(|n| net_dir.join(n).join("carrier_changes")),
        netdev,
        dir: pdir,
    })
}

/// The shortest time the NIC poller may make no progress before its part of
/// the health is Unknown: a busy firmware command can hold a counter read
/// for a second or two without anything being wrong.
pub(crate) const STALL_MIN: Duration = Duration::from_secs(5);

/// How long a NIC poller scanning every `interval` may make no progress
/// before it counts as stalled: three of its intervals, at least
/// [`STALL_MIN`]. The agent's watchdog holds it to that
/// ([`gpuwatch_core::heartbeat`]), naming the file it is stuck in.
pub(crate) fn stall_deadline(interval: Duration) -> Duration {
    heartbeat::deadline(interval, 3, STALL_MIN)
}

/// Starts the NIC poller thread: a [`NicReader`] over `settings.sysfs_root`
/// scans at once and then every `settings.poll_interval` (on a fixed cadence;
/// a scan that overruns skips the ticks it missed), offering each scan to
/// the engine ([`InputContext::offer`]: a scan that finds the channel full
/// is skipped, the next one carries the whole state again). The thread ends
/// when `ctx`'s shutdown is triggered (at once, also during the wait) or
/// when the channel's receiver is gone; with `settings.enabled` false it
/// ends without scanning. An interval under 100 ms (the settings' minimum)
/// is taken as 100 ms. The poller beats `ctx`'s heartbeat and names each
/// file it reads (for the agent's watchdog). A read that never returns
/// keeps the thread in it, also past the shutdown: whoever joins it must
/// not wait for ever. The error is the thread's creation failing.
pub fn spawn_nic_poller(
    settings: NetworkSettings,
    ctx: InputContext,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("nic-poller".into())
        .spawn(move || {
            if !settings.enabled {
                return;
            }
            // The settings' own minimum, also for settings built by hand.
            let interval = settings.poll_interval.max(Duration::from_millis(100));
            let mut reader = NicReader::new(settings.sysfs_root);
            reader.progress = ctx.progress().clone();
            let mut next = Instant::now();
            while !ctx.is_stopping() {
                reader.progress.beat();
                let at = Instant::now();
                if !ctx.offer(Input::Network(reader.scan(at))) {
                    return;
                }
                next += interval;
                let now = Instant::now();
                if next <= now {
                    // Overran: skip the missed ticks, keep the phase.
                    let missed = (now - next).as_nanos() / interval.as_nanos() + 1;
                    next += interval * u32::try_from(missed).unwrap_or(u32::MAX);
                }
                if ctx.shutdown().wait_deadline(next) {
                    return;
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_test_support::sysfs::FakeSysfs;
    use std::sync::Mutex;

    #[test]
    fn nic_names_and_addresses() {
        let mut names = vec!["mlx5_10", "mlx5_2", "bnxt_re0", "mlx5_", "mlx5_1"];
        names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
        assert_eq!(names, ["bnxt_re0", "mlx5_", "mlx5_1", "mlx5_2", "mlx5_10"]);
        for ok in ["0000:1a:00.0", "10000:e1:1f.7"] {
            assert!(is_pci_address(ok), "{ok}");
        }
        for bad in [
            "",
            "eth0",
            "0000:1a:00",
            "0000:1a:00.8",
            "000:1a:00.0",
            "0000:1a:00.0:1",
        ] {
            assert!(!is_pci_address(bad), "{bad}");
        }
        let e = |n| io::Error::from_raw_os_error(n);
        assert_eq!(classify(&e(libc::EINVAL)), Failure::Refused);
        assert_eq!(classify(&e(libc::EISDIR)), Failure::Refused);
        assert_eq!(classify(&e(libc::EOPNOTSUPP)), Failure::Refused);
        assert_eq!(classify(&e(libc::ENOENT)), Failure::Gone);
        assert_eq!(classify(&e(libc::ENODEV)), Failure::Gone);
        assert_eq!(classify(&e(libc::EIO)), Failure::Passing);
    }

    /// The deadline is three poll intervals, at least [`STALL_MIN`].
    #[test]
    fn nic_stall_deadline() {
        assert_eq!(stall_deadline(Duration::from_millis(100)), STALL_MIN);
        assert_eq!(
            stall_deadline(Duration::from_secs(5)),
            Duration::from_secs(15)
        );
        assert_eq!(stall_deadline(Duration::MAX), Duration::MAX);
    }

    /// A scan moves the heartbeat and ends outside any read.
    #[test]
    fn nic_scan_beats_and_ends_outside_a_read() {
        let fake = FakeSysfs::node_of(1);
        let mut r = NicReader::new(fake.root().to_path_buf());
        assert_eq!(r.progress.last_beat_ms(), 0);
        r.scan(Instant::now());
        assert!(r.progress.last_beat_ms() > 0);
        assert_eq!(r.progress.activity(), None);
    }

    /// A device removed after the listing and before its files are read:
    /// its port is a problem of that scan, every other port is read, and the
    /// next scan lays the node out without it.
    #[test]
    fn nic_device_vanishing_mid_scan_is_a_problem_not_a_failure() {
        let fake = Arc::new(FakeSysfs::node_of(3));
        let mut r = NicReader::new(fake.root().to_path_buf());
        assert_eq!(r.scan(Instant::now()).ports.len(), 3);
        let f = fake.clone();
        r.after_list = Some(Box::new(move || f.remove_device("mlx5_1")));
        let s = r.scan(Instant::now());
        r.after_list = None;
        assert!(s.complete);
        let ids: Vec<String> = s.ports.iter().map(|p| p.id.to_string()).collect();
        assert_eq!(ids, ["mlx5_0/1", "mlx5_2/1"]);
        assert_eq!(s.problems, ["mlx5_1/1: vanished during the scan"]);
        let s = r.scan(Instant::now());
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(s.ports.len(), 2);
    }

    /// A vanishing device of two ports, the second port's directory removed
    /// after the first was read: the first is kept.
    #[test]
    fn nic_port_vanishing_mid_scan_keeps_the_ports_read() {
        let fake = Arc::new(FakeSysfs::new());
        fake.add_device("mlx5_0", "0000:1a:00.0", 0);
        for n in [1, 2] {
            fake.add_port(
                "mlx5_0",
                n,
                &gpuwatch_test_support::sysfs::PortSpec::ib_ndr(),
            );
        }
        let mut r = NicReader::new(fake.root().to_path_buf());
        assert_eq!(r.scan(Instant::now()).ports.len(), 2);
        let f = fake.clone();
        r.after_list = Some(Box::new(move || {
            std::fs::remove_dir_all(f.port_dir("mlx5_0", 2)).unwrap();
        }));
        let s = r.scan(Instant::now());
        assert_eq!(s.ports.len(), 1);
        assert_eq!(s.ports[0].id.port, 1);
        assert_eq!(s.problems, ["mlx5_0/2: vanished during the scan"]);
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What `f` logs at WARN and above, as text.
    fn warnings_of(f: impl FnOnce()) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    /// A RoCE port without a netdev (what a container's own `/sys` shows of
    /// the host's netdevs) is logged once, naming it and the remedy; an
    /// InfiniBand or EFA port without one is not, nor a RoCE port with one.
    #[test]
    fn nic_roce_port_without_netdev_is_logged_once() {
        use gpuwatch_test_support::sysfs::PortSpec;
        let fake = FakeSysfs::node_of(2);
        fake.add_device("mlx5_7", "0000:70:00.0", 0);
        fake.add_port("mlx5_7", 1, &PortSpec::roce_200());
        fake.add_device("mlx5_8", "0000:71:00.0", 0);
        fake.add_port("mlx5_8", 1, &PortSpec::ib_ndr());
        fake.add_efa_device("rdmap16s0", "0000:72:00.0", 0);
        let text = warnings_of(|| {
            let mut r = NicReader::new(fake.root().to_path_buf());
            for _ in 0..5 {
                let s = r.scan(Instant::now());
                assert_eq!(s.ports.len(), 5);
            }
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        for part in [
            "ports=mlx5_7/1 ",
            "RoCE ports without a netdev",
            "/host/sys",
        ] {
            assert!(lines[0].contains(part), "{part} not in {}", lines[0]);
        }
    }

    /// Unreadable counters are logged once, one line per device naming them
    /// all; a class directory that cannot be listed is logged once too.
    #[test]
    fn nic_unreadable_counters_are_logged_once_per_device() {
        let fake = FakeSysfs::node_of(2);
        fake.make_counter_unreadable("mlx5_0", 1, "symbol_error");
        fake.set_counter_text("mlx5_0", 1, "port_rcv_errors", "N/A");
        fake.make_counter_unreadable("mlx5_0", 1, "hw_counters/out_of_buffer");
        let text = warnings_of(|| {
            let mut r = NicReader::new(fake.root().to_path_buf());
            for _ in 0..5 {
                r.scan(Instant::now());
            }
            fake.break_class_dir();
            for _ in 0..5 {
                assert!(!r.scan(Instant::now()).complete);
            }
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let l = lines[0];
        assert!(l.contains("mlx5_0") && !l.contains("mlx5_1"), "{l}");
        for part in [
            "counters/symbol_error (Is a directory",
            "counters/port_rcv_errors (N/A)",
            "hw_counters/out_of_buffer (Is a directory",
        ] {
            assert!(l.contains(part), "{part} not in {l}");
        }
        assert!(
            lines[1].contains("Cannot list the RDMA devices"),
            "{}",
            lines[1]
        );
    }
}
