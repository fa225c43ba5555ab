//! The NIC reader (`gpuwatch::NicReader`) over a fake sysfs tree shaped like the
//! kernel's (`gpuwatch_test_support::sysfs`): an 8-NIC node of InfiniBand and
//! RoCE ports, counters that rise, saturate and reset, counters the driver
//! refuses (read once), devices that come and go, a node without RDMA
//! devices, a class directory that cannot be listed, and the poller thread.

use gpuwatch::{InputContext, NicReader, RELAYOUT_EVERY, spawn_nic_poller};
use gpuwatch_core::Shutdown;
use gpuwatch_core::msg::Input;
use gpuwatch_core::network::{
    CounterValue, LinkLayer, NetworkSettings, NicScan, PhysState, PortReading, PortState,
};
use gpuwatch_test_support::sysfs::{FakeSysfs, PortSpec};
use std::time::{Duration, Instant};

// The counters a port reports, written out from the kernel's file names
// (not from the reader's own lists or the fake's, so that a counter dropped
// from either shows).

/// The error counters of the IB PortCounters attribute, in the order the
/// reader reports them: the ib core's `counters/` files of the error fields
/// (`drivers/infiniband/core/sysfs.c`, `pma_attrs`: `symbol_error`,
/// `link_error_recovery`, `link_downed`, `port_rcv_errors`,
/// `port_rcv_remote_physical_errors`, `port_rcv_switch_relay_errors`,
/// `port_xmit_discards`, `port_xmit_constraint_errors`,
/// `port_rcv_constraint_errors`, `local_link_integrity_errors`,
/// `excessive_buffer_overrun_errors`, `VL15_dropped`). The data counters of
/// the same directory (`port_xmit_data`, `port_rcv_packets`, ...) are not
/// reported.
const IB_CORE_ERROR_COUNTERS: [&str; 12] = [
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

/// An mlx5 port's `hw_counters/` files, sorted by name as the reader reports
/// them (`drivers/infiniband/hw/mlx5/counters.c`: `basic_q_cnts`
/// rx_write_requests, rx_read_requests, rx_atomic_requests, rx_dct_connect,
/// out_of_buffer; `out_of_seq_q_cnts` out_of_sequence; `retrans_q_cnts`
/// duplicate_request, rnr_nak_retry_err, packet_seq_err,
/// implied_nak_seq_err, local_ack_timeout_err; `extended_err_cnts`
/// resp_local_length_error, resp_cqe_error, req_cqe_error,
/// req_remote_invalid_request, req_remote_access_errors,
/// resp_remote_access_errors, resp_cqe_flush_error, req_cqe_flush_error;
/// `roce_accl_cnts` roce_adp_retrans, roce_adp_retrans_to, roce_slow_restart,
/// roce_slow_restart_cnps, roce_slow_restart_trans; of `cong_cnts`
/// rp_cnp_handled and np_cnp_sent; `ext_ppcnt_cnts` rx_icrc_encapsulated:
/// the 27 the fake gives an mlx5 port), less `lifespan` (the ib core's cache
/// setting, `drivers/infiniband/core/sysfs.c`, `alloc_hw_stats_port`).
const MLX5_HW_COUNTERS_SORTED: [&str; 27] = [
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
];

/// An EFA port's `hw_counters/` files, sorted by name as the reader reports
/// them (`drivers/infiniband/hw/efa/efa_verbs.c`, `EFA_DEFINE_PORT_STATS`:
/// tx_bytes, tx_pkts, rx_bytes, rx_pkts, rx_drops, send_bytes, send_wrs,
/// recv_bytes, recv_wrs, rdma_read_wrs, rdma_read_bytes, rdma_read_wr_err,
/// rdma_read_resp_bytes, rdma_write_wrs, rdma_write_bytes,
/// rdma_write_wr_err, rdma_write_recv_bytes, retrans_bytes, retrans_pkts,
/// retrans_timeout_events, unresponsive_remote_events,
/// impaired_remote_conn_events), less `lifespan`; no `counters/` (the EFA
/// driver answers no PortCounters MADs).
const EFA_HW_COUNTERS_SORTED: [&str; 22] = [
    "impaired_remote_conn_events",
    "rdma_read_bytes",
    "rdma_read_resp_bytes",
    "rdma_read_wr_err",
    "rdma_read_wrs",
    "rdma_write_bytes",
    "rdma_write_recv_bytes",
    "rdma_write_wr_err",
    "rdma_write_wrs",
    "recv_bytes",
    "recv_wrs",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "rx_bytes",
    "rx_drops",
    "rx_pkts",
    "send_bytes",
    "send_wrs",
    "tx_bytes",
    "tx_pkts",
    "unresponsive_remote_events",
];

fn reader(fake: &FakeSysfs) -> NicReader {
    NicReader::new(fake.root().to_path_buf())
}

fn port<'s>(scan: &'s NicScan, device: &str, number: u32) -> &'s PortReading {
    scan.ports
        .iter()
        .find(|p| p.id.device == device && p.id.port == number)
        .unwrap_or_else(|| panic!("no {device}/{number} in {scan:#?}"))
}

