//! A fake `/sys` for the NIC reader's tests and benchmark: RDMA devices, their
//! ports, counters and netdevs laid out the way the kernel lays them out, in a
//! temporary directory.
//!
//! What the tree looks like, and where each part comes from:
//!
//! - `sys/devices/pci0000:00/0000:00:01.0/<bdf>/`: the PCI function, with
//!   `numa_node` (`-1` when the platform has no NUMA information;
//!   `drivers/pci/pci-sysfs.c`, `numa_node_show`) and `vendor` (`0x15b3`
//!   Mellanox, `0x1d0f` Amazon; `vendor_show`, `"0x%04x\n"`).
//! - `<bdf>/infiniband/<dev>/`: the RDMA device (`drivers/infiniband/core/
//!   device.c` registers it under its parent, the PCI function), with
//!   `<dev>/device` a relative link back to `<bdf>` (the driver core's
//!   `device` link, `drivers/base/core.c`, `device_add_class_symlinks`).
//! - `sys/class/infiniband/<dev>`: a relative link to that directory, as
//!   `/sys/class/*` entries are links into `/sys/devices`.
//! - `<dev>/ports/<n>/{state,phys_state,rate,link_layer}`: formatted as
//!   `drivers/infiniband/core/sysfs.c` does (`state_show`: `"%d: %s\n"` as
//!   `4: ACTIVE`; `phys_state_show`: `5: LinkUp`; `rate_show`:
//!   `400 Gb/sec (4X NDR)`; `link_layer_show`: `InfiniBand` / `Ethernet`).
//! - `<dev>/ports/<n>/counters/`: every PortCounters file of `sysfs.c`'s
//!   `pma_attrs` and `pma_attrs_ext` tables (the error counters and the data
//!   counters such as `port_xmit_data`), each `"%llu\n"` / `"%u\n"`.
//! - `<dev>/ports/<n>/hw_counters/`: the mlx5 driver's RDMA counters
//!   (`drivers/infiniband/hw/mlx5/counters.c`, the `basic_q_cnts`,
//!   `out_of_seq_q_cnts`, `retrans_q_cnts`, `extended_err_cnts`,
//!   `roce_accl_cnts` and congestion tables; 27 files) plus the `lifespan`
//!   setting that `sysfs.c` adds to every `hw_counters` directory
//!   (`alloc_hw_stats_port`): a number, but not a counter.
//! - `<bdf>/net/<if>/{dev_port,carrier_changes}` and `sys/class/net/<if>` a
//!   link to it (`net/core/net-sysfs.c`: `dev_port` is the 0-based port of a
//!   multi-port device, `carrier_changes` is `carrier_up_count +
//!   carrier_down_count`). A port that leaves or reaches ACTIVE
//!   ([`FakeSysfs::set_port_state`]) adds one to the `carrier_changes` of its
//!   netdev (the one whose `dev_port` is the port less one), as the kernel
//!   does: `netif_carrier_off` / `netif_carrier_on` (`net/sched/
//!   sch_generic.c`) increment the down / up count on every change of the
//!   carrier bit; a RoCE port's state is its netdev's carrier (mlx5's
//!   `mlx5_query_port_roce` reports ACTIVE only while `netif_carrier_ok`),
//!   and IPoIB takes its carrier off when the IB port leaves ACTIVE and puts
//!   it back when it rejoins the broadcast group (`drivers/infiniband/ulp/
//!   ipoib`). [`FakeSysfs::flap_port`] is a down and up quicker than any
//!   poll: the state files never show it, `carrier_changes` rises by two.
//! - AWS EFA devices ([`FakeSysfs::add_efa_device`], `rdmap<n>s0`): an
//!   Amazon PCI function (`vendor` `0x1d0f`, `device` `0xefa1`;
//!   `drivers/infiniband/hw/efa/efa_main.c`, `efa_pci_tbl`) with one port
//!   that says `4: ACTIVE`, `5: LinkUp` and `100 Gb/sec (4X EDR)` whatever
//!   happens (`efa_verbs.c`, `efa_query_port`), `link_layer` `Unknown` (the
//!   ib core's `link_layer_show` for a device whose link layer is
//!   unspecified), no `counters/` (the EFA driver answers no PortCounters
//!   MADs) and the driver's port statistics in `hw_counters/`
//!   ([`EFA_HW_COUNTERS`]: `efa_verbs.c`, `EFA_DEFINE_PORT_STATS`); no
//!   netdev.
//!
//! Every value ends with a newline, as the kernel's `show` functions write
//! them. Values are replaced by writing a new file and renaming it over the
//! old one, so a reader on another thread sees the old or the new value,
//! never an empty or half-written file (a sysfs read returns one snapshot of
//! `show`'s output).
//!
//! Failures that regular files cannot reproduce are stood in for:
//!
//! - [`FakeSysfs::make_counter_unreadable`]: the driver's error return of a
//!   counter read (`EINVAL` from `sysfs.c`'s `get_perf_mad` when the
//!   PortCounters MAD fails, as on restricted NICs and virtual functions) is
//!   a directory in the file's place: its `open` succeeds and its `read`
//!   fails (`EISDIR`), the same syscall pattern, and it fails for root too
//!   (file modes do not).
//! - [`FakeSysfs::set_counter_text`] with `N/A`: what some drivers print for a
//!   counter they do not support.
//! - [`FakeSysfs::break_class_dir`]: a class directory that cannot be listed
//!   (`EACCES` under a restrictive mount or LSM) is a regular file in its
//!   place (`ENOTDIR`), which fails for root too.
//! - [`FakeSysfs::make_counter_blocking`]: a counter read that does not
//!   return (an mlx5 `hw_counters` read waits for a firmware command,
//!   `mlx5_ib_get_hw_stats` → `mlx5_cmd_exec`, and a wedged firmware keeps it
//!   waiting) is a FIFO in the file's place: its `open` for reading blocks
//!   until a writer opens it (fifo(7)), in an interruptible sleep, so the
//!   process can still be killed. [`FakeSysfs::unblock_counter`] opens it for
//!   writing, puts a regular file in its place and writes the value: the
//!   blocked read returns that value and the next reads find the file.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The PCI bridge every fake function hangs off.
const BRIDGE: &str = "devices/pci0000:00/0000:00:01.0";

