//! `gpuwatch-demo`: a narrated run of the real agent on this machine, across a
//! simulated reboot. Its own binary: the container image ships only `gpuwatch`.
//!
//! Phase 1 starts `gpuwatch run` as a child process reading a kernel log (the
//! stdout JSON sink, the nvml-sim library driven by a scenario, a temporary
//! state directory, the Kubernetes writer in dry-run, NVML polled every
//! second), writes scripted NVIDIA kernel lines into it at the times the
//! scenario injects its XIDs, and
//! narrates what the agent reports: every emitted event (detection,
//! classification, reclassification), every cleared fault with the agent's
//! reason (from its JSON log), and every change of a GPU's or the node's
//! verdict (polled from `/v1/health`).
//!
//! Phase 2 simulates a reboot: the agent is stopped with SIGTERM (it flushes its
//! state), a new boot id is written to the file the agent reads it from
//! (`--boot-id-path`), and the agent restarts on the same state directory with
//! the after-reboot scenario. The narration shows which faults the new boot
//! clears and why the others stay — all taken from the agent, none scripted.
//!
//! Which kernel log: fake XID lines in a GPU node's real log would reach every
//! other monitor there (most do not filter the user facility) and send the
//! on-call to reboot a healthy node. So where an NVIDIA driver is loaded, or
//! `/dev/kmsg` is not writable, the demo creates a private FIFO, writes
//! kmsg-format records into it and points the agent's `--kmsg-path` at it (the
//! same reader code path as `/dev/kmsg`). Elsewhere it uses the real
//! `/dev/kmsg` (as root: it sets `printk_devkmsg=on` while it runs, since the
//! default `ratelimit` drops all but 10 writes per open, and restores it), and
//! afterwards shows how the injected lines look in `dmesg -x`.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PRINTK_DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";
/// NVML poll interval of the demo agent at speed 1.
const POLL_MS: u64 = 1000;
/// Consecutive clean samples before an NVML-condition fault clears (the
/// engine default, stated here so the narration can name it).
const CLEAR_SAMPLES: u32 = 3;

/// Flags of `gpuwatch demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// nvml-sim scenario of the first boot (GPUs and timed faults).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "nvml-sim/scenarios/demo.toml"
    )]
    pub scenario: PathBuf,
    /// nvml-sim scenario after the simulated reboot.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "nvml-sim/scenarios/demo-after-reboot.toml"
    )]
    pub reboot_scenario: PathBuf,
    /// Stop after the first boot (no simulated reboot).
    #[arg(long)]
    pub no_reboot: bool,
    /// How long the first boot runs; 0: until 3 s after the scenario's last
    /// injection (at least 20 s).
    #[arg(long, default_value_t = 0)]
    pub duration_secs: u64,
    /// Write the scripted kernel lines into this machine's real /dev/kmsg
    /// (refused where an NVIDIA driver is loaded; default: /dev/kmsg only where
    /// no driver is loaded and it is writable, else a private FIFO).
    #[arg(long, conflicts_with = "fifo")]
    pub kmsg: bool,
    /// Feed the agent through a private kmsg-format FIFO even where /dev/kmsg
    /// could be used.
    #[arg(long)]
    pub fifo: bool,
    /// The gpuwatch binary to run (default: `gpuwatch` beside this program).
    #[arg(long, value_name = "FILE")]
    pub agent: Option<PathBuf>,
    /// Runs the timeline this many times faster (scenario times, NVML poll
    /// interval, phase lengths); for tests.
    #[arg(long, hide = true, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub speed: u32,
}

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The scenario could not be read or parsed.
    #[error("cannot use scenario {path}: {message}")]
    Scenario {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The requested kernel log cannot be used.
    #[error("{0}")]
    Input(String),
    /// Setting up the machine failed.
    #[error("{what}: {source}")]
    Setup {
        /// What failed.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The agent did not start or failed.
    #[error("the agent failed: {0}")]
    Agent(String),
}

/// One scripted kernel line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedLine {
    /// Milliseconds after the agent started.
    pub at_ms: u64,
    /// The kernel message.
    pub message: String,
    /// What the narration says when it is written.
    pub note: String,
}

/// A scenario GPU (index → PCI address).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SimGpu {
    index: u64,
    pci: String,
}

fn kernel_pci(pci: &str) -> String {
    // NVRM prints `dddd:bb:dd` (domain, bus, device) without the function.
    let norm = xid_parser::normalize_pci(pci).unwrap_or_else(|| pci.to_ascii_lowercase());
    norm.rsplit_once('.')
        .map_or(norm.clone(), |(a, _)| a.to_string())
}

/// The one PCI address format of the narration, the agent's own
/// (`0000:18:00.0`), whatever the scenario file wrote.
fn display_pci(pci: &str) -> String {
    xid_parser::normalize_pci(pci).unwrap_or_else(|| pci.to_ascii_lowercase())
}

fn xid_text(xid: u64) -> &'static str {
    match xid {
        79 => "GPU has fallen off the bus.",
        48 => {
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
        }
        63 => "Row Remapper: New row marked for remapping, reset gpu to activate.",
        64 => "Row Remapper Error: failed to remap row.",
        74 => "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        94 => "Contained: SM (0x1). RST: No, D-RST: No",
        95 => "Uncontained: FBHUB. RST: Yes, D-RST: No",
        119 => {
            "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)."
        }
        _ => "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    }
}