fn counter(p: &PortReading, name: &str) -> CounterValue {
    p.counters
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no counter {name} in {:?}", p.counters))
        .value
}

/// AWS EFA devices (Amazon's PCI vendor): their port is read as
/// [`LinkLayer::Efa`] (sysfs says `Unknown`), never up although its files say
/// ACTIVE/LinkUp, with every EFA `hw_counters` file; an mlx5 device beside
/// them stays InfiniBand. A device that leaves sysfs is gone from the next
/// scan.
#[test]
fn nic_reader_reads_efa_devices_by_their_vendor() {
    let fake = FakeSysfs::efa_node_of(4);
    fake.add_device("mlx5_0", "0000:a0:00.0", 1);
    fake.add_port("mlx5_0", 1, &PortSpec::ib_ndr());
    fake.set_hw_counter("rdmap17s0", 1, "rx_drops", 42);
    let mut r = reader(&fake);
    let scan = r.scan(Instant::now());
    assert!(scan.problems.is_empty(), "{:?}", scan.problems);
    let names: Vec<String> = scan.ports.iter().map(|p| p.id.to_string()).collect();
    assert_eq!(
        names,
        [
            "mlx5_0/1",
            "rdmap16s0/1",
            "rdmap17s0/1",
            "rdmap18s0/1",
            "rdmap19s0/1"
        ]
    );
    assert_eq!(port(&scan, "mlx5_0", 1).link_layer, LinkLayer::InfiniBand);
    let p = port(&scan, "rdmap17s0", 1);
    assert_eq!(p.link_layer, LinkLayer::Efa);
    assert_eq!(
        (p.state, p.phys_state),
        (PortState::Active, PhysState::LinkUp)
    );
    assert!(!p.is_up(), "an EFA port's state is no evidence");
    assert_eq!(p.rate_gbps, Some(100.0));
    assert_eq!(p.netdev, None);
    assert_eq!(p.pci_address.as_deref(), Some("0000:11:00.0"));
    let names: Vec<&str> = p.counters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names, EFA_HW_COUNTERS_SORTED,
        "every hw_counters file but lifespan, no counters/"
    );
    assert_eq!(counter(p, "rx_drops"), CounterValue::Value(42));
    fake.remove_device("rdmap18s0");
    let scan = r.scan(Instant::now());
    assert!(scan.problems.is_empty(), "{:?}", scan.problems);
    assert_eq!(scan.ports.len(), 4);
    assert!(scan.ports.iter().all(|p| p.id.device != "rdmap18s0"));
}

#[test]
fn nic_reader_reads_an_eight_nic_node() {
    let fake = FakeSysfs::node_of(8);
    let scan = reader(&fake).scan(Instant::now());
    assert!(scan.complete);
    assert!(scan.problems.is_empty(), "{:?}", scan.problems);
    let names: Vec<String> = scan.ports.iter().map(|p| p.id.to_string()).collect();
    let expected: Vec<String> = (0..8).map(|i| format!("mlx5_{i}/1")).collect();
    assert_eq!(names, expected, "device then port order");
    for (i, p) in scan.ports.iter().enumerate() {
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.phys_state, PhysState::LinkUp);
        assert!(p.is_up());
        assert_eq!(
            p.pci_address.as_deref(),
            Some(&*format!("0000:{:02x}:00.0", 0x1a + i))
        );
        assert_eq!(p.numa_node, Some(u32::from(i >= 4)));
        if i % 2 == 0 {
            assert_eq!(p.link_layer, LinkLayer::InfiniBand);
            assert_eq!(p.rate_gbps, Some(400.0));
            assert_eq!(p.netdev.as_deref(), Some(&*format!("ib{i}")));
            assert_eq!(
                p.carrier_changes, None,
                "carrier_changes is read for RoCE only"
            );
        } else {
            assert_eq!(p.link_layer, LinkLayer::Ethernet);
            assert_eq!(p.rate_gbps, Some(200.0));
            assert_eq!(p.netdev.as_deref(), Some(&*format!("eth{i}")));
            assert_eq!(p.carrier_changes, Some(0));
        }
        // The error counters in their order, then every hw counter by name;
        // no data counter, no `lifespan`.
        let got: Vec<&str> = p.counters.iter().map(|c| c.name.as_str()).collect();
        let want: Vec<&str> = IB_CORE_ERROR_COUNTERS
            .into_iter()
            .chain(MLX5_HW_COUNTERS_SORTED)
            .collect();
        assert_eq!(got, want);
        assert!(p.counters.iter().all(|c| c.value == CounterValue::Value(0)));
    }
}

