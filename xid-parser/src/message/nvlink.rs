//! NVLink errors outside the XID path: NVRM lines and the NVLink core and NVSwitch
//! drivers' lines.

use super::Message;
use super::text::link_in;

/// An NVLink error outside the XID path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlinkMsg<'a> {
    /// A PCI address named in the line.
    pub pci: Option<&'a str>,
    /// `link 3`.
    pub link: Option<u32>,
    /// Fatal / non-fatal when stated.
    pub fatal: Option<bool>,
}

/// The text after an `nvidia-nvlink:` or `nvidia-nvswitchN:` driver prefix, when the
/// message is printed by one of those drivers (the prefix starts the message or follows
/// a blank, as in `kernel: nvidia-nvlink: ...`).
pub(super) fn nvlink_driver_body(msg: &str) -> Option<&str> {
    let i = find!(msg, "nvidia-nv")?;
    if i > 0 && msg.as_bytes()[i - 1] != b' ' {
        return None;
    }
    let rest = &msg[i + 9..];
    let rest = if let Some(r) = rest.strip_prefix("link:") {
        r
    } else {
        let r = rest.strip_prefix("switch")?;
        r.trim_start_matches(|c: char| c.is_ascii_digit())
            .strip_prefix(':')?
    };
    Some(rest.trim_start())
}

/// An NVLink error in the text of an NVIDIA driver line (`NVRM:` or an NVLink/NVSwitch
/// driver prefix, already checked by the caller). Only real error phrasing counts:
/// `fatal`, `error`, `fail`, `link down`/`is down` — not progress notes such as
/// `link training in progress` — and never a driver assertion (`nvAssertFailedNoLog:
/// Assertion failed: ... @ kernel_nvlink.c:...`), which reports a driver check, not a link.
pub(super) fn parse_nvlink(msg: &str) -> Option<Message<'_>> {
    let assertion = contains!(msg, "Assertion failed")
        || contains!(msg, "nvAssert")
        || contains!(msg, "Check failed")
        || contains!(msg, "nvCheck");
    if assertion || contains!(msg, "is being initialized") {
        return None;
    }
    let err = contains!(msg, "rror")
        || contains!(msg, "ERROR")
        || contains!(msg, "fatal")
        || contains!(msg, "Fatal")
        || contains!(msg, "FATAL")
        || contains!(msg, "fail")
        || contains!(msg, "Fail")
        || contains!(msg, "link down")
        || contains!(msg, "Link down")
        || contains!(msg, "is down");
    if !err {
        return None;
    }
    let fatal = if contains!(msg, "non-fatal")
        || contains!(msg, "Non-fatal")
        || contains!(msg, "Nonfatal")
        || contains!(msg, "nonfatal")
    {
        Some(false)
    } else if contains!(msg, "fatal") || contains!(msg, "Fatal") || contains!(msg, "FATAL") {
        Some(true)
    } else {
        None
    };
    Some(Message::Nvlink(NvlinkMsg {
        pci: crate::pci::find_pci(msg),
        link: link_in(msg),
        fatal,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::parse_message;

    /// NVLink faults come only from NVIDIA driver lines with real
    /// error phrasing.
    #[test]
    fn nvlink_lines_are_anchored_to_driver_prefixes() {
        fn nvlink(l: &str) -> Option<NvlinkMsg<'_>> {
            match parse_message(l) {
                Some(Message::Nvlink(n)) => Some(n),
                _ => None,
            }
        }
        assert_eq!(
            nvlink("nvidia-nvswitch3: NVLink link 12 training failed").map(|n| (n.link, n.fatal)),
            Some((Some(12), None))
        );
        assert_eq!(
            nvlink("kernel: nvidia-nvlink: IBMNPU: Link 2 training failed").map(|n| n.link),
            Some(Some(2))
        );
        assert_eq!(
            nvlink("NVRM: NVLink: fatal error detected on link 3").map(|n| n.fatal),
            Some(Some(true))
        );
        assert_eq!(
            nvlink("NVRM: NVLink: non-fatal error on link 5").map(|n| n.fatal),
            Some(Some(false))
        );
        for l in [
            "nvidia-fs: failed to register nvlink peer",
            "xnvidia-nvlink: link 2 failed",
            "nvidia-nvswitch: switch is fine",
            "nvidia-nvswitch0: nothing to do with links, failed",
            "nvidia-nvlink: link training in progress",
            "NVRM: nvAssertFailedNoLog: Assertion failed: 0 @ kernel_nvlink.c:12",
            "NVRM: nvCheckOkFailedNoLog: Check failed: x returned from knvlinkFoo(pGpu) @ a.c:1",
            "app: Fatal: nvlink test aborted",
        ] {
            assert!(nvlink(l).is_none(), "{l}");
        }
        assert_eq!(nvlink_driver_body("nvidia-nvswitch12:  x"), Some("x"));
        assert_eq!(nvlink_driver_body("nvidia-nvlink:y"), Some("y"));
        assert_eq!(nvlink_driver_body("nvidia-nvswitchX: y"), None);
        assert_eq!(nvlink_driver_body("nvidia-nv"), None);
    }
}
