//! The short-window memory behind the XID context rules: recent XIDs per GPU.

use crate::pci::same_text;
use gpuwatch_proto::FaultEventRef;

/// How far back context rules look by default (10 s of record time).
pub(super) const DEFAULT_CONTEXT_WINDOW_USEC: u64 = 10_000_000;
/// GPUs tracked at most (least recently seen is forgotten first).
const MAX_GPUS: usize = 64;
/// XIDs remembered per GPU.
const PER_GPU: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    mono_usec: Option<u64>,
    wall_usec: Option<u64>,
}

impl Stamp {
    pub(super) fn of(ev: &FaultEventRef<'_>) -> Stamp {
        Stamp {
            mono_usec: ev.monotonic_usec,
            wall_usec: ev.time_unix_nano.map(|n| n / 1000),
        }
    }

    /// Distance in µs when both stamps share a time base; monotonic first.
    fn distance(self, other: Stamp) -> Option<u64> {
        match (self.mono_usec, other.mono_usec) {
            (Some(a), Some(b)) => Some(a.abs_diff(b)),
            _ => match (self.wall_usec, other.wall_usec) {
                (Some(a), Some(b)) => Some(a.abs_diff(b)),
                _ => None,
            },
        }
    }
}

/// One XID of a GPU's recent history, with its record time.
#[derive(Debug, Clone, Copy)]
struct RecentXid {
    code: u32,
    at: Stamp,
}

#[derive(Debug)]
struct GpuHistory {
    pci: String,
    last_use: u64,
    /// Oldest first; at most `PER_GPU`.
    recent: std::collections::VecDeque<RecentXid>,
}

/// Recent XIDs per GPU (keyed by PCI address), for the short-window context
/// rules (XID 45 after another XID, XID 48 with 63/64, 171/172 after 48).
///
/// Memory is bounded: at most 64 GPUs and 8 XIDs per GPU. Two events are
/// "within the window" only when their record times share a time base
/// (monotonic µs, else wall clock) and differ by at most the window; without
/// comparable times the solo rule applies (the more cautious one). Events with
/// an empty PCI address are never correlated.
#[derive(Debug)]
pub struct ContextWindow {
    window_usec: u64,
    gpus: Vec<GpuHistory>,
    uses: u64,
}

impl Default for ContextWindow {
    fn default() -> Self {
        ContextWindow::new()
    }
}

impl ContextWindow {
    /// An empty window of 10 s (`DEFAULT_CONTEXT_WINDOW_USEC`).
    pub fn new() -> Self {
        ContextWindow::with_window_usec(DEFAULT_CONTEXT_WINDOW_USEC)
    }

    /// An empty window of `window_usec` microseconds of record time.
    pub fn with_window_usec(window_usec: u64) -> Self {
        ContextWindow {
            window_usec,
            gpus: Vec::new(),
            uses: 0,
        }
    }

    /// The window length in microseconds.
    pub fn window_usec(&self) -> u64 {
        self.window_usec
    }

    /// Number of GPUs with remembered XIDs.
    pub fn tracked_gpus(&self) -> usize {
        self.gpus.len()
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.gpus.clear();
    }

    /// Most recent earlier XID on `pci` within the window whose code satisfies `pred`:
    /// `(code, distance in µs)`.
    pub(super) fn find(
        &self,
        pci: &str,
        at: Stamp,
        pred: impl Fn(u32) -> bool,
    ) -> Option<(u32, u64)> {
        if pci.is_empty() {
            return None;
        }
        let gpu = self.gpus.iter().find(|g| same_text(&g.pci, pci))?;
        gpu.recent.iter().rev().find_map(|seen| {
            let d = seen.at.distance(at)?;
            (d <= self.window_usec && pred(seen.code)).then_some((seen.code, d))
        })
    }

    /// Remembers that `pci` reported `code` at `at` (its oldest XID, or the least
    /// recently seen GPU, makes room).
    pub(super) fn record(&mut self, pci: &str, code: u32, at: Stamp) {
        if pci.is_empty() {
            return;
        }
        self.uses += 1;
        let uses = self.uses;
        let idx = match self.gpus.iter().position(|g| same_text(&g.pci, pci)) {
            Some(i) => i,
            None => {
                let oldest = self
                    .gpus
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, g)| g.last_use)
                    .map(|(i, _)| i);
                if let Some(oldest) = oldest.filter(|_| self.gpus.len() >= MAX_GPUS) {
                    self.gpus.swap_remove(oldest);
                }
                self.gpus.push(GpuHistory {
                    pci: pci.to_string(),
                    last_use: 0,
                    recent: std::collections::VecDeque::with_capacity(PER_GPU),
                });
                self.gpus.len() - 1
            }
        };
        let gpu = &mut self.gpus[idx];
        gpu.last_use = uses;
        if gpu.recent.len() >= PER_GPU {
            gpu.recent.pop_front();
        }
        gpu.recent.push_back(RecentXid { code, at });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use crate::policy::test_events::{GPU, classify, xid};
    use gpuwatch_proto::Action;

    #[test]
    fn context_window_memory_is_bounded() {
        let p = Policy::default();
        let mut ctx = ContextWindow::new();
        for gpu in 0..200u32 {
            for i in 0..20u64 {
                let pci = format!("0000:{:02x}:00.0", gpu % 256);
                classify(&p, &mut ctx, xid(13, &pci, Some(i)));
            }
        }
        assert!(ctx.tracked_gpus() <= MAX_GPUS);
        assert!(ctx.gpus.iter().all(|g| g.recent.len() <= PER_GPU));
        // Events without a PCI address are never remembered.
        let mut empty = ContextWindow::new();
        classify(&p, &mut empty, xid(13, "", Some(1)));
        assert_eq!(empty.tracked_gpus(), 0);
        assert_eq!(
            classify(&p, &mut empty, xid(45, "", Some(2))).action(),
            Action::RestartApp
        );
    }

    #[test]
    fn wall_clock_times_correlate_when_monotonic_is_missing() {
        let p = Policy::default();
        let mut ctx = ContextWindow::with_window_usec(1_000_000);
        let mut a = xid(13, GPU, None);
        a.time_unix_nano = Some(1_700_000_000_000_000_000);
        let mut b = xid(45, GPU, None);
        b.time_unix_nano = Some(1_700_000_000_500_000_000);
        classify(&p, &mut ctx, a);
        assert_eq!(classify(&p, &mut ctx, b).action(), Action::Ignore);
        let mut c = xid(45, GPU, None);
        c.time_unix_nano = Some(1_700_000_005_000_000_000);
        assert_eq!(classify(&p, &mut ctx, c).action(), Action::RestartApp);
    }
}
