//! What `__metadata__` says about the model (named fields from the conventions real files use),
//! and the metadata flags: malformed values, spoofed keys, keys outside the allowlist.
//!
//! The source keys of every field are listed in `spec/forensics.md` §4; [`SOURCES`] is the table
//! in code.

use super::flags::{Flag, FlagCode};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Model information found in `__metadata__`. A field is `None` (or empty) when no source key
/// is present; `sources` says which key each field came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelInfo {
    pub name: Option<String>,
    pub description: Option<String>,
    pub trigger_words: Vec<String>,
    pub usage_hint: Option<String>,
    pub base_model: Option<String>,
    pub architecture: Option<String>,
    pub civitai_model_id: Option<u64>,
    pub civitai_version_id: Option<u64>,
    pub author: Option<String>,
    pub license: Option<String>,
    pub training_tool: Option<String>,
    /// `WIDTHxHEIGHT` when the source value has that shape, else the value as written.
    pub resolution: Option<String>,
    pub date: Option<String>,
    pub tags: Vec<String>,
    pub format: Option<String>,
    pub producer: Option<String>,
    pub quantization: Option<String>,
    pub network_module: Option<String>,
    pub network_dim: Option<String>,
    pub network_alpha: Option<String>,
    pub training_steps: Option<u64>,
    pub training_epochs: Option<u64>,
    pub training_images: Option<u64>,
    /// Training-caption tags by frequency (kohya `ss_tag_frequency`, summed over the dataset
    /// directories), most frequent first, at most [`TOP_TAGS`].
    pub tag_frequency: Vec<TagCount>,
    /// Number of distinct caption tags (the list above may be cut).
    pub distinct_tags: u64,
    /// Field name → the metadata key (or key pattern) it was taken from.
    pub sources: BTreeMap<&'static str, String>,
}

/// One caption tag and how many training images carried it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TagCount {
    pub tag: String,
    pub count: u64,
}

/// The longest `tag_frequency` list a report carries.
pub const TOP_TAGS: usize = 50;

/// Text fields and their source keys, first present (non-empty, not `None`) key wins.
pub const SOURCES: &[(&str, &[&str])] = &[
    (
        "name",
        &["modelspec.title", "ss_output_name", "name", "title"],
    ),
    (
        "description",
        &[
            "modelspec.description",
            "description",
            "ss_training_comment",
        ],
    ),
    (
        "trigger_words",
        &[
            "modelspec.trigger_phrase",
            "trigger_words",
            "trigger_word",
            "activation_text",
        ],
    ),
    ("usage_hint", &["modelspec.usage_hint"]),
    (
        "base_model",
        &["ss_sd_model_name", "ss_base_model_version", "base_model"],
    ),
    ("architecture", &["modelspec.architecture"]),
    ("author", &["modelspec.author", "author"]),
    ("license", &["modelspec.license", "license"]),
    ("training_tool", &["training_tool"]),
    (
        "resolution",
        &["modelspec.resolution", "ss_resolution", "resolution"],
    ),
    ("date", &["modelspec.date", "date"]),
    ("tags", &["modelspec.tags", "tags"]),
    ("format", &["format"]),
    ("producer", &["producer"]),
    ("quantization", &["quantization"]),
    ("network_module", &["ss_network_module"]),
    ("network_dim", &["ss_network_dim"]),
    ("network_alpha", &["ss_network_alpha"]),
    ("training_steps", &["ss_steps", "ss_max_train_steps"]),
    ("training_epochs", &["ss_epoch", "ss_num_epochs"]),
    ("training_images", &["ss_num_train_images"]),
];

/// Keys of the allowlist besides every key of [`SOURCES`] and [`ALLOWED_PREFIXES`].
pub const ALLOWED_KEYS: &[&str] = &[
    "version",
    "civitai_model_id",
    "civitai_version_id",
    "sshs_model_hash",
    "sshs_legacy_hash",
];

/// Key prefixes of the allowlist: Stability's model spec, kohya sd-scripts' training keys and
/// their hashes, and this project's own shard keys.
pub const ALLOWED_PREFIXES: &[&str] = &["modelspec.", "ss_", "sshs_", "safetensors_spark."];