/// The error counters and data counters of a port's `counters/` directory
/// (`drivers/infiniband/core/sysfs.c`, `pma_attrs` and `pma_attrs_ext`).
pub const PMA_COUNTERS: &[&str] = &[
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
];

/// The mlx5 driver's `hw_counters/` files (`drivers/infiniband/hw/mlx5/
/// counters.c`), without `lifespan`.
pub const MLX5_HW_COUNTERS: &[&str] = &[
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
];

/// The EFA driver's per-port `hw_counters/` files
/// (`drivers/infiniband/hw/efa/efa_verbs.c`, `EFA_DEFINE_PORT_STATS`), without
/// `lifespan`.
pub const EFA_HW_COUNTERS: &[&str] = &[
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
];

/// A port's files as first written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// `link_layer`: `InfiniBand` or `Ethernet`.
    pub link_layer: String,
    /// `state`, as `4: ACTIVE`.
    pub state: String,
    /// `phys_state`, as `5: LinkUp`.
    pub phys_state: String,
    /// `rate`, as `400 Gb/sec (4X NDR)`.
    pub rate: String,
    /// Whether the port has an mlx5 `hw_counters/` directory.
    pub hw_counters: bool,
}

impl PortSpec {
    /// An active InfiniBand NDR port (ConnectX-7) with `hw_counters/`.
    pub fn ib_ndr() -> PortSpec {
        PortSpec {
            link_layer: "InfiniBand".into(),
            state: "4: ACTIVE".into(),
            phys_state: "5: LinkUp".into(),
            rate: "400 Gb/sec (4X NDR)".into(),
            hw_counters: true,
        }
    }

    /// An active 200 Gb/s RoCE port with `hw_counters/`.
    pub fn roce_200() -> PortSpec {
        PortSpec {
            link_layer: "Ethernet".into(),
            state: "4: ACTIVE".into(),
            phys_state: "5: LinkUp".into(),
            rate: "200 Gb/sec (4X HDR)".into(),
            hw_counters: true,
        }
    }
}