/// Builds the kernel-line script from a scenario's text: one NVRM Xid line
/// per `[[inject]]` with an `xid` (at the same time), a row-remapper line for
/// an injected `remapped_rows_failure`, and an application fault (XID 13) on
/// another GPU 3 s after the first injection, to show that application faults
/// do not isolate the node.
pub fn script_from_scenario(text: &str) -> Result<Vec<ScriptedLine>, String> {
    let v: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    let gpus: Vec<SimGpu> = v
        .get("gpu")
        .and_then(|g| g.as_array())
        .map(|a| {
            a.iter()
                .enumerate()
                .filter_map(|(i, g)| {
                    Some(SimGpu {
                        index: g
                            .get("index")
                            .and_then(|x| x.as_integer())
                            .map_or(i as u64, |x| x as u64),
                        pci: g.get("pci")?.as_str()?.to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    if gpus.is_empty() {
        return Err("the scenario has no [[gpu]] with a pci address".into());
    }
    let pci_of = |idx: u64| gpus.iter().find(|g| g.index == idx).map(|g| g.pci.clone());
    let mut script = Vec::new();
    let mut pid = 31_337;
    for inj in v
        .get("inject")
        .and_then(|i| i.as_array())
        .cloned()
        .unwrap_or_default()
    {
        let at_ms = inj.get("at_ms").and_then(|x| x.as_integer()).unwrap_or(0) as u64;
        let Some(pci) = inj
            .get("gpu")
            .and_then(|x| x.as_integer())
            .and_then(|g| pci_of(g as u64))
        else {
            continue;
        };
        let note = inj
            .get("note")
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string();
        pid += 1;
        if let Some(xid) = inj.get("xid").and_then(|x| x.as_integer()) {
            let xid = xid as u64;
            script.push(ScriptedLine {
                at_ms,
                message: format!(
                    "NVRM: Xid (PCI:{}): {xid}, pid={pid}, name=train.py, {}",
                    kernel_pci(&pci),
                    xid_text(xid)
                ),
                note: if note.is_empty() {
                    format!("kernel reports XID {xid} on {}", display_pci(&pci))
                } else {
                    note.clone()
                },
            });
        }
        if inj.get("xid").is_none()
            && inj.get("remapped_rows_failure").and_then(|x| x.as_bool()) == Some(true)
        {
            script.push(ScriptedLine {
                at_ms,
                message: format!(
                    "NVRM: Xid (PCI:{}): 64, pid={pid}, name=train.py, {}",
                    kernel_pci(&pci),
                    xid_text(64)
                ),
                note: if note.is_empty() {
                    format!("row remapping fails on {}", display_pci(&pci))
                } else {
                    note.clone()
                },
            });
        }
    }
    if let Some(first) = script.iter().map(|s| s.at_ms).min() {
        let lost_pci = script
            .first()
            .map(|s| s.message.clone())
            .unwrap_or_default();
        if let Some(other) = gpus
            .iter()
            .find(|g| !lost_pci.contains(&kernel_pci(&g.pci)))
        {
            script.push(ScriptedLine {
                at_ms: first + 3000,
                message: format!(
                    "NVRM: Xid (PCI:{}): 13, pid=4711, name=notebook.py, {}",
                    kernel_pci(&other.pci),
                    xid_text(13)
                ),
                note: format!(
                    "an application crashes on {} (XID 13)",
                    display_pci(&other.pci)
                ),
            });
        }
    }
    script.sort_by_key(|s| s.at_ms);
    Ok(script)
}

fn last_inject_ms(text: &str) -> u64 {
    toml::from_str::<toml::Value>(text)
        .ok()
        .and_then(|v| {
            v.get("inject")?.as_array().map(|a| {
                a.iter()
                    .filter_map(|i| i.get("at_ms")?.as_integer())
                    .max()
                    .unwrap_or(0) as u64
            })
        })
        .unwrap_or(0)
}

/// Sequence number of the newest record in a kmsg device.
fn last_kmsg_seq(path: &Path) -> Option<u64> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    let mut last = None;
    loop {
        match f.read(&mut buf) {
            Ok(n) if n > 0 => {
                if let Ok(rec) = xid_parser::parse_kmsg_record(&buf[..n]) {
                    last = Some(rec.seq);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            _ => return last,
        }
    }
}

/// Where the demo's kernel lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelLogKind {
    /// This machine's `/dev/kmsg` (records land as facility user).
    Device,
    /// A private FIFO of kmsg-format records, read through `--kmsg-path`.
    Fifo,
}

/// Present when an NVIDIA kernel module is loaded.
const NVIDIA_DRIVER_PROC: &str = "/proc/driver/nvidia";
const DEV_KMSG: &str = "/dev/kmsg";

/// Chooses the kernel log from the flags and the machine, with the sentence
/// the demo prints about it; an error when `--kmsg` cannot be honoured.
pub fn choose_kernel_log(
    force_kmsg: bool,
    force_fifo: bool,
    driver_loaded: bool,
    kmsg_writable: bool,
) -> Result<(KernelLogKind, String), String> {
    let fifo = |why: &str| {
        Ok((
            KernelLogKind::Fifo,
            format!("{why}: the agent reads the demo's lines from a private FIFO (--kmsg-path)."),
        ))
    };
    if force_kmsg && driver_loaded {
        return Err(format!(
            "an NVIDIA driver is loaded here ({NVIDIA_DRIVER_PROC}); the demo does not write fake \
             XIDs into a GPU node's kernel log, where other monitors would read them (run \
             without --kmsg to use a FIFO)"
        ));
    }
    if force_kmsg && !kmsg_writable {
        return Err(format!(
            "{DEV_KMSG} is not writable (run as root, or without --kmsg)"
        ));
    }
    if force_kmsg {
        return Ok((
            KernelLogKind::Device,
            format!("--kmsg: the demo writes into this machine's kernel log ({DEV_KMSG})."),
        ));
    }
    if force_fifo {
        return fifo("--fifo");
    }
    if driver_loaded {
        return fifo("An NVIDIA driver is loaded here, so its kernel log is left alone");
    }
    if !kmsg_writable {
        return fifo(&format!("{DEV_KMSG} is not writable (not root)"));
    }
    Ok((
        KernelLogKind::Device,
        format!(
            "No NVIDIA driver here: the demo writes into this machine's kernel log ({DEV_KMSG}) \
             as user-facility records."
        ),
    ))
}

/// The kernel log the demo writes its scripted lines into.
struct KernelLog {
    kind: KernelLogKind,
    /// What the agent reads (`--kmsg-path`).
    path: PathBuf,
    file: std::fs::File,
    /// FIFO records: the last sequence number written.
    seq: u64,
}

impl KernelLog {
    fn device() -> Result<KernelLog, DemoError> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(DEV_KMSG)
            .map_err(setup_err(format!("cannot open {DEV_KMSG} for writing")))?;
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
            .map_err(setup_err(format!("cannot open {}", path.display())))?;
        Ok(KernelLog {
            kind: KernelLogKind::Fifo,
            path,
            file,
            seq: 0,
        })
    }

    /// Writes one NVIDIA driver line at the driver's own priority: NVRM's XID
    /// lines are KERN_WARNING (`<4>` in `dmesg -r` of a real H200 driver).
    /// The kernel turns a userspace write into facility user; in the FIFO the
    /// record is written as the kernel would log the driver's line.
    fn write(&mut self, message: &str) -> std::io::Result<()> {
        let record = match self.kind {
            KernelLogKind::Device => format!("<4>{message}\n"),
            KernelLogKind::Fifo => {
                self.seq += 1;
                let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
                    .map_err(std::io::Error::from)?;
                let usec = now.tv_sec() as u64 * 1_000_000 + now.tv_nsec() as u64 / 1_000;
                format!("4,{},{usec},-;{message}\n", self.seq)
            }
        };
        self.file.write_all(record.as_bytes())
    }

    /// Where the narration says a line went.
    fn label(&self) -> &'static str {
        match self.kind {
            KernelLogKind::Device => "/dev/kmsg",
            KernelLogKind::Fifo => "FIFO",
        }
    }
}

/// The records of `path` after `after_seq` whose message is one of `messages`,
/// formatted as `dmesg -x` prints them (`user  :warn  : [  704.029133] …`).
fn dmesg_x_view(path: &Path, after_seq: u64, messages: &[String]) -> Vec<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const FACILITIES: [&str; 4] = ["kern", "user", "mail", "daemon"];
    const LEVELS: [&str; 8] = [
        "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
    ];
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    else {
        return Vec::new();
    };
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = Vec::new();
    loop {
        match f.read(&mut buf) {
            Ok(n) if n > 0 => {
                let Ok(rec) = xid_parser::parse_kmsg_record(&buf[..n]) else {
                    continue;
                };
                let msg = String::from_utf8_lossy(rec.message);
                if rec.seq > after_seq && messages.iter().any(|m| *m == msg) {
                    let facility = FACILITIES.get(usize::from(rec.facility)).unwrap_or(&"?");
                    let level = LEVELS[usize::from(rec.level & 7)];
                    out.push(format!(
                        "{facility:<6}:{level:<6}: [{:>12.6}] {msg}",
                        rec.ts_usec as f64 / 1e6
                    ));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            _ => return out,
        }
    }
}

/// Restores `printk_devkmsg` on drop.
struct PrintkGuard(Option<String>);

impl Drop for PrintkGuard {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(PRINTK_DEVKMSG, format!("{old}\n"));
        }
    }
}

/// Kills the agent on drop (error paths).
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split("\r\n\r\n").nth(1).map(str::to_string)
}

/// The scenario with every time divided by `speed` (`[[inject]] at_ms`,
/// `[driver] init_fail_until_ms`).
pub fn scale_scenario(text: &str, speed: u32) -> Result<String, String> {
    let mut v: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    if speed <= 1 {
        return Ok(text.to_string());
    }
    let scale = |x: &mut toml::Value| {
        if let Some(ms) = x.as_integer() {
            *x = toml::Value::Integer(ms / i64::from(speed));
        }
    };
    if let Some(injects) = v.get_mut("inject").and_then(|i| i.as_array_mut()) {
        for inj in injects {
            if let Some(at) = inj.get_mut("at_ms") {
                scale(at);
            }
        }
    }
    if let Some(until) = v
        .get_mut("driver")
        .and_then(|d| d.get_mut("init_fail_until_ms"))
    {
        scale(until);
    }
    toml::to_string(&v).map_err(|e| e.to_string())
}

/// The demo agent's configuration file: NVML polled every `POLL_MS / speed`.
pub fn agent_config(speed: u32) -> String {
    let poll = (POLL_MS / u64::from(speed.max(1))).max(50);
    format!(
        "# Written by `gpuwatch demo`.\n[nvml]\npoll_interval_ms = {poll}\nretry_interval_ms = {poll}\n\n[engine]\ncondition_clear_samples = {CLEAR_SAMPLES}\n"
    )
}

/// A new boot id (the kernel's random UUID source, else time and pid).
fn new_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            let nanos = gpuwatch_core::clock::unix_nanos(std::time::SystemTime::now());
            format!("demo-{nanos:x}-{:x}", std::process::id())
        })
}

