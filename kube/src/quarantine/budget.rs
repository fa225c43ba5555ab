//! `quarantine_budget`: how many budget slots a fleet of a given size has.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// How much of the fleet may carry gpuwatch's fault taints at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    /// No bound: every agent taints its own Node on its own verdict.
    Off,
    /// A share of the fleet's Nodes, in hundredths of a percent (`"10%"` is
    /// 1000), rounded up to whole Nodes and never below the floor.
    Share {
        /// Hundredths of a percent, 1..=10000.
        basis_points: u32,
    },
    /// A fixed number of Nodes, whatever the fleet's size.
    Count(u32),
}

/// A `quarantine_budget` value that is none of `"off"`, `"<share>%"`, `"<count>"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a quarantine budget: expected a share of the fleet (\"10%\", \"2.5%\"; above 0 and at most 100%), a count of Nodes (\"3\"; at least 1) or \"off\""
)]
pub(crate) struct BudgetError(pub String);

impl Budget {
    /// Parses `"off"`, `"10%"`, `"2.5%"` (two decimals at most) or `"3"`.
    pub(crate) fn parse(s: &str) -> Result<Budget, BudgetError> {
        let err = || BudgetError(s.to_owned());
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(Budget::Off);
        }
        if let Some(pct) = t.strip_suffix('%') {
            let bp = parse_basis_points(pct.trim_end()).ok_or_else(err)?;
            if bp == 0 || bp > 10_000 {
                return Err(err());
            }
            return Ok(Budget::Share { basis_points: bp });
        }
        match t.parse::<u32>() {
            Ok(n) if n >= 1 && t.bytes().all(|b| b.is_ascii_digit()) => Ok(Budget::Count(n)),
            _ => Err(err()),
        }
    }

    /// Slots for a fleet of `fleet` Nodes: `None` when the budget is off.
    ///
    /// A share is rounded up (10 % of 95 Nodes is 10 slots) and raised to
    /// `floor`, so a small pool can still isolate independent failures; no
    /// budget exceeds the fleet, except that an empty or unknown fleet (0) still
    /// gets the floor (a Node that sees a fault is in the fleet, whatever the
    /// label selector said).
    pub(crate) fn slots(self, fleet: u32, floor: u32) -> Option<u32> {
        let raw = match self {
            Budget::Off => return None,
            Budget::Count(n) => return Some(n),
            Budget::Share { basis_points } => {
                (u64::from(fleet) * u64::from(basis_points)).div_ceil(10_000) as u32
            }
        };
        let floored = raw.max(floor);
        Some(if fleet == 0 {
            floored
        } else {
            floored.min(fleet)
        })
    }
}

/// `"12.5"` → 1250; at most two decimals.
fn parse_basis_points(s: &str) -> Option<u32> {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, f),
        None => (s, ""),
    };
    if whole.is_empty()
        || frac.len() > 2
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || (s.contains('.') && frac.is_empty())
    {
        return None;
    }
    let w: u32 = whole.parse().ok()?;
    let f: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<2}").parse().ok()?
    };
    w.checked_mul(100)?.checked_add(f)
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Budget::Off => f.write_str("off"),
            Budget::Count(n) => write!(f, "{n}"),
            Budget::Share { basis_points } if basis_points % 100 == 0 => {
                write!(f, "{}%", basis_points / 100)
            }
            Budget::Share { basis_points } => {
                let s = format!("{}.{:02}", basis_points / 100, basis_points % 100);
                write!(f, "{}%", s.trim_end_matches('0'))
            }
        }
    }
}

impl Serialize for Budget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Budget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Budget, D::Error> {
        let s = String::deserialize(d)?;
        Budget::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_shares_counts_and_off() {
        assert_eq!(Budget::parse("off"), Ok(Budget::Off));
        assert_eq!(Budget::parse("OFF"), Ok(Budget::Off));
        assert_eq!(
            Budget::parse("10%"),
            Ok(Budget::Share { basis_points: 1000 })
        );
        assert_eq!(
            Budget::parse("2.5%"),
            Ok(Budget::Share { basis_points: 250 })
        );
        assert_eq!(
            Budget::parse("0.25%"),
            Ok(Budget::Share { basis_points: 25 })
        );
        assert_eq!(
            Budget::parse("100%"),
            Ok(Budget::Share {
                basis_points: 10_000
            })
        );
        assert_eq!(Budget::parse("3"), Ok(Budget::Count(3)));
        assert_eq!(Budget::parse(" 3 "), Ok(Budget::Count(3)));
    }

    #[test]
    fn rejects_what_is_not_a_budget() {
        for bad in [
            "",
            "0",
            "0%",
            "101%",
            "-1",
            "+3",
            "10 %x",
            "ten",
            "1.5",
            "2.%",
            ".5%",
            "1.234%",
            "on",
            "10%%",
            "4294967296",
        ] {
            assert!(Budget::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let e = Budget::parse("lots").unwrap_err().to_string();
        assert!(e.contains("\"lots\"") && e.contains("\"off\""), "{e}");
    }

    #[test]
    fn display_round_trips() {
        for s in ["off", "10%", "2.5%", "0.25%", "100%", "3"] {
            assert_eq!(Budget::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn a_share_rounds_up_and_keeps_the_floor() {
        let ten = Budget::parse("10%").unwrap();
        assert_eq!(ten.slots(100, 2), Some(10));
        assert_eq!(ten.slots(95, 2), Some(10));
        assert_eq!(ten.slots(101, 2), Some(11));
        assert_eq!(ten.slots(5000, 2), Some(500));
        // 10 % of a four-node pool is less than one Node: the floor holds.
        assert_eq!(ten.slots(4, 2), Some(2));
        // Never more slots than Nodes...
        assert_eq!(ten.slots(1, 2), Some(1));
        // ...except for a fleet the selector did not find.
        assert_eq!(ten.slots(0, 2), Some(2));
    }

    #[test]
    fn a_count_is_the_count_and_off_is_none() {
        assert_eq!(Budget::Count(3).slots(100, 2), Some(3));
        assert_eq!(Budget::Count(1).slots(100, 2), Some(1));
        assert_eq!(Budget::Off.slots(100, 2), None);
    }
}
