//! serde adapters for enum fields: prost keeps them as `i32`; JSON carries the
//! lowercase short name. Unknown numbers are written as numbers (forward
//! compatible); both names and numbers are accepted when reading.

use crate::ShortName;
use serde::{Deserialize, Deserializer, Serializer};

fn serialize<T, S>(value: &i32, ser: S) -> Result<S::Ok, S::Error>
where
    T: ShortName + TryFrom<i32>,
    S: Serializer,
{
    match T::try_from(*value) {
        Ok(v) => ser.serialize_str(v.short_name()),
        Err(_) => ser.serialize_i32(*value),
    }
}

fn deserialize<'de, T, D>(de: D) -> Result<i32, D::Error>
where
    T: ShortName + Into<i32>,
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NameOrNumber {
        Name(String),
        Number(i32),
    }
    match NameOrNumber::deserialize(de)? {
        NameOrNumber::Number(n) => Ok(n),
        NameOrNumber::Name(name) => T::from_short_name(&name)
            .map(Into::into)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown enum value {name:?}"))),
    }
}

macro_rules! adapter {
    ($module:ident, $ty:ty) => {
        #[doc = concat!("serde `with` adapter for `", stringify!($ty), "` fields.")]
        pub mod $module {
            /// Writes the short name.
            pub fn serialize<S: serde::Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
                super::serialize::<$ty, S>(v, s)
            }
            /// Reads a short name, proto name or number.
            pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
                super::deserialize::<$ty, D>(d)
            }
        }
    };
}

adapter!(fault_kind, crate::FaultKind);
adapter!(action, crate::Action);
adapter!(severity, crate::Severity);
adapter!(source, crate::Source);
adapter!(verdict, crate::Verdict);
adapter!(recovery_action, crate::RecoveryAction);