/// kohya keys whose value is JSON, and the JSON kind it must be.
const JSON_KEYS: &[(&str, JsonKind)] = &[
    ("ss_tag_frequency", JsonKind::Object),
    ("ss_dataset_dirs", JsonKind::Object),
    ("ss_datasets", JsonKind::Array),
    ("ss_network_args", JsonKind::Object),
];

/// Keys whose value must be a non-negative integer.
const INTEGER_KEYS: &[&str] = &[
    "ss_steps",
    "ss_max_train_steps",
    "ss_epoch",
    "ss_num_epochs",
    "ss_num_train_images",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonKind {
    Object,
    Array,
}

/// Whether `key` is on the allowlist.
pub fn is_allowed_key(key: &str) -> bool {
    ALLOWED_PREFIXES.iter().any(|p| key.starts_with(p))
        || ALLOWED_KEYS.contains(&key)
        || SOURCES.iter().any(|(_, keys)| keys.contains(&key))
}

/// A value that means "not set": empty, or Python's `None` as kohya writes it.
fn present(value: &str) -> Option<&str> {
    let v = value.trim();
    (!v.is_empty() && v != "None").then_some(v)
}

/// The model information in `meta`.
pub fn model_info(meta: &BTreeMap<String, String>) -> ModelInfo {
    let mut info = ModelInfo::default();
    for (field, keys) in SOURCES {
        let Some((key, value)) = keys
            .iter()
            .find_map(|k| meta.get(*k).and_then(|v| present(v)).map(|v| (*k, v)))
        else {
            continue;
        };
        let text = Some(value.to_owned());
        let number = || value.parse::<u64>().ok();
        let list = || split_list(value);
        match *field {
            "name" => info.name = text,
            "description" => info.description = text,
            "trigger_words" => info.trigger_words = list(),
            "usage_hint" => info.usage_hint = text,
            "base_model" => info.base_model = text,
            "architecture" => info.architecture = text,
            "author" => info.author = text,
            "license" => info.license = text,
            "training_tool" => info.training_tool = text,
            "resolution" => info.resolution = Some(normalise_resolution(value)),
            "date" => info.date = text,
            "tags" => info.tags = list(),
            "format" => info.format = text,
            "producer" => info.producer = text,
            "quantization" => info.quantization = text,
            "network_module" => info.network_module = text,
            "network_dim" => info.network_dim = text,
            "network_alpha" => info.network_alpha = text,
            "training_steps" => info.training_steps = number(),
            "training_epochs" => info.training_epochs = number(),
            "training_images" => info.training_images = number(),
            _ => {}
        }
        info.sources.insert(field, key.to_owned());
    }
    if info.training_tool.is_none() && meta.keys().any(|k| k.starts_with("ss_")) {
        info.training_tool = Some("kohya-ss sd-scripts".into());
        info.sources.insert("training_tool", "ss_*".into());
    }
    civitai_ids(meta, &mut info);
    tag_frequency(meta, &mut info);
    info
}

/// Comma-separated items, trimmed, empty ones and repeats dropped, order kept.
fn split_list(value: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !out.iter().any(|o| o == item) {
            out.push(item.to_owned());
        }
    }
    out
}

/// `WxH` from `"1024x1024"`, `"(512, 768)"`, `"512,768"` or `"512"` (square); else the value.
fn normalise_resolution(value: &str) -> String {
    parse_resolution(value).map_or_else(|| value.to_owned(), |(w, h)| format!("{w}x{h}"))
}

fn parse_resolution(value: &str) -> Option<(u64, u64)> {
    let v = value.trim();
    let v = v
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .or_else(|| v.strip_prefix('[').and_then(|s| s.strip_suffix(']')))
        .unwrap_or(v);
    let parts: Vec<&str> = v.split([',', 'x']).map(str::trim).collect();
    match parts.as_slice() {
        [w] => w.parse().ok().map(|w| (w, w)),
        [w, h] => Some((w.parse().ok()?, h.parse().ok()?)),
        _ => None,
    }
}