/// A fake sysfs tree in a temporary directory, deleted on drop. Test code:
/// every method panics with the path when the file system refuses.
pub struct FakeSysfs {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Default for FakeSysfs {
    fn default() -> FakeSysfs {
        FakeSysfs::new()
    }
}

impl FakeSysfs {
    /// An empty tree with `class/infiniband` and `class/net` (a node with the
    /// RDMA core loaded and no devices yet).
    pub fn new() -> FakeSysfs {
        FakeSysfs::new_in(&std::env::temp_dir()).expect("create a temporary directory")
    }

    /// An empty tree as [`FakeSysfs::new`] makes, in a new temporary
    /// directory inside `parent` (a program's own scratch directory); an
    /// error when `parent` does not take it. The other methods panic as
    /// usual.
    pub fn new_in(parent: &Path) -> std::io::Result<FakeSysfs> {
        let dir = tempfile::Builder::new()
            .prefix("sysfs-")
            .tempdir_in(parent)?;
        let root = dir.path().join("sys");
        for d in ["class/infiniband", "class/net", BRIDGE] {
            fs::create_dir_all(root.join(d))?;
        }
        fs::create_dir_all(dir.path().join("staging"))?;
        Ok(FakeSysfs { dir, root })
    }

    /// The sysfs root (`/sys`), for `NetworkSettings::sysfs_root`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The temporary directory that holds the tree.
    pub fn tempdir(&self) -> &Path {
        self.dir.path()
    }

    /// The RDMA device's own directory (what `class/infiniband/<dev>` links to).
    pub fn device_dir(&self, dev: &str) -> PathBuf {
        let link = self.root.join("class/infiniband").join(dev);
        let target = fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
        link.parent().expect("class dir").join(target)
    }

    /// A port's directory.
    pub fn port_dir(&self, dev: &str, port: u32) -> PathBuf {
        self.device_dir(dev).join("ports").join(port.to_string())
    }

    /// Adds a PCI function `bdf` (`0000:1a:00.0`) on NUMA node `numa` (-1: none)
    /// with the RDMA device `dev` (`mlx5_0`) and no ports yet. A second device
    /// on the same function shares its directory.
    pub fn add_device(&self, dev: &str, bdf: &str, numa: i32) {
        self.add_device_of(dev, bdf, numa, "0x15b3");
    }

    /// Adds an AWS EFA device `dev` (`rdmap16s27`) on the Amazon PCI function
    /// `bdf`, NUMA node `numa`, with its one port as the EFA driver shows it
    /// and every `hw_counters/` file at 0 (see the module documentation).
    pub fn add_efa_device(&self, dev: &str, bdf: &str, numa: i32) {
        self.add_device_of(dev, bdf, numa, "0x1d0f");
        let func = self.root.join(BRIDGE).join(bdf);
        self.write(&func.join("device"), "0xefa1");
        let dir = self.port_dir(dev, 1);
        mkdir(&dir.join("hw_counters"));
        self.write(&dir.join("link_layer"), "Unknown");
        self.write(&dir.join("state"), "4: ACTIVE");
        self.write(&dir.join("phys_state"), "5: LinkUp");
        self.write(&dir.join("rate"), "100 Gb/sec (4X EDR)");
        for c in EFA_HW_COUNTERS {
            self.write(&dir.join("hw_counters").join(c), "0");
        }
        self.write(&dir.join("hw_counters/lifespan"), "10");
    }

    /// A node of `n` AWS EFA devices as on a p5 instance: `rdmap<16+i>s0`
    /// on PCI functions `0000:<0x10+i>:00.0` (`n` up to 200), NUMA node
    /// `i / (n/2)`.
    pub fn efa_node_of(n: u32) -> FakeSysfs {
        let fake = FakeSysfs::new();
        let half = (n / 2).max(1);
        for i in 0..n {
            fake.add_efa_device(
                &format!("rdmap{}s0", 16 + i),
                &format!("0000:{:02x}:00.0", 0x10 + i),
                i32::try_from(i / half).unwrap_or(0),
            );
        }
        fake
    }

    fn add_device_of(&self, dev: &str, bdf: &str, numa: i32, vendor: &str) {
        let func = self.root.join(BRIDGE).join(bdf);
        mkdir(&func);
        self.write(&func.join("numa_node"), &numa.to_string());
        self.write(&func.join("vendor"), vendor);
        let dev_dir = func.join("infiniband").join(dev);
        mkdir(&dev_dir.join("ports"));
        // From <bdf>/infiniband/<dev>: up two levels is <bdf>.
        link(&format!("../../../{bdf}"), &dev_dir.join("device"));
        self.write(&dev_dir.join("node_type"), "1: CA");
        link(
            &format!("../../{BRIDGE}/{bdf}/infiniband/{dev}"),
            &self.root.join("class/infiniband").join(dev),
        );
    }

