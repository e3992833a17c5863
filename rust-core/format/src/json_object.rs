//! Reading a JSON object entry by entry, in JSON order, with every entry kept: serde_json's own
//! maps keep only the last of two equal keys, so whoever must reject (and name) a duplicate key
//! reads the object here. The one reader of such objects: the header's objects
//! ([`crate::header`], fast and detailed paths), the manifest's `schema`
//! (`safetensors_spark_dataset::manifest`) and the write options holding JSON objects
//! (`safetensors_spark_engine::write::plan`).

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

/// The entries of the object `map` in JSON order, duplicate keys included.
pub fn read_entries<'de, A: MapAccess<'de>, V: Deserialize<'de>>(
    mut map: A,
) -> Result<Vec<(String, V)>, A::Error> {
    let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
    while let Some((k, v)) = map.next_entry::<String, V>()? {
        out.push((k, v));
    }
    Ok(out)
}

/// The entries of the object `map` in JSON order; the first key that comes again is an error
/// worded by `duplicate` (given that key), and reading stops there.
pub fn read_unique_entries<'de, A: MapAccess<'de>, V: Deserialize<'de>>(
    mut map: A,
    duplicate: impl Fn(&str) -> String,
) -> Result<Vec<(String, V)>, A::Error> {
    let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
    let mut seen = HashSet::new();
    while let Some((k, v)) = map.next_entry::<String, V>()? {
        if !seen.insert(k.clone()) {
            return Err(de::Error::custom(duplicate(&k)));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// The first key of `entries` that an earlier entry has too.
pub fn first_duplicate_key<V>(entries: &[(String, V)]) -> Option<&str> {
    let mut seen = HashSet::with_capacity(entries.len());
    entries
        .iter()
        .map(|(k, _)| k.as_str())
        .find(|k| !seen.insert(*k))
}

/// Deserializes an object (and nothing else) with [`read_unique_entries`]; `expecting` words
/// what a value that is not an object should have been.
pub fn deserialize_unique_entries<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
    deserializer: D,
    expecting: &'static str,
    duplicate: impl Fn(&str) -> String,
) -> Result<Vec<(String, V)>, D::Error> {
    struct Unique<V, F> {
        expecting: &'static str,
        duplicate: F,
        value: PhantomData<V>,
    }
    impl<'de, V: Deserialize<'de>, F: Fn(&str) -> String> Visitor<'de> for Unique<V, F> {
        type Value = Vec<(String, V)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(self.expecting)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            read_unique_entries(map, self.duplicate)
        }
    }
    deserializer.deserialize_map(Unique {
        expecting,
        duplicate,
        value: PhantomData,
    })
}

/// A JSON object read with [`read_entries`]: every entry in order, duplicate keys included (see
/// [`first_duplicate_key`]). Anything but an object is an error expecting "a JSON object".
#[derive(Debug, Clone, PartialEq)]
pub struct Entries<V>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct All<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for All<V> {
            type Value = Entries<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                read_entries(map).map(Entries)
            }
        }
        deserializer.deserialize_map(All(PhantomData))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_order_and_duplicates() {
        let e: Entries<u32> = serde_json::from_str(r#"{"b":1,"a":2,"b":3}"#).unwrap();
        let keys: Vec<&str> = e.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
        assert_eq!(first_duplicate_key(&e.0), Some("b"));
        let e: Entries<u32> = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
        assert_eq!(first_duplicate_key(&e.0), None);
        let err = serde_json::from_str::<Entries<u32>>("[1]").unwrap_err();
        assert!(err.to_string().contains("a JSON object"), "{err}");
    }

    #[test]
    fn unique_entries_stop_at_the_first_duplicate() {
        let read = |s: &str| {
            let mut de = serde_json::Deserializer::from_str(s);
            deserialize_unique_entries::<_, u32>(&mut de, "an object of numbers", |k| {
                format!("`{k}` twice")
            })
        };
        assert_eq!(read(r#"{"x":1,"y":2}"#).unwrap().len(), 2);
        // The duplicate is found before the later entry that is not a number.
        let err = read(r#"{"x":1,"x":2,"z":"no"}"#).unwrap_err();
        assert!(err.to_string().contains("`x` twice"), "{err}");
        let err = read("3").unwrap_err();
        assert!(err.to_string().contains("an object of numbers"), "{err}");
    }
}
