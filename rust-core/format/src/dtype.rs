//! The one table of safetensors element types.
//!
//! Every fact about a dtype (its header name, its size in bits, whether this project writes it,
//! and where the reference writer places it in a file) comes from [`DTYPES`]; nothing else in the
//! crate hard-codes those facts.

use std::fmt;

/// A safetensors element type, as named in a file header.
///
/// The variants are declared in the reference implementation's declaration order. That order
/// matters: the reference writer lays tensors out by dtype *descending* in this order, then by
/// name, and we reproduce its bytes exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bool,
    F4,
    F6E2M3,
    F6E3M2,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    F8E4M3Fnuz,
    F8E5M2Fnuz,
    I16,
    U16,
    F16,
    Bf16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

/// One row of the dtype table.
#[derive(Debug, Clone, Copy)]
pub struct DtypeInfo {
    pub dtype: Dtype,
    /// The exact name used in headers (case-sensitive).
    pub name: &'static str,
    /// Size of one element in bits (4 and 6 for the sub-byte float types).
    pub bits: u32,
    /// Whether the Spark writer can produce this dtype from Spark values.
    pub writable: bool,
}

const fn row(dtype: Dtype, name: &'static str, bits: u32, writable: bool) -> DtypeInfo {
    DtypeInfo {
        dtype,
        name,
        bits,
        writable,
    }
}

/// Every dtype the reference reads, in declaration order (index = `Dtype as usize`).
pub const DTYPES: [DtypeInfo; 22] = [
    row(Dtype::Bool, "BOOL", 8, true),
    row(Dtype::F4, "F4", 4, false),
    row(Dtype::F6E2M3, "F6_E2M3", 6, false),
    row(Dtype::F6E3M2, "F6_E3M2", 6, false),
    row(Dtype::U8, "U8", 8, true),
    row(Dtype::I8, "I8", 8, true),
    row(Dtype::F8E5M2, "F8_E5M2", 8, false),
    row(Dtype::F8E4M3, "F8_E4M3", 8, false),
    row(Dtype::F8E8M0, "F8_E8M0", 8, false),
    row(Dtype::F8E4M3Fnuz, "F8_E4M3FNUZ", 8, false),
    row(Dtype::F8E5M2Fnuz, "F8_E5M2FNUZ", 8, false),
    row(Dtype::I16, "I16", 16, true),
    row(Dtype::U16, "U16", 16, true),
    row(Dtype::F16, "F16", 16, true),
    row(Dtype::Bf16, "BF16", 16, true),
    row(Dtype::I32, "I32", 32, true),
    row(Dtype::U32, "U32", 32, true),
    row(Dtype::F32, "F32", 32, true),
    row(Dtype::C64, "C64", 64, false),
    row(Dtype::F64, "F64", 64, true),
    row(Dtype::I64, "I64", 64, true),
    row(Dtype::U64, "U64", 64, true),
];

impl Dtype {
    /// This dtype's row of [`DTYPES`].
    pub fn info(self) -> &'static DtypeInfo {
        // The table is declared in variant order; `table_matches_declaration_order` checks it.
        &DTYPES[self as usize]
    }

    /// The exact header name, e.g. `"BF16"`.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Element size in bits.
    pub fn bits(self) -> u32 {
        self.info().bits
    }

    /// Element size in whole bytes, or `None` for the sub-byte types (F4, F6_*).
    pub fn byte_size(self) -> Option<usize> {
        let bits = self.bits();
        bits.is_multiple_of(8).then_some((bits / 8) as usize)
    }

    /// Whether the Spark writer produces this dtype.
    pub fn is_writable(self) -> bool {
        self.info().writable
    }

    /// Exact, case-sensitive parse of a header name. `"bf16"` and `"F8_E4M3FN"` are not dtypes.
    pub fn from_name(name: &str) -> Option<Dtype> {
        DTYPES.iter().find(|d| d.name == name).map(|d| d.dtype)
    }

    /// Names of the writable dtypes, for error messages and docs.
    pub fn writable_names() -> Vec<&'static str> {
        DTYPES
            .iter()
            .filter(|d| d.writable)
            .map(|d| d.name)
            .collect()
    }

    /// Number of bytes taken by `elements` elements, or `None` when the count overflows or does
    /// not end on a byte boundary (F4 needs an even count, F6 a multiple of 4).
    pub fn checked_byte_len(self, elements: u64) -> Option<u64> {
        let bits = elements.checked_mul(u64::from(self.bits()))?;
        bits.is_multiple_of(8).then_some(bits / 8)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// Dtypes travel in plans, reports and manifests by their exact header name.
impl serde::Serialize for Dtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Dtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Dtype::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown dtype `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_declaration_order() {
        for (i, info) in DTYPES.iter().enumerate() {
            assert_eq!(info.dtype as usize, i, "{}", info.name);
            assert_eq!(Dtype::from_name(info.name), Some(info.dtype));
        }
    }

    #[test]
    fn thirteen_writable_dtypes() {
        assert_eq!(
            Dtype::writable_names(),
            [
                "BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64",
                "U64"
            ]
        );
    }

    #[test]
    fn parsing_is_exact() {
        for bad in [
            "bf16",
            "f32",
            "F8_E4M3FN",
            "C128",
            "F128",
            "I4",
            " F32",
            "F32 ",
            "",
        ] {
            assert_eq!(Dtype::from_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn byte_lengths_including_sub_byte() {
        assert_eq!(Dtype::F4.checked_byte_len(6), Some(3));
        assert_eq!(Dtype::F4.checked_byte_len(3), None);
        assert_eq!(Dtype::F6E2M3.checked_byte_len(4), Some(3));
        assert_eq!(Dtype::F6E3M2.checked_byte_len(2), None);
        assert_eq!(Dtype::C64.checked_byte_len(2), Some(16));
        assert_eq!(Dtype::U8.checked_byte_len(u64::MAX), None);
        assert_eq!(Dtype::F4.byte_size(), None);
        assert_eq!(Dtype::Bf16.byte_size(), Some(2));
    }
}