#[test]
fn nic_counters_rise_saturate_and_reset() {
    let fake = FakeSysfs::node_of(2);
    let mut r = reader(&fake);
    fake.set_counter("mlx5_0", 1, "symbol_error", 7);
    fake.set_counter("mlx5_0", 1, "excessive_buffer_overrun_errors", 3);
    fake.set_hw_counter("mlx5_1", 1, "out_of_sequence", 41);
    let s = r.scan(Instant::now());
    let p = port(&s, "mlx5_0", 1);
    assert_eq!(counter(p, "symbol_error"), CounterValue::Value(7));
    assert_eq!(
        counter(p, "excessive_buffer_overrun_errors"),
        CounterValue::Value(3)
    );
    assert_eq!(
        counter(port(&s, "mlx5_1", 1), "out_of_sequence"),
        CounterValue::Value(41)
    );

    // Saturated: a 4-bit counter stays at 15, a 16-bit one at 65535.
    fake.set_counter("mlx5_0", 1, "excessive_buffer_overrun_errors", 15);
    fake.set_counter("mlx5_0", 1, "symbol_error", 65535);
    fake.set_hw_counter("mlx5_1", 1, "out_of_sequence", u64::MAX);
    for _ in 0..2 {
        let s = r.scan(Instant::now());
        let p = port(&s, "mlx5_0", 1);
        assert_eq!(
            counter(p, "excessive_buffer_overrun_errors"),
            CounterValue::Value(15)
        );
        assert_eq!(counter(p, "symbol_error"), CounterValue::Value(65535));
        assert_eq!(
            counter(port(&s, "mlx5_1", 1), "out_of_sequence"),
            CounterValue::Value(u64::MAX)
        );
    }

    // Reset (perfquery -x -r, or a driver reload).
    fake.set_counter("mlx5_0", 1, "excessive_buffer_overrun_errors", 0);
    fake.set_counter("mlx5_0", 1, "symbol_error", 0);
    let s = r.scan(Instant::now());
    let p = port(&s, "mlx5_0", 1);
    assert_eq!(counter(p, "symbol_error"), CounterValue::Value(0));
    assert_eq!(
        counter(p, "excessive_buffer_overrun_errors"),
        CounterValue::Value(0)
    );
}