/// "GPU 6" out of the engine's "GPU 6 (GPU-…, 0000:ba:00.0)".
fn short_gpu(described: &str) -> &str {
    described.split(" (").next().unwrap_or(described)
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// Where an event came from, in plain words (the schema's `source` values).
fn source_words(source: &str) -> &str {
    match source {
        "kmsg" => "the kernel log",
        "nvml_event" => "an NVML event",
        "nvml_poll" => "NVML polling",
        "log_file" => "a log file",
        "validation" => "device validation",
        other => other,
    }
}

fn describe_event(ev: &Value) -> String {
    let code = ev["code"].as_u64().unwrap_or(0);
    let what = match str_of(ev, "kind") {
        "xid" => format!("XID {code}"),
        "" => "fault".to_string(),
        k => k.replace('_', " "),
    };
    let gpu = match ev["gpu_index"].as_u64() {
        Some(i) => format!("GPU {i} ({})", display_pci(str_of(ev, "pci_address"))),
        None if !str_of(ev, "pci_address").is_empty() => {
            format!("the GPU at {}", display_pci(str_of(ev, "pci_address")))
        }
        None => "the node".to_string(),
    };
    let source = source_words(str_of(ev, "source"));
    match ev["attributes"]["reclassified_from"].as_str() {
        Some(from) => format!(
            "{what} on {gpu}, from {source}: {from} → {} ({})",
            str_of(ev, "action"),
            str_of(ev, "policy_reason")
        ),
        None => format!(
            "{what} on {gpu}, from {source}: {} → action {} ({})",
            str_of(ev, "name"),
            str_of(ev, "action"),
            str_of(ev, "policy_reason")
        ),
    }
}

/// One GPU as `/v1/health` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuView {
    pci: String,
    /// NVML index, once NVML confirmed it in this boot.
    index: Option<u64>,
    verdict: String,
    action: String,
    faults: Vec<String>,
    /// The GPU has an NVML sample (false: lost, or not polled yet).
    answering: bool,
}

impl GpuView {
    fn label(&self) -> String {
        match self.index {
            Some(i) => format!("GPU {i}"),
            None => format!("the GPU at {}", display_pci(&self.pci)),
        }
    }

    fn state(&self) -> String {
        let mut s = self.verdict.clone();
        if !self.faults.is_empty() {
            s.push_str(&format!(" ({}): {}", self.action, self.faults.join(", ")));
        }
        if !self.answering {
            s.push_str(" — not answering NVML");
        }
        s
    }

    /// Same health, ignoring whether NVML confirmed the index yet.
    fn same_as(&self, other: &GpuView) -> bool {
        (&self.verdict, &self.action, &self.faults, self.answering)
            == (
                &other.verdict,
                &other.action,
                &other.faults,
                other.answering,
            )
    }
}