/// Ids from explicit keys (`civitai_model_id`, `civitai_version_id`), else from CivitAI URLs in
/// any value: `civitai.com/models/<model id>`, `?modelVersionId=<version id>`,
/// `civitai.com/api/download/models/<version id>`.
fn civitai_ids(meta: &BTreeMap<String, String>, info: &mut ModelInfo) {
    for (key, field) in [
        ("civitai_model_id", "civitai_model_id"),
        ("civitai_version_id", "civitai_version_id"),
    ] {
        if let Some(id) = meta.get(key).and_then(|v| v.trim().parse::<u64>().ok()) {
            if field == "civitai_model_id" {
                info.civitai_model_id = Some(id);
            } else {
                info.civitai_version_id = Some(id);
            }
            info.sources.insert(field, key.into());
        }
    }
    for (key, value) in meta {
        if info.civitai_model_id.is_none() {
            if let Some(id) = number_after(value, "civitai.com/models/") {
                info.civitai_model_id = Some(id);
                info.sources.insert("civitai_model_id", key.clone());
            }
        }
        if info.civitai_version_id.is_none() {
            let id = number_after(value, "civitai.com/api/download/models/")
                .or_else(|| number_after(value, "modelVersionId="));
            if let Some(id) = id {
                info.civitai_version_id = Some(id);
                info.sources.insert("civitai_version_id", key.clone());
            }
        }
    }
}

/// The decimal number right after the first `marker` in `text`.
fn number_after(text: &str, marker: &str) -> Option<u64> {
    let (_, rest) = text.split_once(marker)?;
    let digits: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
    digits.parse().ok()
}

/// Sums kohya's `ss_tag_frequency` (`{"<repeats>_<dir>": {"tag": count}}`), or the
/// `tag_frequency` of each entry of `ss_datasets` when that key is absent.
fn tag_frequency(meta: &BTreeMap<String, String>, info: &mut ModelInfo) {
    let mut dirs: Vec<Value> = Vec::new();
    let mut source = "";
    if let Some(Value::Object(map)) = meta
        .get("ss_tag_frequency")
        .and_then(|v| serde_json::from_str(v).ok())
    {
        dirs.extend(map.into_iter().map(|(_, v)| v));
        source = "ss_tag_frequency";
    } else if let Some(Value::Array(sets)) = meta
        .get("ss_datasets")
        .and_then(|v| serde_json::from_str(v).ok())
    {
        for set in sets {
            if let Some(Value::Object(map)) = set.get("tag_frequency") {
                dirs.extend(map.values().cloned());
                source = "ss_datasets";
            }
        }
    }
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for dir in dirs {
        if let Value::Object(tags) = dir {
            for (tag, n) in tags {
                let tag = tag.trim();
                if let (false, Some(n)) = (tag.is_empty(), n.as_u64()) {
                    let c = counts.entry(tag.to_owned()).or_default();
                    *c = c.saturating_add(n);
                }
            }
        }
    }
    if counts.is_empty() {
        return;
    }
    info.distinct_tags = counts.len() as u64;
    let mut list: Vec<TagCount> = counts
        .into_iter()
        .map(|(tag, count)| TagCount { tag, count })
        .collect();
    list.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.tag.cmp(&b.tag)));
    list.truncate(TOP_TAGS);
    info.tag_frequency = list;
    info.sources.insert("tag_frequency", source.into());
}

