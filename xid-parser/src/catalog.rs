//! NVIDIA's XID catalog as a static table: the facts gpuwatch's policy is derived
//! from (names, NVIDIA's resolution buckets, what other agents do).
//!
//! The table is generated from `data/xid-catalog.csv` (NVIDIA's catalog plus what
//! other agents do; provenance in `data/README.md`) by `build-tools/gen_catalog.rs`
//! and checked in as `data/catalog.generated.rs`, so the crate needs nothing
//! outside itself to build. The unit tests below fail when the table and the CSV
//! drift apart.

/// One catalog row (columns of `data/xid-catalog.csv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CatalogRow {
    /// The XID.
    pub code: u32,
    /// NVIDIA mnemonic (`ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`).
    pub mnemonic: &'static str,
    /// Short description from the catalog (`GPU has fallen off the bus`); may be empty.
    pub description: &'static str,
    /// NVIDIA "Resolution Bucket (Immediate Action)"; empty when the catalog has none.
    pub nvidia_immediate: &'static str,
    /// NVIDIA "Investigatory" bucket.
    pub nvidia_investigatory: &'static str,
    /// Decode-row buckets / trigger notes.
    pub nvidia_notes: &'static str,
    /// What gpud does.
    pub gpud_action: &'static str,
    /// What NVSentinel's syslog monitor recommends.
    pub nvsentinel_action: &'static str,
    /// NVIDIA's k8s-device-plugin treats it as an application error and skips it.
    pub device_plugin_skips: bool,
    /// The EKS node monitoring agent treats it as node-fatal.
    pub eks_nma_fatal: bool,
    /// Where the row comes from (catalog row, GPU applicability, peers).
    pub sources: &'static str,
}

impl CatalogRow {
    /// Human name: the description when the catalog has a meaningful one, else the mnemonic.
    pub(crate) fn display_name(&self) -> &'static str {
        if self.description.is_empty() || self.description.eq_ignore_ascii_case("unused") {
            self.mnemonic
        } else {
            self.description
        }
    }
}

/// Every catalog row, sorted by code.
pub(crate) static CATALOG: &[CatalogRow] = &include!("../data/catalog.generated.rs");

/// The row for `code`, if the catalog has one.
pub(crate) fn lookup(code: u32) -> Option<&'static CatalogRow> {
    CATALOG
        .binary_search_by_key(&code, |row| row.code)
        .ok()
        .map(|i| &CATALOG[i])
}

#[cfg(test)]
#[path = "../build-tools/gen_catalog.rs"]
#[allow(dead_code, unreachable_pub)]
mod gen_catalog;

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in table is exactly what the generator makes of the CSV copy.
    #[test]
    fn generated_table_matches_csv_copy() {
        crate::generated_check::check_generated(
            "xid-catalog.csv",
            "catalog.generated.rs",
            "XID_CATALOG_REGENERATE",
            "XID_CATALOG_REGENERATE=1 cargo test -p xid-parser --lib catalog::",
            gen_catalog::generate,
        );
    }

    #[test]
    fn table_covers_1_to_173_and_185_sorted() {
        let codes: Vec<u32> = CATALOG.iter().map(|r| r.code).collect();
        let mut expected: Vec<u32> = (1..=173).collect();
        expected.push(185);
        assert_eq!(codes, expected);
    }

    #[test]
    fn lookup_finds_rows_and_misses_unknown_codes() {
        let r79 = lookup(79).unwrap();
        assert_eq!(r79.mnemonic, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS");
        assert_eq!(r79.display_name(), "GPU has fallen off the bus");
        assert_eq!(r79.nvidia_immediate, "RESTART_BM");
        assert!(r79.eks_nma_fatal);
        assert!(lookup(13).unwrap().device_plugin_skips);
        assert_eq!(
            lookup(1).unwrap().display_name(),
            "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD"
        );
        assert_eq!(lookup(173).unwrap().mnemonic, "C2C Fatal Link Failure");
        assert!(lookup(0).is_none());
        assert!(lookup(174).is_none());
        assert!(lookup(u32::MAX).is_none());
    }

    #[test]
    fn csv_reader_handles_quotes_commas_and_newlines() {
        let rows =
            gen_catalog::parse_csv("a,\"b, c\",\"say \"\"hi\"\"\"\n1,\"x\ny\",\r\n").unwrap();
        assert_eq!(rows[0], ["a", "b, c", "say \"hi\""]);
        assert_eq!(rows[1], ["1", "x\ny", ""]);
        assert!(
            gen_catalog::parse_csv("a,\"open\n")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            gen_catalog::parse_csv("a,b\"c\n")
                .unwrap_err()
                .contains("quote")
        );
    }

    #[test]
    fn generator_rejects_bad_catalogs() {
        let header = gen_catalog::EXPECTED_HEADER.join(",");
        let unsorted = format!("{header}\n2,B,,,,,,,\n1,A,,,,,,,\n");
        assert!(
            gen_catalog::generate(&unsorted)
                .unwrap_err()
                .contains("not above")
        );
        let short = format!("{header}\n1,A,,\n");
        assert!(
            gen_catalog::generate(&short)
                .unwrap_err()
                .contains("fields")
        );
        let nan = format!("{header}\nx,A,,,,,,,\n");
        assert!(
            gen_catalog::generate(&nan)
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            gen_catalog::generate("xid,name\n")
                .unwrap_err()
                .contains("header")
        );
        assert!(gen_catalog::generate("").is_err());
    }

    #[test]
    fn split_name_shapes() {
        assert_eq!(
            gen_catalog::split_name("FOO (Bar (baz))"),
            ("FOO".to_string(), "Bar (baz)".to_string())
        );
        assert_eq!(
            gen_catalog::split_name("C2C Fatal Link Failure [gpud name]").0,
            "C2C Fatal Link Failure"
        );
        assert_eq!(
            gen_catalog::split_name("PLAIN"),
            ("PLAIN".to_string(), String::new())
        );
    }
}
