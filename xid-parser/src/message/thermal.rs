//! Thermal slowdown and threshold lines.

use super::Message;

/// Thermal message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThermalMsg<'a> {
    /// A PCI address named in the line (GPU thermal), `None` for CPU thermal.
    pub pci: Option<&'a str>,
    /// Temperature in °C when printed.
    pub temperature_c: Option<u32>,
}

pub(super) fn parse_thermal<'a>(msg: &'a str, pci: Option<&'a str>) -> Option<Message<'a>> {
    let temp =
        contains!(msg, "temperature") || contains!(msg, "thermal") || contains!(msg, "Thermal");
    if !temp {
        return None;
    }
    let alarm = contains!(msg, "above threshold")
        || contains!(msg, "slowdown")
        || contains!(msg, "Slowdown")
        || contains!(msg, "shutdown")
        || contains!(msg, "throttl")
        || contains!(msg, "exceed")
        || contains!(msg, "critical");
    if !alarm || contains!(msg, "normal") {
        return None;
    }
    // `... temperature 92C` / `92 C`.
    let temperature_c = msg.split_whitespace().find_map(|w| {
        let w = w.trim_end_matches([',', '.', ')']);
        let n = w.strip_suffix('C').or_else(|| w.strip_suffix("°C"))?;
        n.parse::<u32>().ok().filter(|t| *t < 200)
    });
    Some(Message::Thermal(ThermalMsg { pci, temperature_c }))
}