/// The metadata flags of one file: malformed values of known keys, keys imitating known ones,
/// keys outside the allowlist (returned as well, to be listed in the report).
pub fn check_metadata(meta: &BTreeMap<String, String>) -> (Vec<Flag>, Vec<String>) {
    let mut flags = Vec::new();
    let mut unlisted = Vec::new();
    let malformed = |key: &str, why: String| {
        Flag::new(
            FlagCode::MetadataMalformed,
            None,
            format!("`__metadata__` key `{}`: {why}", escape(key)),
        )
    };
    for (key, value) in meta {
        if let Some(c) = key.chars().find(|c| c.is_control()) {
            flags.push(malformed(
                key,
                format!("the key holds control character U+{:04X}", c as u32),
            ));
        }
        if let Some(c) = value
            .chars()
            .find(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        {
            flags.push(malformed(
                key,
                format!(
                    "the value holds control character U+{:04X} (value of {} bytes)",
                    c as u32,
                    value.len()
                ),
            ));
        }
        if let Some(v) = present(value) {
            if let Some((_, kind)) = JSON_KEYS.iter().find(|(k, _)| k == key) {
                let ok = match serde_json::from_str::<Value>(v) {
                    Ok(Value::Object(_)) => *kind == JsonKind::Object,
                    Ok(Value::Array(_)) => *kind == JsonKind::Array,
                    _ => false,
                };
                if !ok {
                    let want = match kind {
                        JsonKind::Object => "a JSON object",
                        JsonKind::Array => "a JSON array",
                    };
                    flags.push(malformed(
                        key,
                        format!("the value must be {want}, found {}", preview(v)),
                    ));
                }
            }
            if INTEGER_KEYS.contains(&key.as_str()) && v.parse::<u64>().is_err() {
                flags.push(malformed(
                    key,
                    format!(
                        "the value must be a non-negative integer, found {}",
                        preview(v)
                    ),
                ));
            }
            let is_resolution = key == "modelspec.resolution" || key == "ss_resolution";
            if is_resolution && parse_resolution(v).is_none() {
                flags.push(malformed(
                    key,
                    format!(
                        "the value must be a resolution (`1024x1024`, `(512, 512)`), found {}",
                        preview(v)
                    ),
                ));
            }
        }
        if is_allowed_key(key) {
            continue;
        }
        if let Some(imitated) = imitated_key(key) {
            flags.push(Flag::new(
                FlagCode::MetadataSpoofed,
                None,
                format!(
                    "`__metadata__` key `{}` imitates the known key `{imitated}` (it differs only by case, spacing, invisible or look-alike characters)",
                    escape(key)
                ),
            ));
        } else {
            unlisted.push(key.clone());
        }
    }
    let has_modelspec = meta.keys().any(|k| k.starts_with("modelspec."));
    if has_modelspec && !meta.contains_key("modelspec.sai_model_spec") {
        let n = meta.keys().filter(|k| k.starts_with("modelspec.")).count();
        flags.push(malformed(
            "modelspec.sai_model_spec",
            format!("missing, while {n} other `modelspec.*` keys are present"),
        ));
    }
    if !unlisted.is_empty() {
        let shown: Vec<String> = unlisted
            .iter()
            .take(10)
            .map(|k| format!("`{}`", escape(k)))
            .collect();
        let more = unlisted.len().saturating_sub(shown.len());
        flags.push(Flag::new(
            FlagCode::MetadataUnlistedKeys,
            None,
            format!(
                "{} `__metadata__` keys are outside the allowlist: {}{}",
                unlisted.len(),
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ),
        ));
    }
    (flags, unlisted)
}

/// The known key (or known prefix) that `key` imitates, if it is not that key itself but equal
/// to it once case, spacing, invisible and look-alike characters are folded.
pub fn imitated_key(key: &str) -> Option<String> {
    let folded = skeleton(key);
    if folded == key {
        return None;
    }
    if let Some(p) = ALLOWED_PREFIXES.iter().find(|p| folded.starts_with(**p)) {
        return Some(format!("{p}*"));
    }
    let known = SOURCES
        .iter()
        .flat_map(|(_, keys)| keys.iter())
        .chain(ALLOWED_KEYS)
        .chain(std::iter::once(&crate::header::METADATA_KEY));
    known
        .into_iter()
        .find(|k| **k == folded)
        .map(|k| k.to_string())
}

/// Lower-case ASCII form of `s`: whitespace and invisible (format) characters dropped,
/// full-width forms and common Cyrillic/Greek look-alikes mapped to the Latin letter they
/// resemble.
pub fn skeleton(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_whitespace() && !is_invisible(*c))
        .map(|c| {
            let c = match c as u32 {
                0xFF01..=0xFF5E => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
                _ => c,
            };
            let mapped = match c {
                'а' | 'А' | 'α' | 'Α' => 'a',
                'е' | 'Е' | 'ε' | 'Ε' => 'e',
                'о' | 'О' | 'ο' | 'Ο' => 'o',
                'р' | 'Р' | 'ρ' | 'Ρ' => 'p',
                'с' | 'С' => 'c',
                'у' | 'У' => 'y',
                'х' | 'Х' | 'χ' | 'Χ' => 'x',
                'і' | 'І' | 'ι' | 'Ι' => 'i',
                'ѕ' | 'Ѕ' => 's',
                'ј' | 'Ј' => 'j',
                'к' | 'К' | 'κ' | 'Κ' => 'k',
                'м' | 'М' | 'Μ' => 'm',
                'т' | 'Т' | 'τ' | 'Τ' => 't',
                'н' | 'Н' | 'Η' => 'h',
                'в' | 'В' | 'Β' => 'b',
                'ν' | 'Ν' => 'n',
                'ԁ' => 'd',
                'ɡ' => 'g',
                'ⅼ' | 'ӏ' => 'l',
                '‐' | '‑' | '–' | '—' => '-',
                '＿' => '_',
                other => other,
            };
            mapped.to_ascii_lowercase()
        })
        .collect()
}