/// EINVAL (stood in for by a read that fails), `N/A` and garbage are read
/// once: a valid file put in their place later is never opened, while the
/// other counters of the port, and the same counter of other ports, are.
#[test]
fn nic_refused_counters_are_read_once() {
    let fake = FakeSysfs::node_of(2);
    let mut r = reader(&fake);
    fake.make_counter_unreadable("mlx5_0", 1, "symbol_error");
    fake.make_counter_unreadable("mlx5_0", 1, "hw_counters/out_of_buffer");
    fake.set_counter_text("mlx5_0", 1, "port_xmit_discards", "N/A");
    fake.set_counter_text("mlx5_0", 1, "link_downed", "0x1f");
    fake.set_counter("mlx5_0", 1, "port_rcv_errors", 2);
    let refused = [
        "symbol_error",
        "out_of_buffer",
        "port_xmit_discards",
        "link_downed",
    ];
    let check = |s: &NicScan, rcv_errors: u64| {
        assert!(s.complete && s.problems.is_empty(), "{s:#?}");
        let p = port(s, "mlx5_0", 1);
        for name in refused {
            assert_eq!(counter(p, name), CounterValue::Unreadable, "{name}");
        }
        assert_eq!(
            counter(p, "port_rcv_errors"),
            CounterValue::Value(rcv_errors)
        );
        let other = port(s, "mlx5_1", 1);
        for name in refused {
            assert!(matches!(counter(other, name), CounterValue::Value(_)));
        }
    };
    check(&r.scan(Instant::now()), 2);

    fake.set_counter("mlx5_0", 1, "symbol_error", 5);
    fake.set_hw_counter("mlx5_0", 1, "out_of_buffer", 5);
    fake.set_counter("mlx5_0", 1, "port_xmit_discards", 5);
    fake.set_counter("mlx5_0", 1, "link_downed", 5);
    fake.set_counter("mlx5_0", 1, "port_rcv_errors", 3);
    check(&r.scan(Instant::now()), 3);

    // Still not read after the layout is rebuilt (a device came and went).
    fake.remove_device("mlx5_1");
    let s = r.scan(Instant::now());
    assert_eq!(s.ports.len(), 1);
    for name in refused {
        assert_eq!(
            counter(port(&s, "mlx5_0", 1), name),
            CounterValue::Unreadable
        );
    }
}

#[test]
fn nic_device_removed_and_added_between_scans() {
    let fake = FakeSysfs::node_of(8);
    let mut r = reader(&fake);
    assert_eq!(r.scan(Instant::now()).ports.len(), 8);
    fake.remove_device("mlx5_3");
    let s = r.scan(Instant::now());
    assert!(s.complete);
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.ports.len(), 7);
    assert!(s.ports.iter().all(|p| p.id.device != "mlx5_3"));

    // Back on another function (a new name would be just as well).
    fake.add_device("mlx5_3", "0000:9c:00.0", 1);
    fake.add_port("mlx5_3", 1, &PortSpec::roce_200());
    fake.add_device("mlx5_10", "0000:9d:00.0", 1);
    fake.add_port("mlx5_10", 1, &PortSpec::ib_ndr());
    let s = r.scan(Instant::now());
    assert_eq!(s.ports.len(), 9);
    let p = port(&s, "mlx5_3", 1);
    assert_eq!(p.pci_address.as_deref(), Some("0000:9c:00.0"));
    assert_eq!(p.netdev, None, "its netdev is on the old function");
    assert_eq!(
        s.ports.last().map(|p| p.id.device.as_str()),
        Some("mlx5_10"),
        "mlx5_10 sorts after mlx5_7"
    );
}

#[test]
fn nic_node_without_rdma_devices_is_complete_and_empty() {
    let fake = FakeSysfs::new();
    let mut r = reader(&fake);
    let s = r.scan(Instant::now());
    assert!(s.complete && s.ports.is_empty() && s.problems.is_empty());
    fake.remove_class_dir();
    let s = r.scan(Instant::now());
    assert!(
        s.complete && s.ports.is_empty() && s.problems.is_empty(),
        "{s:?}"
    );

    // A root that is not a sysfs mount at all is not "no devices".
    let s = NicReader::new(fake.tempdir().join("nowhere")).scan(Instant::now());
    assert!(!s.complete);
    assert_eq!(s.problems.len(), 1, "{:?}", s.problems);
}

#[test]
fn nic_class_dir_that_cannot_be_listed_is_an_incomplete_scan() {
    let fake = FakeSysfs::node_of(2);
    let mut r = reader(&fake);
    assert_eq!(r.scan(Instant::now()).ports.len(), 2);
    fake.break_class_dir();
    for _ in 0..2 {
        let s = r.scan(Instant::now());
        assert!(!s.complete);
        assert!(s.ports.is_empty());
        assert!(
            s.problems.len() == 1 && s.problems[0].contains("class/infiniband"),
            "{:?}",
            s.problems
        );
    }
    fake.restore_class_dir();
    let s = r.scan(Instant::now());
    assert!(s.complete && s.problems.is_empty());
    assert_eq!(s.ports.len(), 2);
}