fn gpu_views(h: &Value) -> Vec<GpuView> {
    h["gpus"]
        .as_array()
        .map(|gpus| {
            gpus.iter()
                .map(|g| GpuView {
                    pci: display_pci(str_of(g, "pci_address")),
                    index: g["index"].as_u64(),
                    verdict: str_of(g, "verdict").to_string(),
                    action: str_of(g, "action").to_string(),
                    faults: g["active_faults"]
                        .as_array()
                        .map(|f| f.iter().map(|f| str_of(f, "reason").to_string()).collect())
                        .unwrap_or_default(),
                    answering: !g["sample"].is_null(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The narration line for a GPU whose view changed (`None`: nothing to say —
/// unchanged, or first seen healthy).
fn gpu_change(prev: Option<&GpuView>, cur: &GpuView) -> Option<String> {
    let label = cur.label();
    let healthy = cur.verdict == "healthy" && cur.faults.is_empty();
    match prev {
        Some(p) if p.same_as(cur) => None,
        None if healthy => None,
        None => Some(format!("{label} {}", cur.state())),
        Some(p) if healthy => Some(format!(
            "{label} recovered: {} → healthy, no active fault",
            p.verdict
        )),
        Some(p) if p.verdict != cur.verdict => {
            Some(format!("{label} {} → {}", p.verdict, cur.state()))
        }
        Some(p) if !p.answering && cur.answering => {
            Some(format!("{label} answers NVML again; still {}", cur.state()))
        }
        Some(_) => Some(format!("{label} {}", cur.state())),
    }
}

/// Why a GPU does not validate, from its NVML sample in `/v1/health`.
fn sample_problems(sample: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if sample.is_null() {
        out.push("it does not answer NVML".to_string());
        return out;
    }
    for (key, text) in [
        ("remapped_rows_failure", "remapped_rows_failure=true"),
        ("remapped_rows_pending", "remapped_rows_pending=true"),
        ("retired_pages_pending", "retired_pages_pending=true"),
    ] {
        if sample[key].as_bool() == Some(true) {
            out.push(text.to_string());
        }
    }
    match sample["recovery_action"].as_str() {
        None | Some("none" | "unspecified") => {}
        Some(a) => out.push(format!("recovery_action={a}")),
    }
    let n = |k: &str| sample[k].as_u64();
    if let (Some(w), Some(m)) = (n("pcie_link_width"), n("pcie_link_width_max"))
        && w < m
    {
        out.push(format!("PCIe link x{w}/x{m}"));
    }
    out
}

/// The rule that would clear a fault of this action (from the engine's
/// documented recovery rules).
fn clear_rule(action: &str) -> &'static str {
    match action {
        "inspect_hardware" => {
            "inspect_hardware clears only after a reboot in which the GPU validates for inspect_clear_quiet_secs, or when another GPU (new UUID) sits at this address"
        }
        "reboot_node" => "reboot_node clears after a reboot in which the GPU validates",
        "reset_gpu" => "reset_gpu clears once the GPU validates after a reset or a reboot",
        _ => "it clears when its condition is gone or its active window passes",
    }
}

/// The node's state in plain words: "healthy, 8 GPUs", or "unhealthy:
/// inspect_hardware (RowRemapFailure), 8 GPUs". No action or reason is named
/// when there is none.
fn node_line(h: &Value, gpu_count: Option<usize>) -> String {
    let verdict = match str_of(h, "verdict") {
        "" | "unspecified" => "not known yet",
        v => v,
    };
    let mut s = verdict.to_string();
    let action = str_of(h, "action");
    if !matches!(action, "" | "unspecified") {
        s.push_str(&format!(": {action}"));
    }
    let reason = str_of(h, "reason");
    if !reason.is_empty() && !reason.eq_ignore_ascii_case(verdict) {
        s.push_str(&format!(" ({reason})"));
    }
    match gpu_count {
        Some(1) => s.push_str(", 1 GPU"),
        Some(n) => s.push_str(&format!(", {n} GPUs")),
        None => s.push_str(", GPUs not enumerated yet"),
    }
    s
}

/// Turns what the agent reports into the timeline.
struct Narrator {
    t0: Instant,
    last_node: String,
    gpus: BTreeMap<String, GpuView>,
    /// GPUs NVML enumerated (the node's GPU count), once it answered.
    gpu_count: Option<usize>,
    events: usize,
    /// Faults per final action: a reclassification moves its fault.
    by_action: BTreeMap<String, usize>,
    last_health: Option<Value>,
}

/// Narration lines are at most this long.
const LINE_WIDTH: usize = 120;
/// `[ 12.3s] DETECTED  `: time and tag before the text.
const PREFIX_WIDTH: usize = 19;

/// Splits `text` at spaces into lines of at most `width` characters, the
/// first after nothing, the others after `indent`. A word longer than a line
/// is cut.
pub fn wrap(text: &str, width: usize, indent: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    let mut cur_len = 0usize;
    for word in text.split(' ') {
        let avail = width
            - if lines.is_empty() {
                0
            } else {
                indent.chars().count()
            };
        let wlen = word.chars().count();
        if cur_len > 0 && cur_len + 1 + wlen > avail {
            lines.push(std::mem::take(&mut cur));
            cur_len = 0;
        }
        let avail = width
            - if lines.is_empty() {
                0
            } else {
                indent.chars().count()
            };
        let mut word: String = word.to_string();
        while word.chars().count() > avail && cur_len == 0 {
            let head: String = word.chars().take(avail).collect();
            word = word.chars().skip(avail).collect();
            lines.push(head);
        }
        if cur_len > 0 {
            cur.push(' ');
            cur_len += 1;
        }
        cur_len += word.chars().count();
        cur.push_str(&word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    for l in lines.iter_mut().skip(1) {
        l.insert_str(0, indent);
    }
    lines
}

impl Narrator {
    fn new() -> Narrator {
        Narrator {
            t0: Instant::now(),
            last_node: String::new(),
            gpus: BTreeMap::new(),
            gpu_count: None,
            events: 0,
            by_action: BTreeMap::new(),
            last_health: None,
        }
    }

    fn say(&self, tag: &str, text: &str) {
        let prefix = format!("[{:5.1}s] {tag:<9} ", self.t0.elapsed().as_secs_f64());
        let indent = " ".repeat(PREFIX_WIDTH);
        let body = wrap(text, LINE_WIDTH - PREFIX_WIDTH, "");
        for (i, line) in body.iter().enumerate() {
            let lead = if i == 0 {
                prefix.as_str()
            } else {
                indent.as_str()
            };
            println!("{lead}{line}");
        }
    }

    fn event(&mut self, ev: &Value) {
        let action = str_of(ev, "action").to_string();
        let tag = match ev["attributes"]["reclassified_from"].as_str() {
            Some(from) => {
                // The same fault, now with another action: counted once, by
                // its final action.
                if let Some(c) = self.by_action.get_mut(from) {
                    *c -= 1;
                    if *c == 0 {
                        self.by_action.remove(from);
                    }
                }
                *self.by_action.entry(action).or_default() += 1;
                "RECLASS"
            }
            None => {
                self.events += 1;
                *self.by_action.entry(action).or_default() += 1;
                "DETECTED"
            }
        };
        self.say(tag, &describe_event(ev));
    }

    /// "GPU 6" for the engine's "GPU 6 (GPU-…, 0000:ba:00.0)"; where the
    /// engine has no confirmed index yet ("GPU ? (0000:ba:00.0)"), the index
    /// this narration last saw at that address, else the address.
    fn gpu_label(&self, described: &str) -> String {
        let short = short_gpu(described);
        if short != "GPU ?" {
            return short.to_string();
        }
        let pci = described
            .rsplit([',', '('])
            .next()
            .unwrap_or_default()
            .trim()
            .trim_end_matches(')');
        let pci = display_pci(pci);
        match self.gpus.get(&pci).and_then(|g| g.index) {
            Some(i) => format!("GPU {i}"),
            None => format!("the GPU at {pci}"),
        }
    }

    /// "summary" text of the faults by final action.
    fn actions_summary(&self) -> String {
        if self.by_action.is_empty() {
            return "none".to_string();
        }
        self.by_action
            .iter()
            .map(|(a, c)| format!("{c} {a}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn log(&mut self, v: &Value) {
        let msg = str_of(v, "message");
        match msg {
            "Fault cleared." | "Node-level fault cleared." => {
                let who = if msg == "Fault cleared." {
                    self.gpu_label(str_of(v, "gpu"))
                } else {
                    format!("node device {}", display_pci(str_of(v, "pci")))
                };
                self.say(
                    "CLEARED",
                    &format!(
                        "{who} {} ({}): {}",
                        str_of(v, "fault"),
                        str_of(v, "action"),
                        str_of(v, "reason")
                    ),
                );
            }
            "Observed evidence of a GPU reset." => self.say(
                "EVIDENCE",
                &format!(
                    "{}: {} (reset evidence)",
                    self.gpu_label(str_of(v, "gpu")),
                    str_of(v, "evidence")
                ),
            ),
            m if m.starts_with("Restored health state") => self.say(
                "RESTORED",
                &format!(
                    "{} active fault(s) from the state file: {m}",
                    v["active_faults"].as_u64().unwrap_or(0)
                ),
            ),
            // Narrated through the events and the GPU verdicts.
            "GPU fault became active."
            | "Fault reclassified from NVML's row-remap state."
            | "NVML lost a GPU."
            | "GPU is missing from the NVML enumeration." => {}
            _ if v["level"] == "WARN" || v["level"] == "ERROR" => {
                self.say(&format!("agent {}", str_of(v, "level")), msg);
            }
            _ => {}
        }
    }

    fn health(&mut self, h: Value) {
        let nvml_reported = h["monitor"]["nvml_ok"].as_bool() == Some(true);
        for mut g in gpu_views(&h) {
            let prev = self.gpus.get(&g.pci);
            if !nvml_reported && !g.answering {
                // Restarted agent before its first NVML sample: the GPU's
                // state is not known yet, keep the last one narrated.
                continue;
            }
            if g.index.is_none() {
                g.index = prev.and_then(|p| p.index);
            }
            if let Some(line) = gpu_change(prev, &g) {
                self.say("", &line);
            }
            self.gpus.insert(g.pci.clone(), g);
        }
        if nvml_reported {
            self.gpu_count = h["gpus"].as_array().map(Vec::len);
        }
        let node = node_line(&h, self.gpu_count);
        if node != self.last_node {
            self.say("NODE", &node);
            if !str_of(&h, "message").is_empty() {
                self.say("", str_of(&h, "message"));
            }
            self.last_node = node;
        }
        self.last_health = Some(h);
    }

    /// GPUs that are not healthy at the end, with what keeps them so.
    fn explain_remaining(&self) {
        let Some(h) = &self.last_health else {
            return;
        };
        for g in h["gpus"].as_array().into_iter().flatten() {
            if str_of(g, "verdict") == "healthy" {
                continue;
            }
            let label = g["index"]
                .as_u64()
                .map_or_else(|| str_of(g, "pci_address").to_string(), |i| i.to_string());
            let action = str_of(g, "action");
            let faults: Vec<String> = g["active_faults"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| format!("{} ({})", str_of(f, "reason"), str_of(f, "action")))
                .collect();
            let problems = sample_problems(&g["sample"]);
            let why = if problems.is_empty() {
                "NVML reports nothing wrong now".to_string()
            } else {
                format!(
                    "NVML in this boot reports {}, so the GPU does not validate",
                    problems.join(", ")
                )
            };
            self.say(
                "STAYS",
                &format!(
                    "GPU {label} {} ({action}): {}; {why}; {}.",
                    str_of(g, "verdict"),
                    faults.join(", "),
                    clear_rule(action)
                ),
            );
        }
    }
}

/// What one agent run needs.
struct Phase<'a> {
    /// The gpuwatch executable.
    exe: &'a Path,
    scenario: &'a Path,
    script: &'a [ScriptedLine],
    duration: Duration,
    boot_id_path: &'a Path,
    config: &'a Path,
}

/// Starts the agent, plays the script, narrates, stops the agent with
/// SIGTERM; returns its exit status (`None`: killed after 15 s).
fn run_phase(
    n: &mut Narrator,
    kmsg: &mut KernelLog,
    state: &Path,
    phase: &Phase<'_>,
    stop: &AtomicBool,
) -> Result<Option<ExitStatus>, DemoError> {
    // Start the agent at the kernel log's current end so records from before
    // the demo (or, after the simulated reboot, from the "previous boot") do
    // not crowd the timeline: a position for this boot at the last sequence
    // number. (A real reboot starts with an empty ring; a real first start
    // reads the whole ring.)
    if kmsg.kind == KernelLogKind::Device
        && let Some(last_seq) = last_kmsg_seq(&kmsg.path)
        && let Ok(boot_id) = crate::boot::read_boot_id(phase.boot_id_path)
    {
        let position = gpuwatch_core::msg::KmsgPosition { boot_id, last_seq };
        if let Err(e) = gpuwatch_core::engine::preset_kmsg_position(state, position) {
            n.say(
                "",
                &format!(
                    "cannot pre-set the kernel log position ({e}); the agent reads the whole ring"
                ),
            );
        }
    }
    let mut agent = Command::new(phase.exe);
    agent.args(["run", "--sink", "stdout", "--kube-dry-run"]);
    if kmsg.kind == KernelLogKind::Device {
        // The demo's lines land as facility user in the real kernel log, and
        // by default only kernel records may raise faults.
        agent.arg("--accept-user-facility");
    }
    let mut child = agent
        .args([
            "--api-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--node-name",
            "demo-node",
        ])
        .arg("--config")
        .arg(phase.config)
        .arg("--kmsg-path")
        .arg(&kmsg.path)
        .arg("--nvml-sim")
        .arg(phase.scenario)
        .arg("--state-dir")
        .arg(state)
        .arg("--boot-id-path")
        .arg(phase.boot_id_path)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| DemoError::Agent(format!("cannot start {}: {e}", phase.exe.display())))?;
    let (ev_tx, ev_rx) = mpsc::channel::<Value>();
    let (log_tx, log_rx) = mpsc::channel::<Value>();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&l) {
                    let _ = ev_tx.send(v);
                }
            }
        });
    }
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&l) {
                    let _ = log_tx.send(v);
                }
            }
        });
    }
    let mut child = ChildGuard(Some(child));
    let started = Instant::now();

    // Wait for the API address; narrate what the agent logs meanwhile.
    let mut api = None;
    while api.is_none() && started.elapsed() < Duration::from_secs(20) {
        match log_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(v) if v["message"] == "API listening." => {
                api = v["addr"].as_str().map(str::to_string);
            }
            Ok(v) => n.log(&v),
            Err(_) => {}
        }
        if let Some(Ok(Some(st))) = child.0.as_mut().map(|c| c.try_wait()) {
            return Err(DemoError::Agent(format!("exited early with {st}")));
        }
    }
    let api = api.ok_or_else(|| DemoError::Agent("did not report its API address".into()))?;
    n.say("", &format!("agent started (API http://{api}/v1/health)"));

    let mut next = 0usize;
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let drain = |n: &mut Narrator| {
        while let Ok(ev) = ev_rx.try_recv() {
            n.event(&ev);
        }
        while let Ok(v) = log_rx.try_recv() {
            n.log(&v);
        }
    };
    while started.elapsed() < phase.duration && !stop.load(Ordering::Relaxed) {
        while next < phase.script.len()
            && started.elapsed() >= Duration::from_millis(phase.script[next].at_ms)
        {
            let line = &phase.script[next];
            n.say("INJECT", &line.note);
            n.say("", &format!("{} ← {}", kmsg.label(), line.message));
            if let Err(e) = kmsg.write(&line.message) {
                n.say("", &format!("cannot write the kernel log: {e}"));
            }
            next += 1;
        }
        drain(n);
        if last_poll.elapsed() >= Duration::from_millis(250) {
            last_poll = Instant::now();
            if let Some(body) = http_get(&api, "/v1/health")
                && let Ok(h) = serde_json::from_str::<Value>(&body)
            {
                n.health(h);
            }
        }
        std::thread::sleep(Duration::from_millis(25));
    }

    // Stop the agent cleanly: SIGTERM, it drains and flushes its state.
    let mut status = None;
    if let Some(c) = child.0.as_mut() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                status = Some(st);
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    if status.is_some() {
        child.0 = None;
    }
    // The reader threads end with the pipes; what they still hold is narrated.
    std::thread::sleep(Duration::from_millis(50));
    drain(n);
    Ok(status)
}