/// Zero-width, bidi and other format characters that render as nothing.
pub fn is_invisible(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x034F | 0x061C | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180B..=0x180E
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F | 0x3164 | 0xFE00..=0xFE0F
        | 0xFEFF | 0xFFA0 | 0xE0000..=0xE0FFF)
}

/// `s` with control and invisible characters written as `\u{…}`, for messages.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || is_invisible(c) {
            out.push_str(&format!("\\u{{{:04X}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A short quoted form of a value for messages.
fn preview(v: &str) -> String {
    let mut p: String = v.chars().take(40).collect();
    if p.len() < v.len() {
        p.push('…');
    }
    format!("`{}`", escape(&p))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn codes(flags: &[Flag]) -> Vec<&'static str> {
        flags.iter().map(|f| f.code.code()).collect()
    }

    #[test]
    fn kohya_lora_metadata_fills_the_fields() {
        let m = meta(&[
            ("ss_output_name", "ohwx_style_v2"),
            ("ss_sd_model_name", "sd_xl_base_1.0.safetensors"),
            ("ss_base_model_version", "sdxl_base_v1-0"),
            ("ss_resolution", "(1024, 1024)"),
            ("ss_network_module", "networks.lora"),
            ("ss_network_dim", "32"),
            ("ss_network_alpha", "16.0"),
            ("ss_steps", "3000"),
            ("ss_epoch", "10"),
            ("ss_num_train_images", "300"),
            (
                "ss_training_comment",
                "trigger: ohwx. https://civitai.com/models/123456?modelVersionId=654321",
            ),
            (
                "ss_tag_frequency",
                r#"{"10_ohwx style": {"ohwx": 30, "1girl": 12, " solo": 5}, "5_reg": {"1girl": 8, "outdoors": 2}}"#,
            ),
            (
                "ss_dataset_dirs",
                r#"{"10_ohwx style": {"n_repeats": 10, "img_count": 30}}"#,
            ),
            ("sshs_model_hash", "abc"),
        ]);
        let info = model_info(&m);
        assert_eq!(info.name.as_deref(), Some("ohwx_style_v2"));
        assert_eq!(
            info.base_model.as_deref(),
            Some("sd_xl_base_1.0.safetensors")
        );
        assert_eq!(info.resolution.as_deref(), Some("1024x1024"));
        assert_eq!(info.training_tool.as_deref(), Some("kohya-ss sd-scripts"));
        assert_eq!(
            info.sources.get("training_tool").map(String::as_str),
            Some("ss_*")
        );
        assert_eq!(info.network_module.as_deref(), Some("networks.lora"));
        assert_eq!(info.training_steps, Some(3000));
        assert_eq!(info.training_epochs, Some(10));
        assert_eq!(info.training_images, Some(300));
        assert_eq!(info.civitai_model_id, Some(123456));
        assert_eq!(info.civitai_version_id, Some(654321));
        assert!(info
            .description
            .as_deref()
            .unwrap()
            .starts_with("trigger: ohwx"));
        assert_eq!(info.distinct_tags, 4);
        let tags: Vec<(&str, u64)> = info
            .tag_frequency
            .iter()
            .map(|t| (t.tag.as_str(), t.count))
            .collect();
        assert_eq!(
            tags,
            [("ohwx", 30), ("1girl", 20), ("solo", 5), ("outdoors", 2)]
        );
        let (flags, unlisted) = check_metadata(&m);
        assert!(flags.is_empty(), "{flags:?}");
        assert!(unlisted.is_empty());
    }

    #[test]
    fn modelspec_metadata_fills_the_fields() {
        let m = meta(&[
            ("modelspec.sai_model_spec", "1.0.0"),
            ("modelspec.architecture", "stable-diffusion-xl-v1-base/lora"),
            ("modelspec.implementation", "sgm"),
            ("modelspec.title", "Paper Cut Style"),
            ("modelspec.description", "Paper cut look"),
            ("modelspec.author", "Jane"),
            ("modelspec.license", "CreativeML Open RAIL++-M"),
            ("modelspec.resolution", "1024x1024"),
            ("modelspec.trigger_phrase", "papercut, paper art , papercut"),
            ("modelspec.tags", "style,paper"),
            ("modelspec.date", "2024-03-01T10:00:00"),
            ("modelspec.usage_hint", "weight 0.8"),
            ("format", "pt"),
            ("producer", "diffusers"),
        ]);
        let info = model_info(&m);
        assert_eq!(info.name.as_deref(), Some("Paper Cut Style"));
        assert_eq!(info.description.as_deref(), Some("Paper cut look"));
        assert_eq!(info.author.as_deref(), Some("Jane"));
        assert_eq!(info.license.as_deref(), Some("CreativeML Open RAIL++-M"));
        assert_eq!(
            info.architecture.as_deref(),
            Some("stable-diffusion-xl-v1-base/lora")
        );
        assert_eq!(info.resolution.as_deref(), Some("1024x1024"));
        assert_eq!(info.trigger_words, ["papercut", "paper art"]);
        assert_eq!(info.tags, ["style", "paper"]);
        assert_eq!(info.usage_hint.as_deref(), Some("weight 0.8"));
        assert_eq!(info.format.as_deref(), Some("pt"));
        assert_eq!(info.producer.as_deref(), Some("diffusers"));
        assert_eq!(info.training_tool, None);
        assert_eq!(
            info.sources.get("name").map(String::as_str),
            Some("modelspec.title")
        );
        let (flags, _) = check_metadata(&m);
        assert!(flags.is_empty(), "{flags:?}");
    }

    #[test]
    fn malformed_values_are_flagged_each_with_its_key() {
        let m = meta(&[
            ("ss_tag_frequency", "{not json"),
            ("ss_datasets", "{}"),
            ("ss_steps", "-3"),
            ("ss_resolution", "big"),
            ("format", "pt\u{0}"),
            ("modelspec.title", "x"),
        ]);
        let (flags, unlisted) = check_metadata(&m);
        assert_eq!(codes(&flags), ["metadata_malformed"; 6], "{flags:?}");
        let all: String = flags.iter().map(|f| f.message.clone() + "\n").collect();
        for needle in [
            "`ss_tag_frequency`",
            "`ss_datasets`: the value must be a JSON array",
            "`ss_steps`",
            "`ss_resolution`",
            "`format`: the value holds control character U+0000",
            "`modelspec.sai_model_spec`: missing, while 1 other",
        ] {
            assert!(all.contains(needle), "{needle} in {all}");
        }
        assert!(unlisted.is_empty());
        // "None" is kohya's way of writing an unset value, not a malformed one.
        assert!(check_metadata(&meta(&[("ss_steps", "None")])).0.is_empty());
    }

    #[test]
    fn look_alike_keys_are_spoofed_not_unlisted() {
        for key in [
            "Format",
            "format ",
            "f\u{200B}ormat",
            "fоrmat",
            "ｆｏｒｍａｔ",
            "SS_steps",
            "__metadata__\u{200D}",
        ] {
            let (flags, unlisted) = check_metadata(&meta(&[(key, "pt")]));
            assert_eq!(codes(&flags), ["metadata_spoofed"], "{key:?}: {flags:?}");
            assert!(unlisted.is_empty());
        }
        let (flags, unlisted) = check_metadata(&meta(&[("my_key", "1"), ("other", "2")]));
        assert_eq!(codes(&flags), ["metadata_unlisted_keys"]);
        assert_eq!(unlisted, ["my_key", "other"]);
        assert!(
            flags[0].message.contains("2 `__metadata__` keys"),
            "{}",
            flags[0].message
        );
    }
}
