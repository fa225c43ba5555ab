//! Error counters as deltas: the first reading is the baseline, a lower value
//! is a reset, a value at the counter's maximum is saturated.

use crate::network::{CounterValue, counter_width_bits};

/// One counter of one port, across scans.
#[derive(Debug, Default, Clone)]
pub(super) struct CounterTrack {
    /// The value last read; `None` before the first readable value.
    last: Option<u64>,
    /// Every delta counted since the agent started.
    pub(super) total: u64,
    /// The last value read is the counter's maximum: further errors do not
    /// show.
    pub(super) saturated: bool,
    /// The last reading was [`CounterValue::Unreadable`].
    pub(super) unreadable: bool,
}

impl CounterTrack {
    /// True once a value has been read: the counter has a number to report.
    pub(super) fn known(&self) -> bool {
        self.last.is_some()
    }

    /// Takes one reading and returns the errors it adds (0 for the baseline,
    /// an unreadable file, or a saturated counter that stays at its maximum).
    pub(super) fn update(&mut self, name: &str, value: CounterValue) -> u64 {
        let v = match value {
            CounterValue::Unreadable => {
                self.unreadable = true;
                return 0;
            }
            CounterValue::Value(v) => v,
        };
        self.unreadable = false;
        let delta = match self.last {
            None => 0,
            // Someone cleared the counters (`perfquery -R`, a driver reload,
            // a replaced NIC): what it reads now counted from 0.
            Some(last) if v < last => v,
            Some(last) => v - last,
        };
        self.last = Some(v);
        self.saturated = is_saturated(name, v);
        self.total = self.total.saturating_add(delta);
        delta
    }
}

/// True when `v` is the counter's maximum: `2^bits - 1` for the IB
/// PortCounters (which stop there instead of wrapping), any all-ones value of
/// 8, 16, 32 or 64 bits for a counter of unknown width.
pub(super) fn is_saturated(name: &str, v: u64) -> bool {
    match counter_width_bits(name) {
        Some(bits) if bits < 64 => v == (1u64 << bits) - 1,
        Some(_) => v == u64::MAX,
        None => [u8::MAX as u64, u16::MAX as u64, u32::MAX as u64, u64::MAX].contains(&v),
    }
}

/// A plain monotonic count (`carrier_changes`): the delta since the last
/// reading, a lower value being a reset.
#[derive(Debug, Default, Clone)]
pub(super) struct MonotonicCount {
    last: Option<u64>,
}

impl MonotonicCount {
    /// Takes one reading and returns the increase (0 for the baseline).
    pub(super) fn update(&mut self, v: u64) -> u64 {
        let delta = match self.last {
            None => 0,
            Some(last) if v < last => v,
            Some(last) => v - last,
        };
        self.last = Some(v);
        delta
    }
}