    /// Adds port `port` (from 1) to `dev` with every `counters/` file at 0 and,
    /// when `spec.hw_counters`, the mlx5 `hw_counters/` files at 0.
    pub fn add_port(&self, dev: &str, port: u32, spec: &PortSpec) {
        let dir = self.port_dir(dev, port);
        mkdir(&dir.join("counters"));
        self.write(&dir.join("link_layer"), &spec.link_layer);
        self.write(&dir.join("state"), &spec.state);
        self.write(&dir.join("phys_state"), &spec.phys_state);
        self.write(&dir.join("rate"), &spec.rate);
        for c in PMA_COUNTERS {
            self.write(&dir.join("counters").join(c), "0");
        }
        if spec.hw_counters {
            mkdir(&dir.join("hw_counters"));
            for c in MLX5_HW_COUNTERS {
                self.write(&dir.join("hw_counters").join(c), "0");
            }
            self.write(&dir.join("hw_counters/lifespan"), "10");
        }
    }

    /// Adds the netdev `ifname` to `dev`'s PCI function, as port `dev_port + 1`
    /// of the device, with `carrier_changes` at 0, and its `class/net` link.
    pub fn add_netdev(&self, dev: &str, ifname: &str, dev_port: u32) {
        let func = self.device_dir(dev).join("device");
        let bdf = fs::canonicalize(&func)
            .unwrap_or_else(|e| panic!("{}: {e}", func.display()))
            .file_name()
            .expect("a PCI function")
            .to_string_lossy()
            .into_owned();
        let dir = self.root.join(BRIDGE).join(&bdf).join("net").join(ifname);
        mkdir(&dir);
        self.write(&dir.join("dev_port"), &dev_port.to_string());
        self.write(&dir.join("carrier_changes"), "0");
        link(
            &format!("../../{BRIDGE}/{bdf}/net/{ifname}"),
            &self.root.join("class/net").join(ifname),
        );
    }

    /// Sets `counters/<name>` of a port.
    pub fn set_counter(&self, dev: &str, port: u32, name: &str, value: u64) {
        self.set_counter_text(dev, port, name, &value.to_string());
    }

    /// Sets `hw_counters/<name>` of a port.
    pub fn set_hw_counter(&self, dev: &str, port: u32, name: &str, value: u64) {
        let path = self.port_dir(dev, port).join("hw_counters").join(name);
        replace_dir(&path);
        self.write(&path, &value.to_string());
    }

    /// Writes `text` (a newline is added) as `counters/<name>`, replacing
    /// what was there (an unreadable stand-in included): `N/A`, garbage.
    pub fn set_counter_text(&self, dev: &str, port: u32, name: &str, text: &str) {
        let path = self.port_dir(dev, port).join("counters").join(name);
        replace_dir(&path);
        self.write(&path, text);
    }

    /// Makes `counters/<name>` (or, as `hw_counters/<name>`, a hardware
    /// counter) fail its read, as the driver's `EINVAL` does (see the module
    /// documentation).
    pub fn make_counter_unreadable(&self, dev: &str, port: u32, name: &str) {
        let path = self.counter_path(dev, port, name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{}: {e}", path.display()),
        }
        mkdir(&path);
    }

    fn counter_path(&self, dev: &str, port: u32, name: &str) -> PathBuf {
        match name.strip_prefix("hw_counters/") {
            Some(hw) => self.port_dir(dev, port).join("hw_counters").join(hw),
            None => self.port_dir(dev, port).join("counters").join(name),
        }
    }