/// A RoCE port's flaps show in its state and in its netdev's
/// `carrier_changes`, which the fake raises on every carrier change as the
/// kernel does; a flap quicker than the poll shows in `carrier_changes`
/// only.
#[test]
fn nic_roce_port_flaps_show_in_state_and_carrier_changes() {
    let fake = FakeSysfs::node_of(2);
    let mut r = reader(&fake);
    fake.set_port_down("mlx5_1", 1);
    let s = r.scan(Instant::now());
    let p = port(&s, "mlx5_1", 1);
    assert_eq!(
        (p.state, p.phys_state),
        (PortState::Down, PhysState::Polling)
    );
    assert!(!p.is_up());
    assert_eq!(p.carrier_changes, Some(1));
    // Down again (another phys_state) is no carrier change.
    fake.set_port_state("mlx5_1", 1, "1: DOWN", "3: Disabled");
    assert_eq!(
        port(&r.scan(Instant::now()), "mlx5_1", 1).carrier_changes,
        Some(1)
    );
    fake.set_port_up("mlx5_1", 1);
    let s = r.scan(Instant::now());
    let p = port(&s, "mlx5_1", 1);
    assert!(p.is_up());
    assert_eq!(p.carrier_changes, Some(2));
    assert!(port(&s, "mlx5_0", 1).is_up());

    // Down and up between two scans: the state says nothing.
    assert_eq!(fake.flap_port("mlx5_1", 1), [("eth1".to_string(), 4)]);
    let s = r.scan(Instant::now());
    let p = port(&s, "mlx5_1", 1);
    assert!(p.is_up());
    assert_eq!(p.carrier_changes, Some(4));
    assert_eq!(port(&s, "mlx5_0", 1).carrier_changes, None, "InfiniBand");
    assert_eq!(fake.carrier_changes("eth1"), 4);
    assert_eq!(fake.carrier_changes("ib0"), 0);
}

