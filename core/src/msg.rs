//! Messages that travel from the sources to the health engine.

use gpuwatch_proto::{FaultEvent, GpuSample, ValidationReport};
use std::time::Instant;

/// One input to the health engine. Sources send these over bounded crossbeam
/// channels; the engine thread is the only owner of health state.
// Faults are the common message; boxing them would add an allocation per event
// on the hot path for no gain (channel slots are preallocated either way).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Input {
    /// A fault event parsed from the kernel log or produced by an NVML source
    /// (already classified by the xid-parser policy; the engine may re-classify
    /// with context: recurrence, NVML state). `read_at` is when the source read
    /// the record (for the read → emitted latency histogram).
    Fault {
        /// The fault as the source reported it; its PCI address may not be
        /// normalised yet and its GPU identity may be missing (the engine
        /// joins it).
        event: FaultEvent,
        /// When the source read the underlying record.
        read_at: Instant,
    },
    /// One NVML poll: a sample for every GPU NVML could read.
    Samples {
        /// One sample per GPU that answered (identity filled from earlier polls
        /// when a later identity call failed).
        samples: Vec<GpuSample>,
        /// True when every enumerated GPU was read (or answered `GPU_IS_LOST`).
        /// Only a complete poll may declare a GPU missing: a GPU absent from an
        /// incomplete poll is a monitor problem, never a hardware verdict.
        complete: bool,
    },
    /// The state of an input: `ok` false means gpuwatch cannot tell what
    /// that input covers (for `kmsg` and `nvml` the verdict is `unknown`; for
    /// the others only their part: the network, which pods hold a GPU, the
    /// Node writer), never a hardware fault.
    MonitorStatus {
        /// The input the status is about.
        input: MonitorInput,
        /// False: the input cannot see faults now (logged once per change).
        ok: bool,
        /// Human-readable detail (the error when not ok).
        message: String,
    },
    /// A device validation result (startup gate or re-validation).
    Validation(ValidationReport),
    /// The kmsg source finished its first pass over the kernel ring buffer
    /// (faults logged before the agent started are known):
    /// `MonitorStatus.kmsg_caught_up` becomes true.
    KmsgCaughtUp,
    /// Operator clear (`POST /v1/clear`, `gpuwatch clear`): remove the active
    /// faults of one GPU (index, UUID or PCI address) or, with `gpu: None`, of
    /// every GPU and the node. Recurrence history is kept.
    Clear {
        /// Index, UUID or PCI address; `None`: all.
        gpu: Option<String>,
        /// Why (logged with every cleared fault).
        reason: String,
        /// Receives the number of faults cleared once the engine applied it.
        reply: Option<crossbeam_channel::Sender<usize>>,
    },
    /// The kernel-log reader's exact position: every record of boot
    /// `boot_id` up to `seq` was read and every fault event of those records
    /// was sent before this message, and no event of a later record was sent
    /// yet. The engine stores it in the same atomic write as the faults it
    /// accounted for, so a restart resumes after it and neither counts a
    /// record twice nor skips one. Sent only by a reader of the kernel device
    /// (a replay has no position).
    KmsgProgress(KmsgPosition),
    /// Where the node's pods run (the pods bound to it, the devices each
    /// container holds): what the engine names a fault's pods from.
    Placement(crate::placement::PlacementUpdate),
    /// One sysfs scan of the node's RDMA ports (the NIC poller); applied
    /// only while the engine's NIC monitor is on.
    Network(crate::network::NicScan),
    /// Periodic tick (expire dedup windows, persist when dirty).
    Tick,
}

/// A position in the kernel log: the last record (by sequence number) of
/// one boot whose fault events the engine's state accounts for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KmsgPosition {
    /// `/proc/sys/kernel/random/boot_id` of the boot the sequence numbers belong to.
    pub boot_id: String,
    /// Sequence number of the last record accounted for.
    pub last_seq: u64,
}

/// A monitoring input whose health is tracked separately from GPU health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MonitorInput {
    /// The kernel log reader.
    Kmsg,
    /// NVML (library load, init, enumeration).
    Nvml,
    /// The NIC poller (sysfs reads of the RDMA ports): down while a read has
    /// not returned within its deadline. It covers only `NodeHealth.network`
    /// (`NetworkProblem` Unknown, `NICMonitorUnavailable`), never the GPUs.
    Network,
    /// The kubelet's PodResources poller: down while a call has not returned
    /// (or the poller has not come round) within its deadline. It covers
    /// only which pods hold a GPU: fault records say the pods may be stale.
    PodResources,
    /// The listing of the pods bound to the Node (list and watch): as
    /// [`MonitorInput::PodResources`], for the pods' names and owners.
    PodListing,
    /// The Node writer's reconcile loop: down while it has not come round
    /// within its deadline. Nothing else on the node can write the Node for
    /// it, so this shows only in `/v1/health`, the metric and the log.
    KubeWriter,
}

impl MonitorInput {
    /// Its name in log lines (the `input` field).
    pub fn as_str(self) -> &'static str {
        match self {
            MonitorInput::Kmsg => "kmsg",
            MonitorInput::Nvml => "nvml",
            MonitorInput::Network => "network",
            MonitorInput::PodResources => "pod_resources",
            MonitorInput::PodListing => "pod_listing",
            MonitorInput::KubeWriter => "kube_writer",
        }
    }
}

/// Emitted events the engine hands back to the source that reads the kernel
/// log, which refills them for its next events instead of allocating new
/// ones ([`spent_events`]).
pub type SpentSender = crossbeam_channel::Sender<FaultEvent>;

/// The source's end of [`spent_events`].
pub type SpentReceiver = crossbeam_channel::Receiver<FaultEvent>;

/// Events on their way back at most; past this, the engine drops them.
pub const SPENT_EVENTS: usize = 64;

/// The way back for emitted events: the engine sends each event once every
/// sink has taken it, the kernel-log reader takes them before it builds its
/// next events. A kernel-log event's strings and buffers are allocated by
/// the reader thread and freed by the engine thread; reused instead, a burst
/// costs neither thread an allocator call per event string (with glibc,
/// memory freed on another thread than the one that allocated it also
/// makes both threads take the slow paths of the allocator). The channel is
/// bounded and never blocks either side: what does not fit is dropped, a
/// reader with events enough drops the rest.
pub fn spent_events() -> (SpentSender, SpentReceiver) {
    crossbeam_channel::bounded(SPENT_EVENTS)
}