    /// Makes `counters/<name>` (or, as `hw_counters/<name>`, a hardware
    /// counter) a read that does not return until [`FakeSysfs::unblock_counter`]
    /// (see the module documentation); returns its path.
    pub fn make_counter_blocking(&self, dev: &str, port: u32, name: &str) -> PathBuf {
        let path = self.counter_path(dev, port, name);
        let staged = self.staging_path();
        nix::unistd::mkfifo(&staged, nix::sys::stat::Mode::from_bits_truncate(0o644))
            .unwrap_or_else(|e| panic!("mkfifo {}: {e}", staged.display()));
        replace_dir(&path);
        fs::rename(&staged, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    /// Lets the read of a counter made blocking return `value`: opens the
    /// FIFO for writing (at once when a reader waits in its `open`; else it
    /// waits for one), replaces it with a regular file holding `value`, then
    /// writes `value` into the FIFO and closes it.
    pub fn unblock_counter(&self, dev: &str, port: u32, name: &str, value: u64) {
        use std::io::Write;
        let path = self.counter_path(dev, port, name);
        let mut fifo = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {} for writing: {e}", path.display()));
        self.write(&path, &value.to_string());
        match writeln!(fifo, "{value}") {
            // The reader gave up on the FIFO before the value came (its
            // open returned with ours and it closed): nothing waits for it.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        }
    }

    /// Writes any port file (`rate`, `state`, `counters/symbol_error`) as
    /// `text` (a newline is added).
    pub fn write_port_file(&self, dev: &str, port: u32, file: &str, text: &str) {
        self.write(&self.port_dir(dev, port).join(file), text);
    }

    /// Sets the port's `state` and `phys_state` (`4: ACTIVE`, `5: LinkUp`).
    /// When the port leaves or reaches ACTIVE (its netdev's carrier goes off
    /// or on), adds one to the `carrier_changes` of the port's netdevs,
    /// after the state files are written (see the module documentation).
    pub fn set_port_state(&self, dev: &str, port: u32, state: &str, phys_state: &str) {
        let state_file = self.port_dir(dev, port).join("state");
        let was_active = fs::read_to_string(&state_file)
            .unwrap_or_else(|e| panic!("{}: {e}", state_file.display()))
            .starts_with("4:");
        self.write_port_file(dev, port, "state", state);
        self.write_port_file(dev, port, "phys_state", phys_state);
        if was_active != state.starts_with("4:") {
            for ifname in self.port_netdevs(dev, port) {
                self.bump_carrier_changes(&ifname);
            }
        }
    }

    /// A link flap of an ACTIVE port quicker than any poll (a down and up
    /// within milliseconds): the state files are not touched, and each of
    /// the port's netdevs' `carrier_changes` rises by two (one down, one up)
    /// in one write, so a reader sees the flap whole or not yet. Returns the
    /// new `carrier_changes` of each netdev, by name.
    pub fn flap_port(&self, dev: &str, port: u32) -> Vec<(String, u64)> {
        let state_file = self.port_dir(dev, port).join("state");
        let state = fs::read_to_string(&state_file)
            .unwrap_or_else(|e| panic!("{}: {e}", state_file.display()));
        assert!(
            state.starts_with("4:"),
            "{dev}/{port} is not ACTIVE ({}): only a port that is up can flap",
            state.trim()
        );
        self.port_netdevs(dev, port)
            .into_iter()
            .map(|ifname| {
                let n = self.carrier_changes(&ifname) + 2;
                self.set_carrier_changes(&ifname, n);
                (ifname, n)
            })
            .collect()
    }

    /// The netdevs of `dev`'s PCI function whose `dev_port` is `port - 1`,
    /// sorted by name (none for an EFA device or a port without a netdev).
    fn port_netdevs(&self, dev: &str, port: u32) -> Vec<String> {
        let net = self.device_dir(dev).join("device/net");
        let entries = match fs::read_dir(&net) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => panic!("{}: {e}", net.display()),
        };
        let mut names: Vec<String> = entries
            .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", net.display())))
            .filter(|e| {
                let dev_port = e.path().join("dev_port");
                fs::read_to_string(&dev_port)
                    .unwrap_or_else(|e| panic!("{}: {e}", dev_port.display()))
                    .trim()
                    == (port - 1).to_string()
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort_unstable();
        names
    }

    /// The port up: `4: ACTIVE`, `5: LinkUp`.
    pub fn set_port_up(&self, dev: &str, port: u32) {
        self.set_port_state(dev, port, "4: ACTIVE", "5: LinkUp");
    }

    /// The port down as with the cable out: `1: DOWN`, `2: Polling`.
    pub fn set_port_down(&self, dev: &str, port: u32) {
        self.set_port_state(dev, port, "1: DOWN", "2: Polling");
    }

    /// Sets the netdev's `carrier_changes`.
    pub fn set_carrier_changes(&self, ifname: &str, n: u64) {
        self.write(
            &self
                .root
                .join("class/net")
                .join(ifname)
                .join("carrier_changes"),
            &n.to_string(),
        );
    }

    /// The netdev's `carrier_changes`.
    pub fn carrier_changes(&self, ifname: &str) -> u64 {
        let path = self
            .root
            .join("class/net")
            .join(ifname)
            .join("carrier_changes");
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{}: {text:?}: {e}", path.display()))
    }

    /// Adds one to the netdev's `carrier_changes` (a flap, down and up, is
    /// two), without touching any port's state files.
    pub fn bump_carrier_changes(&self, ifname: &str) -> u64 {
        let n = self.carrier_changes(ifname) + 1;
        self.set_carrier_changes(ifname, n);
        n
    }

    /// Removes the RDMA device: its `class/infiniband` link and its directory,
    /// as unloading the RDMA driver (or unbinding the function) does. The PCI
    /// function and its netdevs stay.
    pub fn remove_device(&self, dev: &str) {
        let dir = self.device_dir(dev);
        let link = self.root.join("class/infiniband").join(dev);
        fs::remove_file(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
        fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }

    /// Removes `class/infiniband` itself: a node without the RDMA core.
    pub fn remove_class_dir(&self) {
        let dir = self.root.join("class/infiniband");
        fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }

    /// Puts a regular file where `class/infiniband` was, so listing it fails
    /// (see the module documentation); [`FakeSysfs::restore_class_dir`] undoes it.
    pub fn break_class_dir(&self) {
        let dir = self.root.join("class/infiniband");
        let aside = self.root.join("class/.infiniband.aside");
        fs::rename(&dir, &aside).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        self.write(&dir, "not a directory");
    }

    /// Puts back the class directory [`FakeSysfs::break_class_dir`] moved aside.
    pub fn restore_class_dir(&self) {
        let dir = self.root.join("class/infiniband");
        let aside = self.root.join("class/.infiniband.aside");
        fs::remove_file(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        fs::rename(&aside, &dir).unwrap_or_else(|e| panic!("{}: {e}", aside.display()));
    }

    /// Writes `text` and a newline to a new file in the staging directory
    /// beside `sys/`, then renames it over `path`: a concurrent reader sees the
    /// old or the new value, and a concurrent listing never sees the new file
    /// under another name.
    /// A fresh path in the staging directory (renamed into place from there).
    fn staging_path(&self) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join("staging").join(n.to_string())
    }

    fn write(&self, path: &Path, text: &str) {
        let tmp = self.staging_path();
        fs::write(&tmp, format!("{text}\n")).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
        fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// A node of `n` NICs, one port each, as on an 8-GPU server (one NIC per
    /// GPU): even ones InfiniBand NDR (`mlx5_<i>`, netdev `ib<i>`), odd ones
    /// RoCE 200 Gb/s (netdev `eth<i>`), PCI functions `0000:1a:00.0`,
    /// `0000:1b:00.0`, ..., NUMA node `i / (n/2)` (`n` up to 229).
    pub fn node_of(n: u32) -> FakeSysfs {
        let fake = FakeSysfs::new();
        let half = (n / 2).max(1);
        for i in 0..n {
            let dev = format!("mlx5_{i}");
            let bdf = format!("0000:{:02x}:00.0", 0x1a + i);
            fake.add_device(&dev, &bdf, i32::try_from(i / half).unwrap_or(0));
            if i % 2 == 0 {
                fake.add_port(&dev, 1, &PortSpec::ib_ndr());
                fake.add_netdev(&dev, &format!("ib{i}"), 0);
            } else {
                fake.add_port(&dev, 1, &PortSpec::roce_200());
                fake.add_netdev(&dev, &format!("eth{i}"), 0);
            }
        }
        fake
    }
}

fn mkdir(path: &Path) {
    fs::create_dir_all(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn link(target: &str, at: &Path) {
    symlink(target, at).unwrap_or_else(|e| panic!("{} -> {target}: {e}", at.display()));
}

/// Removes the directory that stands for an unreadable file, if one is there.
fn replace_dir(path: &Path) {
    if path.is_dir() {
        fs::remove_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