#[test]
fn nic_garbage_and_missing_port_files_are_unknown() {
    let fake = FakeSysfs::node_of(2);
    let mut r = reader(&fake);
    fake.write_port_file("mlx5_0", 1, "state", "");
    fake.write_port_file("mlx5_0", 1, "phys_state", "LinkUp");
    fake.write_port_file("mlx5_0", 1, "rate", "fast");
    fake.write_port_file("mlx5_0", 1, "link_layer", "Fibre Channel");
    std::fs::remove_file(fake.port_dir("mlx5_1", 1).join("rate")).unwrap();
    let state = fake.port_dir("mlx5_1", 1).join("state");
    std::fs::remove_file(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
    let s = r.scan(Instant::now());
    assert!(s.complete && s.problems.is_empty(), "{s:#?}");
    let p = port(&s, "mlx5_0", 1);
    assert_eq!(p.state, PortState::Unknown);
    assert_eq!(p.phys_state, PhysState::Unknown);
    assert_eq!(p.rate_gbps, None);
    assert_eq!(p.link_layer, LinkLayer::Unknown);
    assert_eq!(p.carrier_changes, None, "not known to be Ethernet");
    let p = port(&s, "mlx5_1", 1);
    assert_eq!(p.rate_gbps, None);
    assert_eq!(p.state, PortState::Unknown);
    assert_eq!(p.link_layer, LinkLayer::Ethernet);
}

#[test]
fn nic_multi_port_device_matches_netdevs_by_dev_port() {
    let fake = FakeSysfs::new();
    fake.add_device("mlx4_0", "0000:05:00.0", -1);
    fake.add_port("mlx4_0", 1, &PortSpec::roce_200());
    fake.add_port("mlx4_0", 2, &PortSpec::roce_200());
    fake.add_netdev("mlx4_0", "enp5s0d1", 1);
    fake.add_netdev("mlx4_0", "enp5s0", 0);
    let s = reader(&fake).scan(Instant::now());
    assert_eq!(port(&s, "mlx4_0", 1).netdev.as_deref(), Some("enp5s0"));
    assert_eq!(port(&s, "mlx4_0", 2).netdev.as_deref(), Some("enp5s0d1"));
    assert_eq!(port(&s, "mlx4_0", 1).numa_node, None, "numa_node -1");
}

/// The layout is cached: a netdev that appears after its device (IPoIB
/// loaded late) shows from the next periodic rebuild on, and a renamed one
/// at the next scan after its old name stops answering.
#[test]
fn nic_layout_is_rebuilt_periodically_and_on_vanished_paths() {
    let fake = FakeSysfs::new();
    fake.add_device("mlx5_0", "0000:1a:00.0", 0);
    fake.add_port("mlx5_0", 1, &PortSpec::roce_200());
    let mut r = reader(&fake);
    assert_eq!(port(&r.scan(Instant::now()), "mlx5_0", 1).netdev, None);
    fake.add_netdev("mlx5_0", "eth0", 0);
    let mut scans = 1;
    let s = loop {
        let s = r.scan(Instant::now());
        scans += 1;
        if port(&s, "mlx5_0", 1).netdev.is_some() || scans > RELAYOUT_EVERY + 1 {
            break s;
        }
    };
    assert_eq!(
        scans,
        RELAYOUT_EVERY + 1,
        "seen at the first periodic rebuild"
    );
    assert_eq!(port(&s, "mlx5_0", 1).carrier_changes, Some(0));

    // Renamed: `carrier_changes` of the old name is gone, the next scan
    // lays the device out again.
    let old = fake.root().join("class/net/eth0");
    let target = std::fs::read_link(&old).unwrap();
    let new_target = target.with_file_name("ens1f0");
    let dir = old.parent().unwrap();
    std::fs::rename(dir.join(&target), dir.join(&new_target)).unwrap();
    std::fs::remove_file(&old).unwrap();
    std::os::unix::fs::symlink(&new_target, dir.join("ens1f0")).unwrap();
    let s = r.scan(Instant::now());
    assert!(s.problems.is_empty());
    assert_eq!(port(&s, "mlx5_0", 1).carrier_changes, None);
    let s = r.scan(Instant::now());
    assert_eq!(port(&s, "mlx5_0", 1).netdev.as_deref(), Some("ens1f0"));
    assert_eq!(port(&s, "mlx5_0", 1).carrier_changes, Some(0));
}

fn settings(fake: &FakeSysfs) -> NetworkSettings {
    NetworkSettings {
        sysfs_root: fake.root().to_path_buf(),
        poll_interval: Duration::from_millis(100),
        ..NetworkSettings::default()
    }
}

/// The scans the poller offered, in order (other inputs are not expected).
fn scan_of(input: Input) -> NicScan {
    match input {
        Input::Network(scan) => scan,
        other => panic!("not a NIC scan: {other:?}"),
    }
}

#[test]
fn nic_poller_stops_when_the_engine_is_gone() {
    let fake = FakeSysfs::node_of(2);
    let (tx, rx) = crossbeam_channel::unbounded();
    let h = spawn_nic_poller(settings(&fake), InputContext::new(Shutdown::new(), tx)).unwrap();
    let scans: Vec<NicScan> = (0..3)
        .map(|_| scan_of(rx.recv_timeout(Duration::from_secs(10)).expect("a scan")))
        .collect();
    drop(rx);
    let ended = gpuwatch_core::join_by(h, Instant::now() + Duration::from_secs(10));
    assert!(matches!(ended, Ok(Ok(()))), "the poller ended");
    assert!(scans.iter().all(|s| s.complete && s.ports.len() == 2));
    // On a cadence of 100 ms (generous bounds for a loaded machine).
    let span = scans[2].at - scans[0].at;
    assert!(span >= Duration::from_millis(190), "{span:?}");
}

#[test]
fn nic_poller_stops_at_shutdown_during_its_wait() {
    let fake = FakeSysfs::node_of(2);
    let shutdown = Shutdown::new();
    let (tx, rx) = crossbeam_channel::unbounded();
    let h = spawn_nic_poller(
        NetworkSettings {
            poll_interval: Duration::from_secs(3600),
            ..settings(&fake)
        },
        InputContext::new(shutdown.clone(), tx),
    )
    .unwrap();
    let first = scan_of(
        rx.recv_timeout(Duration::from_secs(10))
            .expect("a first scan at once"),
    );
    assert_eq!(first.ports.len(), 2);
    let t = Instant::now();
    shutdown.trigger();
    let ended = gpuwatch_core::join_by(h, Instant::now() + Duration::from_secs(10));
    assert!(matches!(ended, Ok(Ok(()))));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    // Disabled: ends without a scan.
    let (tx, rx) = crossbeam_channel::unbounded();
    let h = spawn_nic_poller(
        NetworkSettings {
            enabled: false,
            ..settings(&fake)
        },
        InputContext::new(Shutdown::new(), tx),
    )
    .unwrap();
    assert!(matches!(
        gpuwatch_core::join_by(h, Instant::now() + Duration::from_secs(10)),
        Ok(Ok(()))
    ));
    assert!(rx.try_recv().is_err());
}
