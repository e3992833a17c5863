//! The fast path of [`super::parse_header`]: serde visitors that read the header JSON straight
//! into [`TensorInfo`]s, with no intermediate JSON tree and no per-entry error bookkeeping.
//!
//! It accepts only what the detailed path ([`super::parse_header_items`] and the checks after it)
//! accepts, and gives the same [`Header`] for it; anything else, whatever the reason, is `None`,
//! and `parse_header` then runs the detailed path, which finds the error and words it. So the
//! errors (kinds, order, messages) are the detailed path's, and a valid header is read once.
//!
//! What the fast path checks itself, each by refusing (`None`):
//! - UTF-8, JSON syntax and trailing characters: serde_json, as the detailed path;
//! - a top-level object; `__metadata__` at most once, `null` or an object of strings with no key
//!   twice;
//! - every other entry an object with exactly the fields `dtype` (a known dtype name), `shape`
//!   (non-negative integers) and `data_offsets` (two of them), each once;
//! - no tensor name twice: checked on the name index the [`Header`] builds anyway (one sort, no
//!   hash set), after the offset checks; a duplicate found there also means the detailed path
//!   must run, since a duplicate key is reported before any offsets error;
//! - the offset and file-length rules: the same functions as the detailed path, on the same
//!   tensors in the same (JSON) order.

use super::{check_coverage, validate_offsets, Header, TensorInfo, METADATA_KEY};
use crate::dtype::Dtype;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;

/// The header, or `None` when the detailed path must run (the header is invalid, or the fast
/// path cannot prove it valid).
pub(super) fn parse(json: &[u8], file_len: u64) -> Option<Header> {
    let text = std::str::from_utf8(json).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let (metadata, mut tensors) = de.deserialize_map(Top).ok()?;
    de.end().ok()?;
    let data_len = validate_offsets(&mut tensors).ok()?;
    check_coverage(json.len() as u64, data_len, file_len).ok()?;
    let header = Header::new(metadata, tensors, json.len() as u64, data_len);
    let name = |i: u32| header.tensors.get(i as usize).map(|t| t.name.as_str());
    let duplicate = header
        .by_name
        .windows(2)
        .any(|w| matches!(w, [a, b] if name(*a) == name(*b)));
    (!duplicate).then_some(header)
}

type Metadata = Option<BTreeMap<String, String>>;

/// The top-level object: `__metadata__` and the tensors in JSON order.
struct Top;

impl<'de> Visitor<'de> for Top {
    type Value = (Metadata, Vec<TensorInfo>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a header object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut metadata = None;
        let mut seen_metadata = false;
        let mut tensors = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            if name == METADATA_KEY {
                if std::mem::replace(&mut seen_metadata, true) {
                    return Err(de::Error::custom("`__metadata__` twice"));
                }
                metadata = map.next_value_seed(MetadataSeed)?;
            } else {
                let (dtype, shape, data_offsets) = map.next_value_seed(EntrySeed)?;
                tensors.push(TensorInfo {
                    name,
                    dtype,
                    shape,
                    data_offsets,
                });
            }
        }
        Ok((metadata, tensors))
    }
}

/// `__metadata__`: `null`, or an object of string values with no key twice.
struct MetadataSeed;

impl<'de> DeserializeSeed<'de> for MetadataSeed {
    type Value = Metadata;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Metadata, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed {
    type Value = Metadata;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("null or an object of strings")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Metadata, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Metadata, A::Error> {
        let entries: Vec<(String, String)> =
            crate::json_object::read_unique_entries(map, |_| "a `__metadata__` key twice".into())?;
        Ok(Some(entries.into_iter().collect()))
    }
}

/// A tensor entry: an object with `dtype`, `shape` and `data_offsets`, each exactly once.
struct EntrySeed;

type Entry = (Dtype, Vec<u64>, [u64; 2]);

impl<'de> DeserializeSeed<'de> for EntrySeed {
    type Value = Entry;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Entry, D::Error> {
        // deserialize_map, not deserialize_struct: serde_json reads a struct from an array too,
        // and an entry that is an array is invalid (rule 8a).
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tensor entry object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        while let Some(field) = map.next_key_seed(FieldSeed)? {
            let twice = match field {
                Field::Dtype => dtype.replace(map.next_value_seed(DtypeSeed)?).is_some(),
                Field::Shape => shape.replace(map.next_value::<Vec<u64>>()?).is_some(),
                Field::DataOffsets => offsets.replace(map.next_value_seed(OffsetsSeed)?).is_some(),
            };
            if twice {
                return Err(de::Error::custom("a field twice"));
            }
        }
        match (dtype, shape, offsets) {
            (Some(dtype), Some(shape), Some(offsets)) => Ok((dtype, shape, offsets)),
            _ => Err(de::Error::custom("a field missing")),
        }
    }
}

/// A field name of a tensor entry; any other name is an error.
enum Field {
    Dtype,
    Shape,
    DataOffsets,
}

struct FieldSeed;

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = Field;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Field, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("dtype, shape or data_offsets")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
        match v {
            "dtype" => Ok(Field::Dtype),
            "shape" => Ok(Field::Shape),
            "data_offsets" => Ok(Field::DataOffsets),
            _ => Err(E::custom("an unknown field")),
        }
    }
}

/// A dtype name (exact, as [`Dtype::from_name`]); read without copying the string.
struct DtypeSeed;

impl<'de> DeserializeSeed<'de> for DtypeSeed {
    type Value = Dtype;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Dtype, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for DtypeSeed {
    type Value = Dtype;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a dtype name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Dtype, E> {
        Dtype::from_name(v).ok_or_else(|| E::custom("an unknown dtype"))
    }
}

/// `data_offsets`: an array of exactly two non-negative integers, read without allocating.
struct OffsetsSeed;

impl<'de> DeserializeSeed<'de> for OffsetsSeed {
    type Value = [u64; 2];

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<[u64; 2], D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for OffsetsSeed {
    type Value = [u64; 2];

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("two non-negative integers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[u64; 2], A::Error> {
        let begin = seq.next_element::<u64>()?;
        let end = seq.next_element::<u64>()?;
        match (begin, end, seq.next_element::<de::IgnoredAny>()?) {
            (Some(begin), Some(end), None) => Ok([begin, end]),
            _ => Err(de::Error::custom("not two offsets")),
        }
    }
}
