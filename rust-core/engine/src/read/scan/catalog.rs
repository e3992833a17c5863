//! Which files belong to the scan and what is known about them (manifests, headers, exclusions).

use super::*;
pub(super) struct ParsedManifest<'a> {
    pub(super) dir: String,
    pub(super) manifest: Manifest,
    /// Every listed shard was listed by the JVM with the listed length.
    pub(super) consistent: bool,
    pub(super) input: &'a ManifestInput,
    /// `shards[].file` → position in `shards`.
    pub(super) shard_at: HashMap<String, usize>,
}

pub(super) struct Entry<'a> {
    pub(super) input: &'a FileInput,
    /// The consistent manifest listing this file and the file's index in its `shards`.
    pub(super) shard: Option<(usize, usize)>,
    pub(super) header: Option<Header>,
}

pub(super) struct Catalog<'a> {
    pub(super) manifests: Vec<ParsedManifest<'a>>,
    /// Included files, sorted by URI.
    pub(super) files: Vec<Entry<'a>>,
    pub(super) excluded: Vec<Excluded>,
    /// [`ScanInput::file_layout_max_tensors`].
    pub(super) file_layout_max_tensors: u64,
}

pub(super) fn split_uri(uri: &str) -> (&str, &str) {
    uri.rsplit_once('/').unwrap_or(("", uri))
}

/// `per_file`: the scan's layout is `file`, whose limit on tensors per file
/// ([`ScanInput::file_layout_max_tensors`]) makes a file beyond it an error of that file.
pub(super) fn catalog(input: &ScanInput, per_file: bool) -> Result<Catalog<'_>, ReadError> {
    let mut manifests = Vec::with_capacity(input.manifests.len());
    for m in &input.manifests {
        let name = format!("{}/{MANIFEST_FILE_NAME}", m.dir);
        let manifest = parse_manifest(&m.text)
            .map_err(|e| ReadErrorKind::Manifest(e.to_string()).in_file(&name))?;
        let shard_at = manifest
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (s.shard_path.clone(), i))
            .collect();
        manifests.push(ParsedManifest {
            dir: m.dir.clone(),
            manifest,
            consistent: false,
            input: m,
            shard_at,
        });
    }
    let lengths: HashMap<&str, u64> = input
        .files
        .iter()
        .map(|f| (f.file.as_str(), f.length))
        .collect();
    let mut excluded = Vec::new();
    for m in &manifests {
        for s in &m.manifest.shards {
            let uri = format!("{}/{}", m.dir, s.shard_path);
            if !lengths.contains_key(uri.as_str()) {
                let e = ReadErrorKind::MissingShard {
                    manifest: format!("{}/{MANIFEST_FILE_NAME}", m.dir),
                }
                .in_file(&uri);
                if !input.ignore_missing {
                    return Err(e);
                }
                excluded.push(Excluded {
                    file: uri,
                    reason: e.to_string(),
                });
            }
        }
    }
    for m in &mut manifests {
        m.consistent =
            m.manifest.shards.iter().all(|s| {
                lengths.get(format!("{}/{}", m.dir, s.shard_path).as_str()) == Some(&s.bytes)
            });
    }
    let mut sorted: Vec<&FileInput> = input.files.iter().collect();
    sorted.sort_by(|a, b| a.file.cmp(&b.file));
    sorted.dedup_by(|a, b| a.file == b.file);
    let mut files = Vec::with_capacity(sorted.len());
    for f in sorted {
        let (dir, name) = split_uri(&f.file);
        let mut shard = None;
        // A dataset is its manifest's shards: a file deeper under a manifest's directory (a
        // stray copy in a subdirectory, a nested dataset, a path through a link back into the
        // directory) is never one of them, whoever listed it.
        if let Some(m) = manifests.iter().find(|m| {
            dir.strip_prefix(m.dir.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        }) {
            excluded.push(Excluded {
                file: f.file.clone(),
                reason: format!(
                    "in a subdirectory of the dataset {}, whose {MANIFEST_FILE_NAME} lists its \
                     shards (a dataset is its manifest's shards; shard paths have no directory)",
                    m.dir
                ),
            });
            continue;
        }
        if let Some((mi, m)) = manifests.iter().enumerate().find(|(_, m)| m.dir == dir) {
            match m.shard_at.get(name).copied() {
                // A published-only manifest decides membership; its shards' layout and
                // padding come from their headers.
                Some(si) => shard = (m.consistent && m.manifest.ext.is_some()).then_some((mi, si)),
                None => {
                    excluded.push(Excluded {
                        file: f.file.clone(),
                        reason: format!("not listed in {dir}/{MANIFEST_FILE_NAME}"),
                    });
                    continue;
                }
            }
        }
        let header = match (&f.header_error, &f.header) {
            (Some(msg), _) => Err(ReadErrorKind::Corrupt(msg.clone()).in_file(&f.file)),
            (None, Some(text)) => header::parse_header(text.as_bytes(), f.length)
                .map_err(|e| ReadErrorKind::Format(e).in_file(&f.file))
                .and_then(|h| {
                    let (count, limit) = (h.tensors.len() as u64, input.file_layout_max_tensors());
                    if per_file && count > limit {
                        Err(ReadErrorKind::TooManyColumns {
                            what: "",
                            count,
                            limit,
                        }
                        .in_file(&f.file))
                    } else {
                        Ok(Some(h))
                    }
                }),
            (None, None) => Ok(None),
        };
        match header {
            Ok(header) => files.push(Entry {
                input: f,
                shard,
                header,
            }),
            Err(e) if input.ignore_corrupt => excluded.push(Excluded {
                file: f.file.clone(),
                reason: e.to_string(),
            }),
            Err(e) => return Err(e),
        }
    }
    Ok(Catalog {
        manifests,
        files,
        excluded,
        file_layout_max_tensors: input.file_layout_max_tensors(),
    })
}