/// The agent binary: `--agent`, else `gpuwatch` in this program's directory.
/// Taken once: a rebuild that replaces this program while the demo runs leaves
/// `/proc/self/exe` pointing at "… (deleted)".
fn gpuwatch_exe(agent: Option<&Path>) -> Result<PathBuf, DemoError> {
    if let Some(a) = agent {
        return Ok(a.to_path_buf());
    }
    let me = std::env::current_exe().map_err(setup_err("cannot find this executable".into()))?;
    let text = me.to_string_lossy();
    let me = match text.strip_suffix(" (deleted)") {
        Some(live) => PathBuf::from(live),
        None => me,
    };
    let exe = me.with_file_name("gpuwatch");
    if exe.is_file() {
        Ok(exe)
    } else {
        Err(DemoError::Input(format!(
            "no gpuwatch binary at {} (build it: cargo build --release -p gpuwatch; or pass --agent)",
            exe.display()
        )))
    }
}

/// Active faults recorded in the engine's state file.
fn state_file_faults(state: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(state.join(gpuwatch_core::engine::STATE_FILE)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let gpus: usize = v["gpus"]
        .as_array()?
        .iter()
        .map(|g| g["faults"].as_array().map_or(0, Vec::len))
        .sum();
    Some(gpus + v["node_faults"].as_array().map_or(0, Vec::len))
}

fn read_scenario(path: &Path, speed: u32) -> Result<(String, Vec<ScriptedLine>), DemoError> {
    let err = |message: String| DemoError::Scenario {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let mut script = script_from_scenario(&text).map_err(err)?;
    for l in &mut script {
        l.at_ms /= u64::from(speed);
    }
    let scaled = scale_scenario(&text, speed).map_err(err)?;
    Ok((scaled, script))
}

fn setup_err(what: String) -> impl FnOnce(std::io::Error) -> DemoError {
    move |source| DemoError::Setup { what, source }
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<(), DemoError> {
    let speed = args.speed.max(1);
    let scaled_ms = |ms: u64| Duration::from_millis(ms / u64::from(speed));
    let (scenario1, script1) = read_scenario(&args.scenario, speed)?;
    let reboot = if args.no_reboot {
        None
    } else {
        Some(read_scenario(&args.reboot_scenario, speed)?)
    };
    let original = std::fs::read_to_string(&args.scenario).unwrap_or_default();
    let duration1 = if args.duration_secs > 0 {
        Duration::from_secs(args.duration_secs)
    } else {
        scaled_ms((last_inject_ms(&original) + 3_000).max(20_000))
    };
    let duration2 = reboot.as_ref().map_or(Duration::ZERO, |(text, _)| {
        Duration::from_millis(last_inject_ms(text)) + scaled_ms(6_000)
    });

    let exe = gpuwatch_exe(args.agent.as_deref())?;
    let writable = std::fs::OpenOptions::new()
        .append(true)
        .open(DEV_KMSG)
        .is_ok()
        && std::fs::OpenOptions::new()
            .write(true)
            .open(PRINTK_DEVKMSG)
            .is_ok();
    let (kind, why) = choose_kernel_log(
        args.kmsg,
        args.fifo,
        Path::new(NVIDIA_DRIVER_PROC).exists(),
        writable,
    )
    .map_err(DemoError::Input)?;
    let state = std::env::temp_dir().join(format!("gpuwatch-demo-{}", std::process::id()));
    std::fs::create_dir_all(&state)
        .map_err(setup_err(format!("cannot create {}", state.display())))?;
    let _cleanup = RemoveDir(state.clone());
    let _printk = if kind == KernelLogKind::Device {
        let old = std::fs::read_to_string(PRINTK_DEVKMSG)
            .map_err(setup_err(format!("cannot read {PRINTK_DEVKMSG}")))?;
        std::fs::write(PRINTK_DEVKMSG, "on\n")
            .map_err(setup_err(format!("cannot set {PRINTK_DEVKMSG}=on")))?;
        PrintkGuard(Some(old.trim().to_string()))
    } else {
        PrintkGuard(None)
    };
    let mut kmsg = match kind {
        KernelLogKind::Device => KernelLog::device()?,
        KernelLogKind::Fifo => KernelLog::fifo(&state)?,
    };
    let first_seq = if kind == KernelLogKind::Device {
        last_kmsg_seq(&kmsg.path).unwrap_or(0)
    } else {
        0
    };
    let config = state.join("demo-agent.toml");
    std::fs::write(&config, agent_config(speed))
        .map_err(setup_err(format!("cannot write {}", config.display())))?;
    let scenario1_path = state.join("scenario-boot-1.toml");
    std::fs::write(&scenario1_path, &scenario1).map_err(setup_err(format!(
        "cannot write {}",
        scenario1_path.display()
    )))?;
    let boot_id_path = state.join("boot_id");
    let boot1 = crate::boot::read_boot_id(Path::new(crate::boot::BOOT_ID_PATH))
        .unwrap_or_else(|_| new_boot_id());
    std::fs::write(&boot_id_path, format!("{boot1}\n")).map_err(setup_err(format!(
        "cannot write {}",
        boot_id_path.display()
    )))?;

    // Ctrl-C / SIGTERM: stop early, still restore printk_devkmsg.
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(setup_err("cannot start the signal runtime".into()))?;
    {
        let stop = stop.clone();
        let _guard = rt.enter();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(setup_err("cannot install signal handlers".into()))?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(setup_err("cannot install signal handlers".into()))?;
        std::thread::spawn(move || {
            rt.block_on(async {
                tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            });
            stop.store(true, Ordering::Relaxed);
        });
    }

    println!(
        "gpuwatch demo: the real agent, simulated GPUs ({}).",
        args.scenario.display()
    );
    for line in wrap(&why, LINE_WIDTH, "") {
        println!("{line}");
    }
    println!("State directory {}.", state.display());
    println!(
        "NVML is polled every {} ms; a condition fault clears after {CLEAR_SAMPLES} clean \
         samples. Ctrl-C stops early.",
        (POLL_MS / u64::from(speed)).max(50)
    );
    if speed > 1 {
        println!("timeline {speed}× faster than the scenario says.");
    }
    println!(
        "\n── boot 1 ({boot1}), {} s ──",
        duration1.as_secs_f64().round()
    );
    let mut n = Narrator::new();
    let status1 = run_phase(
        &mut n,
        &mut kmsg,
        &state,
        &Phase {
            exe: &exe,
            scenario: &scenario1_path,
            script: &script1,
            duration: duration1,
            boot_id_path: &boot_id_path,
            config: &config,
        },
        &stop,
    )?;
    let mut statuses = vec![status1];
    let boot1_node = n.last_node.clone();

    if let Some((scenario2, script2)) = &reboot
        && status1.is_some_and(|s| s.success())
        && !stop.load(Ordering::Relaxed)
    {
        n.say(
            "REBOOT",
            &format!(
                "agent stopped by SIGTERM ({}); {} active fault(s) flushed to {}",
                status1.map_or_else(|| "killed".to_string(), |s| s.to_string()),
                state_file_faults(&state).map_or_else(|| "no".to_string(), |c| c.to_string()),
                state.join(gpuwatch_core::engine::STATE_FILE).display()
            ),
        );
        let boot2 = new_boot_id();
        std::fs::write(&boot_id_path, format!("{boot2}\n")).map_err(setup_err(format!(
            "cannot write {}",
            boot_id_path.display()
        )))?;
        n.say(
            "REBOOT",
            &format!(
                "simulated reboot: new boot id {boot2} in {} (--boot-id-path); NVML now follows {}",
                boot_id_path.display(),
                args.reboot_scenario.display()
            ),
        );
        println!(
            "\n── boot 2 ({boot2}), {} s ──",
            duration2.as_secs_f64().round()
        );
        let scenario2_path = state.join("scenario-boot-2.toml");
        std::fs::write(&scenario2_path, scenario2).map_err(setup_err(format!(
            "cannot write {}",
            scenario2_path.display()
        )))?;
        let status2 = run_phase(
            &mut n,
            &mut kmsg,
            &state,
            &Phase {
                exe: &exe,
                scenario: &scenario2_path,
                script: script2,
                duration: duration2,
                boot_id_path: &boot_id_path,
                config: &config,
            },
            &stop,
        )?;
        statuses.push(status2);
        n.explain_remaining();
    }

    if kind == KernelLogKind::Device {
        let written: Vec<String> = script1
            .iter()
            .chain(reboot.iter().flat_map(|(_, s)| s.iter()))
            .map(|l| l.message.clone())
            .collect();
        let view = dmesg_x_view(&kmsg.path, first_seq, &written);
        if !view.is_empty() {
            println!(
                "\nThe demo's lines stay in this machine's kernel log until the ring wraps. \
                 `dmesg -x` shows them as\nuser-facility records, which `gpuwatch run` ignores \
                 by default and `dmesg -r | gpuwatch scan` skips:"
            );
            for line in view {
                for part in wrap(&line, LINE_WIDTH, "    ") {
                    println!("{part}");
                }
            }
            println!(
                "Plain `dmesg` output carries no facility: a tool reading it cannot tell these \
                 from the driver's.\nUse `gpuwatch-demo --fifo` to keep them out of the \
                 kernel log."
            );
        }
    }

    println!("\nSummary after {:.0} s:", n.t0.elapsed().as_secs_f64());
    println!(
        "  fault events: {}; by final action: {}",
        n.events,
        n.actions_summary()
    );
    if reboot.is_some() && statuses.len() > 1 {
        println!("  node state before the reboot: {boot1_node}");
    }
    println!(
        "  final node state: {}",
        if n.last_health.is_some() {
            n.last_node.as_str()
        } else {
            "API never answered"
        }
    );
    for (i, s) in statuses.iter().enumerate() {
        println!(
            "  agent exit (boot {}): {}",
            i + 1,
            s.map_or("killed (did not stop within 15 s)".to_string(), |s| s
                .to_string())
        );
    }
    if kind == KernelLogKind::Device {
        println!("  printk_devkmsg restored; nothing was written to any cluster.");
    } else {
        println!("  the kernel log was not touched; nothing was written to any cluster.");
    }
    for s in statuses {
        match s {
            Some(s) if s.success() => {}
            Some(s) => return Err(DemoError::Agent(format!("exited with {s}"))),
            None => return Err(DemoError::Agent("did not stop on SIGTERM".into())),
        }
    }
    Ok(())
}

/// Removes the demo's state directory on drop.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = r#"
description = "t"
[[gpu]]
index = 0
uuid = "GPU-a"
pci = "00000000:1B:00.0"
[[gpu]]
index = 1
uuid = "GPU-b"
pci = "0000:2c:00.0"
[[inject]]
at_ms = 5000
gpu = 1
xid = 79
lost = true
note = "GPU 1 falls off the bus"
[[inject]]
at_ms = 10000
gpu = 0
remapped_rows_failure = true
"#;

    #[test]
    fn script_mirrors_scenario_injections_as_kernel_lines() {
        let s = script_from_scenario(SCENARIO).unwrap();
        let msgs: Vec<(u64, &str)> = s.iter().map(|l| (l.at_ms, l.message.as_str())).collect();
        assert_eq!(msgs.len(), 3, "{msgs:#?}");
        assert_eq!(msgs[0].0, 5000);
        assert!(
            msgs[0]
                .1
                .starts_with("NVRM: Xid (PCI:0000:2c:00): 79, pid="),
            "{}",
            msgs[0].1
        );
        assert_eq!(s[0].note, "GPU 1 falls off the bus");
        // Application fault on the other GPU 3 s after the first injection.
        assert_eq!(msgs[1].0, 8000);
        assert!(msgs[1].1.contains("(PCI:0000:1b:00): 13,"), "{}", msgs[1].1);
        assert_eq!(msgs[2].0, 10000);
        assert!(msgs[2].1.contains("(PCI:0000:1b:00): 64,"), "{}", msgs[2].1);
        assert_eq!(last_inject_ms(SCENARIO), 10000);
    }

    #[test]
    fn speed_scales_scenario_and_script_times() {
        let scaled = scale_scenario(SCENARIO, 4).unwrap();
        assert_eq!(last_inject_ms(&scaled), 2500);
        let v: toml::Value = toml::from_str(&scaled).unwrap();
        assert_eq!(v["inject"][0]["at_ms"].as_integer(), Some(1250));
        assert_eq!(
            v["inject"][0]["note"].as_str(),
            Some("GPU 1 falls off the bus")
        );
        assert_eq!(v["gpu"][1]["pci"].as_str(), Some("0000:2c:00.0"));
        assert_eq!(scale_scenario(SCENARIO, 1).unwrap(), SCENARIO);
        assert!(scale_scenario("[[inject]\n", 2).is_err());
    }

    #[test]
    fn shipped_scenarios_build_scripts() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/scenarios");
        let first = std::fs::read_to_string(dir.join("demo.toml")).unwrap();
        let script = script_from_scenario(&first).unwrap();
        let xids: Vec<&str> = script
            .iter()
            .filter_map(|l| l.message.split("): ").nth(1)?.split(',').next())
            .collect();
        assert_eq!(xids, ["79", "13", "64"]);
        let after = std::fs::read_to_string(dir.join("demo-after-reboot.toml")).unwrap();
        assert!(script_from_scenario(&after).unwrap().is_empty());
        assert!(after.contains("remapped_rows_failure = true"));
    }

    #[test]
    fn agent_config_is_a_valid_gpuwatch_config() {
        for speed in [1, 4, 20] {
            let text = agent_config(speed);
            let mut cfg = crate::config::Config::parse(Path::new("demo-agent.toml"), &text)
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            cfg.node_name = "demo-node".into();
            cfg.validate().unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(
                cfg.nvml.poll_interval(),
                Duration::from_millis((POLL_MS / u64::from(speed)).max(50))
            );
            assert_eq!(cfg.engine.condition_clear_samples, CLEAR_SAMPLES);
        }
    }

    fn view(verdict: &str, faults: &[&str], answering: bool) -> GpuView {
        GpuView {
            pci: "0000:ba:00.0".into(),
            index: Some(6),
            verdict: verdict.into(),
            action: if faults.is_empty() {
                "unspecified".into()
            } else {
                "investigate".into()
            },
            faults: faults.iter().map(|f| f.to_string()).collect(),
            answering,
        }
    }

    #[test]
    fn gpu_changes_are_narrated_from_health() {
        let healthy = view("healthy", &[], true);
        let hot = view("degraded", &["ThermalSlowdown"], true);
        assert_eq!(gpu_change(None, &healthy), None);
        assert_eq!(gpu_change(Some(&healthy), &healthy), None);
        assert_eq!(
            gpu_change(Some(&healthy), &hot).unwrap(),
            "GPU 6 healthy → degraded (investigate): ThermalSlowdown"
        );
        assert_eq!(
            gpu_change(Some(&hot), &healthy).unwrap(),
            "GPU 6 recovered: degraded → healthy, no active fault"
        );
        let lost = view("unhealthy", &["XID79"], false);
        let back = view("unhealthy", &["XID79"], true);
        assert!(
            gpu_change(Some(&lost), &back)
                .unwrap()
                .contains("answers NVML again; still unhealthy")
        );
        assert!(
            gpu_change(None, &lost)
                .unwrap()
                .ends_with("not answering NVML")
        );
        // Only the index became known: nothing to say.
        let mut unconfirmed = hot.clone();
        unconfirmed.index = None;
        assert_eq!(gpu_change(Some(&unconfirmed), &hot), None);
    }

    #[test]
    fn health_json_becomes_views_and_reasons() {
        let h: Value = serde_json::json!({
            "verdict": "unhealthy",
            "monitor": {"nvml_ok": true},
            "gpus": [
                {"index": 5, "pci_address": "0000:ab:00.0", "verdict": "unhealthy",
                 "action": "inspect_hardware",
                 "active_faults": [{"reason": "RowRemapFailure", "action": "inspect_hardware"}],
                 "sample": {"remapped_rows_failure": true, "remapped_rows_pending": false,
                            "recovery_action": "none", "pcie_link_width": 8,
                            "pcie_link_width_max": 16}},
                {"pci_address": "0000:3a:00.0", "verdict": "unknown", "action": "reboot_node",
                 "active_faults": [{"reason": "XID79"}], "sample": null}
            ]
        });
        let v = gpu_views(&h);
        assert_eq!(v[0].label(), "GPU 5");
        assert_eq!(v[0].faults, ["RowRemapFailure"]);
        assert!(v[0].answering);
        assert_eq!(v[1].label(), "the GPU at 0000:3a:00.0");
        assert!(!v[1].answering);
        assert_eq!(
            sample_problems(&h["gpus"][0]["sample"]),
            ["remapped_rows_failure=true", "PCIe link x8/x16"]
        );
        assert_eq!(sample_problems(&Value::Null), ["it does not answer NVML"]);
        assert!(clear_rule("inspect_hardware").contains("reboot"));
    }

    #[test]
    fn reclassification_events_name_both_actions() {
        let ev = serde_json::json!({
            "kind": "xid", "code": 64, "gpu_index": 5, "pci_address": "0000:ab:00.0",
            "source": "nvml_poll", "action": "inspect_hardware", "name": "x",
            "policy_reason": "Re-evaluated", "attributes": {"reclassified_from": "reset_gpu"}
        });
        assert_eq!(
            describe_event(&ev),
            "XID 64 on GPU 5 (0000:ab:00.0), from NVML polling: reset_gpu → inspect_hardware \
             (Re-evaluated)"
        );
        assert_eq!(short_gpu("GPU 6 (GPU-1, 0000:ba:00.0)"), "GPU 6");
    }

    #[test]
    fn summary_counts_the_final_action_of_a_reclassified_fault() {
        let mut n = Narrator::new();
        n.event(
            &serde_json::json!({"kind": "xid", "code": 64, "gpu_index": 5,
            "pci_address": "0000:ab:00.0", "source": "kmsg", "action": "reset_gpu"}),
        );
        n.event(
            &serde_json::json!({"kind": "xid", "code": 13, "gpu_index": 1,
            "pci_address": "0000:2a:00.0", "source": "kmsg", "action": "restart_app"}),
        );
        n.event(
            &serde_json::json!({"kind": "xid", "code": 64, "gpu_index": 5,
            "pci_address": "0000:ab:00.0", "source": "nvml_poll", "action": "inspect_hardware",
            "attributes": {"reclassified_from": "reset_gpu"}}),
        );
        assert_eq!(n.events, 2, "a reclassification is the same fault");
        assert_eq!(n.actions_summary(), "1 inspect_hardware, 1 restart_app");
    }

    #[test]
    fn kernel_log_choice_never_writes_into_a_gpu_nodes_log() {
        use KernelLogKind::{Device, Fifo};
        let kind = |k, f, d, w| choose_kernel_log(k, f, d, w).map(|(kind, _)| kind);
        // (--kmsg, --fifo, driver loaded, /dev/kmsg writable)
        assert_eq!(kind(false, false, false, true), Ok(Device));
        assert_eq!(kind(false, false, true, true), Ok(Fifo));
        assert_eq!(kind(false, false, false, false), Ok(Fifo));
        assert_eq!(kind(false, true, false, true), Ok(Fifo));
        assert_eq!(kind(true, false, false, true), Ok(Device));
        let refused = choose_kernel_log(true, false, true, true).unwrap_err();
        assert!(refused.contains("NVIDIA driver is loaded"), "{refused}");
        assert!(choose_kernel_log(true, false, false, false).is_err());
        let (_, why) = choose_kernel_log(false, false, true, true).unwrap();
        assert!(why.contains("FIFO") && why.contains("--kmsg-path"), "{why}");
    }

    #[test]
    fn wrap_keeps_lines_within_the_width() {
        let text = "NVRM: Xid (PCI:0000:18:00): 48, pid=31338, name=train.py, An uncorrectable \
                    double bit error (DBE) has been detected on GPU in the framebuffer at \
                    partition 0, subpartition 0.";
        let lines = wrap(text, 60, "    ");
        assert!(lines.len() > 2, "{lines:#?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 60), "{lines:#?}");
        assert!(lines[1..].iter().all(|l| l.starts_with("    ")));
        let words: Vec<&str> = lines.iter().flat_map(|l| l.split_whitespace()).collect();
        assert_eq!(words.join(" "), text, "nothing lost or reordered");
        assert_eq!(wrap("short", 60, "  "), ["short"]);
        assert!(wrap(&"x".repeat(130), 50, "").iter().all(|l| l.len() <= 50));
    }

    #[test]
    fn node_line_is_plain_words() {
        let healthy = serde_json::json!({"verdict": "healthy", "action": "unspecified",
            "reason": "Healthy", "gpus": []});
        assert_eq!(node_line(&healthy, Some(8)), "healthy, 8 GPUs");
        let bad = serde_json::json!({"verdict": "unhealthy", "action": "inspect_hardware",
            "reason": "RowRemapFailure"});
        assert_eq!(
            node_line(&bad, Some(8)),
            "unhealthy: inspect_hardware (RowRemapFailure), 8 GPUs"
        );
        assert_eq!(
            node_line(&serde_json::json!({}), None),
            "not known yet, GPUs not enumerated yet"
        );
    }

    #[test]
    fn unconfirmed_gpu_is_named_by_its_last_index_or_address() {
        let mut n = Narrator::new();
        assert_eq!(n.gpu_label("GPU 6 (GPU-1, 0000:ba:00.0)"), "GPU 6");
        assert_eq!(
            n.gpu_label("GPU ? (0000:3a:00.0)"),
            "the GPU at 0000:3a:00.0"
        );
        n.gpus.insert(
            "0000:3a:00.0".into(),
            GpuView {
                pci: "0000:3a:00.0".into(),
                index: Some(2),
                verdict: "healthy".into(),
                action: String::new(),
                faults: Vec::new(),
                answering: true,
            },
        );
        assert_eq!(n.gpu_label("GPU ? (00000000:3A:00.0)"), "GPU 2");
        assert_eq!(display_pci("00000000:3A:00.0"), "0000:3a:00.0");
        assert_eq!(source_words("kmsg"), "the kernel log");
    }

    #[test]
    fn scenario_without_gpus_is_an_error() {
        assert!(script_from_scenario("description = \"x\"\n").is_err());
        assert!(script_from_scenario("not toml [").is_err());
    }
}
