//! NVIDIA's decode table for NVLink5 XIDs 144–150.
//!
//! An NVLink5 XID line prints `(<intrInfo> <errorStatus> …)` after the link number;
//! the table says, per XID, which intrInfo bits and errorStatus values mean what
//! (IGNORE, RESET_GPU, or "read the XID 154 that follows"). The first matching row
//! decides; the sub-code moved from intrInfo bits 9:5 to bits 6:0 in driver R575, so
//! each row has a pattern per driver generation.
//!
//! The table is generated from `data/nvlink5-decode.csv` by
//! `build-tools/gen_nvlink5.rs` and checked in as `data/nvlink5.generated.rs`.

use serde::Serialize;

/// A row's bucket, as NVIDIA names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// `IGNORE`: the unit recovered; nothing to do.
    Ignore,
    /// `RESET_GPU`: the GPU needs a reset.
    ResetGpu,
    /// `XID_154_EVAL`: the XID 154 that follows states the recovery action.
    #[serde(rename = "XID_154_EVAL")]
    Xid154Eval,
}

impl Resolution {
    /// NVIDIA's name of the bucket.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Ignore => "IGNORE",
            Resolution::ResetGpu => "RESET_GPU",
            Resolution::Xid154Eval => "XID_154_EVAL",
        }
    }
}

/// An intrInfo pattern: `intr_info & mask == value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bits {
    /// Bits the pattern fixes.
    pub mask: u32,
    /// Their values.
    pub value: u32,
    /// The pattern as NVIDIA prints it (most significant bit first, `-` = any).
    pub pattern: &'static str,
}

impl Bits {
    fn matches(&self, intr_info: u32) -> bool {
        intr_info & self.mask == self.value
    }
}

/// One row of the decode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Nvlink5Row {
    /// 144–150.
    pub xid: u32,
    /// Sub-component and unit as the line prints it (`/` separates alternatives).
    pub mnemonic: &'static str,
    /// intrInfo pattern for drivers before R575.
    pub before_r575: Bits,
    /// intrInfo pattern for R575 and later.
    pub from_r575: Bits,
    /// errorStatus values the row applies to; empty: any.
    pub error_status: &'static [u32],
    /// NVIDIA's bucket.
    pub resolution: Resolution,
    /// NVIDIA's severity word (`Non-fatal`, `Fatal`, `Link Fatal`; a trailing `*`,
    /// `**` or `?` is NVIDIA's footnote mark).
    pub severity: &'static str,
}

/// Driver generation whose intrInfo layout applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Sub-code in bits 9:5 (drivers before R575).
    BeforeR575,
    /// Sub-code in bits 6:0 (R575 and later).
    FromR575,
}

static TABLE: &[Nvlink5Row] = &include!("../data/nvlink5.generated.rs");

/// The decode rows of `xid` (empty outside 144–150), in table order.
pub fn nvlink5_rows(xid: u32) -> impl Iterator<Item = &'static Nvlink5Row> {
    TABLE.iter().filter(move |r| r.xid == xid)
}

/// The first row of `xid` matching `intr_info`/`error_status` under `layout`.
pub fn decode(
    xid: u32,
    intr_info: u32,
    error_status: Option<u32>,
    layout: Layout,
) -> Option<&'static Nvlink5Row> {
    nvlink5_rows(xid).find(|r| {
        let bits = match layout {
            Layout::BeforeR575 => &r.before_r575,
            Layout::FromR575 => &r.from_r575,
        };
        bits.matches(intr_info)
            && (r.error_status.is_empty()
                || error_status.is_some_and(|s| r.error_status.contains(&s)))
    })
}

/// The layout of a driver version as printed (`580.159.04` → R575+); `None` when
/// the version is not a number.
pub fn layout_of_driver(version: &str) -> Option<Layout> {
    let major: u32 = version.split('.').next()?.trim().parse().ok()?;
    Some(if major >= 575 {
        Layout::FromR575
    } else {
        Layout::BeforeR575
    })
}

#[cfg(test)]
#[path = "../build-tools/gen_nvlink5.rs"]
// The generator's own items, `pub` for the tool that includes it too.
#[allow(unreachable_pub)]
mod gen_nvlink5;

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in table is exactly what the generator makes of the CSV copy.
    #[test]
    fn generated_table_matches_csv_copy() {
        crate::generated_check::check_generated(
            "nvlink5-decode.csv",
            "nvlink5.generated.rs",
            "NVLINK5_REGENERATE",
            "NVLINK5_REGENERATE=1 cargo test -p xid-parser --lib nvlink5::",
            gen_nvlink5::generate,
        );
    }

    #[test]
    fn table_has_all_95_rows_for_144_to_150() {
        assert_eq!(TABLE.len(), 95);
        for xid in 144..=150 {
            assert!(nvlink5_rows(xid).next().is_some(), "{xid}");
        }
        assert!(nvlink5_rows(143).next().is_none());
    }

    #[test]
    fn patterns_become_masks() {
        assert_eq!(gen_nvlink5::pattern_bits("-01"), Ok((0b11, 0b01)));
        assert_eq!(
            gen_nvlink5::pattern_bits("------000000----------0000100001"),
            Ok((0x03f0_03ff, 0x0000_0021))
        );
        assert!(gen_nvlink5::pattern_bits("x").is_err());
        assert!(gen_nvlink5::pattern_bits(&"-".repeat(33)).is_err());
        assert!(gen_nvlink5::generate("a,b\n").is_err());
        let header = gen_nvlink5::EXPECTED_HEADER;
        assert!(gen_nvlink5::generate(&format!("{header}\n144,X,-,-,0x1,MAYBE,Fatal\n")).is_err());
        assert!(gen_nvlink5::generate(&format!("{header}\n151,X,-,-,,IGNORE,Fatal\n")).is_err());
    }

    /// The lines quoted in gpud's NVLink5 pull request (leptonai/gpud#1160).
    #[test]
    fn decodes_public_examples() {
        // 149 NETIR_LINK_EVT "Fatal", intrInfo 0x026001c6: pre-R575 layout, sub-code
        // 0x26 in bits 25:20 → NVIDIA says IGNORE although the line says Fatal.
        let r = decode(149, 0x0260_01c6, Some(0), Layout::BeforeR575).unwrap();
        assert_eq!(
            (r.resolution, r.severity),
            (Resolution::Ignore, "Link Fatal")
        );
        assert!(decode(149, 0x0260_01c6, Some(0), Layout::FromR575).is_none());
        // 144 SAW_MVB Nonfatal, intrInfo 0x1, errorStatus 0x8: R575 layout → IGNORE.
        let r = decode(144, 0x1, Some(0x8), Layout::FromR575).unwrap();
        assert_eq!(r.resolution, Resolution::Ignore);
        // errorStatus 0x2 of the same unit is a reset.
        let r = decode(144, 0x1, Some(0x2), Layout::FromR575).unwrap();
        assert_eq!(r.resolution, Resolution::ResetGpu);
        // An errorStatus no row lists: no row.
        assert!(decode(144, 0x1, Some(0x4000), Layout::FromR575).is_none());
        assert!(decode(144, 0x1, None, Layout::FromR575).is_none());
        // 150 lists two statuses in one row.
        assert!(decode(150, 0, Some(0xffff_ffff), Layout::FromR575).is_some());
        assert_eq!(layout_of_driver("580.159.04"), Some(Layout::FromR575));
        assert_eq!(layout_of_driver("570.158.01"), Some(Layout::BeforeR575));
        assert_eq!(layout_of_driver("x"), None);
    }
}