impl Catalog<'_> {
    pub(super) fn manifest_of(&self, e: &Entry) -> Option<(&Manifest, usize)> {
        e.shard
            .and_then(|(mi, si)| self.manifests.get(mi).map(|m| (&m.manifest, si)))
    }

    pub(super) fn resolve(&self, option: RowLayoutOption) -> Answer<RowLayout> {
        match option {
            RowLayoutOption::Sample => return Answer::Ready(RowLayout::Sample),
            RowLayoutOption::Tensor => return Answer::Ready(RowLayout::Tensor),
            RowLayoutOption::File => return Answer::Ready(RowLayout::File),
            RowLayoutOption::Auto => {}
        }
        if self.files.is_empty() && self.manifests.is_empty()
            || self
                .manifests
                .iter()
                // a published-only manifest (no layout) leaves it to the shards' headers
                .any(|m| m.manifest.mode() == Some(DatasetMode::Kv))
        {
            return Answer::Ready(RowLayout::Tensor);
        }
        let mut need = Vec::new();
        for e in &self.files {
            if self.manifest_of(e).is_some() {
                continue; // a consistent batch manifest lists it
            }
            match &e.header {
                None => need.push(e.input.file.clone()),
                Some(h) => {
                    let mode = h.metadata.as_ref().and_then(|m| m.get(LAYOUT_METADATA_KEY));
                    if mode.map(String::as_str) != Some("batch") {
                        return Answer::Ready(RowLayout::Tensor);
                    }
                }
            }
        }
        if need.is_empty() {
            Answer::Ready(RowLayout::Sample)
        } else {
            Answer::NeedHeaders(need)
        }
    }

    /// Files whose header is missing.
    pub(super) fn missing_headers<'e>(
        &self,
        files: impl Iterator<Item = &'e Entry<'e>>,
    ) -> Vec<String>
    where
        Self: 'e,
    {
        files
            .filter(|e| e.header.is_none())
            .map(|e| e.input.file.clone())
            .collect()
    }

    pub(super) fn headers(&self) -> Result<Vec<(&Entry<'_>, &Header)>, Vec<String>> {
        let need = self.missing_headers(self.files.iter());
        if !need.is_empty() {
            return Err(need);
        }
        Ok(self
            .files
            .iter()
            .filter_map(|e| e.header.as_ref().map(|h| (e, h)))
            .collect())
    }
}
