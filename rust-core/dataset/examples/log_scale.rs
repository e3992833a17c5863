//! Synthetic commits for the scale benchmark (jvm-connector/bench/scale.sh; not a user tool).
//!
//!     cargo run --release -p safetensors-spark-dataset --example log_scale -- \
//!         --template T --dir D [--first-shards N] --versions V [--measure-at 100,1000] \
//!         [--samples K] [--snapshot]
//!
//! `T` is a real dataset of one version holding one shard (written by Spark). `D` gets version 1
//! with `N` shards (default 1), then appends of one shard each until it has `V` versions. Every
//! shard is a hard link of a copy of `T`'s shard (in `D.links/`) under a new shard name (same
//! bytes, so its size and CRC-32C in the manifest stay right), every version a real commit through the stable entry
//! points of `dataset::local` (`latest_manifest`, `commit_version`, `publish_version`): the log
//! entry is whatever the commit layer writes. A `D` that already holds a dataset is continued.
//!
//! The commits in between are not published (that is what makes 10,000 versions quick to build);
//! the last `K` commits before each point of `--measure-at` are timed as a writer that knows what
//! it adds makes them: (a) `latest_head` (the newest version found by probing from the version
//! the writer committed before, and its own fields read from its log entry), the next version's
//! fields and `commit_changes` (the entry, and the chores when due); (b) `publish_changes` (the
//! whole manifest: `dataset_manifest.json` of the base with the change applied, replaced). After
//! each point one JSON object per line on stdout: the times, the bytes and files in
//! `_manifest_log/`, the size of `dataset_manifest.json`. `--snapshot` keeps a copy of `D` at
//! each point as `D.v<point>` (`cp -al`: hard links; log entries and shards are never rewritten in
//! place and the manifest is replaced by rename, so the copies stay as they were).

use safetensors_spark_dataset::commit::{Changes, Head};
use safetensors_spark_dataset::local::{
    commit_changes, commit_version, latest_head, latest_manifest, now_ms, publish_changes,
    publish_version,
};
use safetensors_spark_dataset::manifest::{Manifest, ManifestShard, Operation};
use safetensors_spark_dataset::names::{shard_file_name, MANIFEST_FILE_NAME, MANIFEST_LOG_DIR};
use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

type Res<T> = Result<T, Box<dyn Error>>;

struct Args {
    template: PathBuf,
    dir: PathBuf,
    first_shards: u64,
    versions: u64,
    measure_at: Vec<u64>,
    samples: u64,
    snapshot: bool,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        template: PathBuf::new(),
        dir: PathBuf::new(),
        first_shards: 1,
        versions: 1,
        measure_at: Vec::new(),
        samples: 5,
        snapshot: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--snapshot" {
            a.snapshot = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--template" => a.template = value.into(),
            "--dir" => a.dir = value.into(),
            "--first-shards" => a.first_shards = value.parse()?,
            "--versions" => a.versions = value.parse()?,
            "--samples" => a.samples = value.parse()?,
            "--measure-at" => {
                a.measure_at = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    if a.template.as_os_str().is_empty() || a.dir.as_os_str().is_empty() {
        return Err("--template and --dir are required".into());
    }
    if a.first_shards == 0 || a.versions == 0 || a.samples == 0 {
        return Err("--first-shards, --versions and --samples must be at least 1".into());
    }
    a.measure_at.sort_unstable();
    Ok(a)
}

/// A new shard: a hard link of a copy of the template's shard file under a fresh shard name.
/// A file system bounds the links to one file (ext4: 65,000), so every [`LINKS_PER_SOURCE`]
/// shards link to their own copy, kept in `<dir>.links/` (the `cp -al` copies of the dataset
/// that the benchmark makes add one link each).
struct ShardMaker {
    file: PathBuf,
    sources: PathBuf,
    entry: ManifestShard,
}

const LINKS_PER_SOURCE: u64 = 10_000;

impl ShardMaker {
    fn make(&self, dir: &Path, i: u64, write_id: &str) -> Res<ManifestShard> {
        let partition = (i % 100_000) as u32;
        let name = shard_file_name(partition, (i / 100_000) as u32, write_id);
        let source = self
            .sources
            .join(format!("src-{}.safetensors", i / LINKS_PER_SOURCE));
        if !source.exists() {
            fs::create_dir_all(&self.sources)?;
            fs::copy(&self.file, &source)?;
        }
        fs::hard_link(&source, dir.join(&name))?;
        Ok(ManifestShard {
            shard_path: name,
            partition: Some(partition),
            ..self.entry.clone()
        })
    }
}

/// The next version's own fields on top of `base`: `changes` applied, as an append stamps it
/// (operation append, the commit time; the writer's message and app id cleared).
fn next_of(base: &Head, changes: &Changes) -> Res<Manifest> {
    let mut next = base
        .next_fields(changes)
        .ok_or("the change removes more than the base holds")?;
    let x = next
        .ext
        .as_mut()
        .ok_or("the template is not this connector's dataset")?;
    x.operation = Some(Operation::Append);
    x.committed_at_ms = Some(now_ms());
    x.commit_message = None;
    x.app_id = None;
    x.vacuumed = None;
    Ok(next)
}

fn dir_bytes(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut files) = (0, 0);
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if let Ok(m) = e.metadata() {
                if m.is_file() {
                    bytes += m.len();
                    files += 1;
                }
            }
        }
    }
    (bytes, files)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run() -> Res<()> {
    let a = parse_args()?;
    let template = latest_manifest(&a.template)?.ok_or("the template holds no dataset")?;
    let [entry] = template.shards.as_slice() else {
        return Err("the template must hold exactly one shard".into());
    };
    let maker = ShardMaker {
        file: a.template.join(&entry.shard_path),
        sources: PathBuf::from(format!("{}.links", a.dir.display())),
        entry: entry.clone(),
    };
    fs::create_dir_all(&a.dir)?;
    let id = format!("bench-{}", std::process::id());
    let start = Instant::now();
    let (mut version, mut next_shard) = match latest_manifest(&a.dir)? {
        Some(m) => (m.manifest_version(), m.shards.len() as u64),
        None => {
            let write_id = uuid::Uuid::new_v4().to_string();
            let mut first = template.clone();
            first.shards = (0..a.first_shards)
                .map(|i| maker.make(&a.dir, i, &write_id))
                .collect::<Res<_>>()?;
            first
                .shards
                .sort_by(|a, b| a.shard_path.as_bytes().cmp(b.shard_path.as_bytes()));
            first.recompute_totals();
            let x = first
                .ext
                .as_mut()
                .ok_or("the template is not this connector's dataset")?;
            x.manifest_version = 1;
            x.operation = Some(Operation::Create);
            x.committed_at_ms = Some(now_ms());
            if !commit_version(&a.dir, None, &first, &id)? {
                return Err("version 1 exists already".into());
            }
            publish_version(&a.dir, &first, &id)?;
            (1, a.first_shards)
        }
    };
    let mut timed: Vec<(f64, f64, f64)> = Vec::new();
    while version < a.versions {
        let v = version + 1;
        let point = a.measure_at.iter().copied().find(|p| *p >= v);
        let measured = point.is_some_and(|p| p - v < a.samples);
        let write_id = uuid::Uuid::new_v4().to_string();
        let changes = Changes {
            add: vec![maker.make(&a.dir, next_shard, &write_id)?],
            remove: Vec::new(),
        };
        if measured && timed.is_empty() {
            // the window starts from a published dataset, as a writer finds it
            publish_version(
                &a.dir,
                &latest_manifest(&a.dir)?.ok_or("the dataset vanished")?,
                &id,
            )?;
        }
        let t0 = Instant::now();
        let base = latest_head(&a.dir, Some(version))?.ok_or("the dataset vanished")?;
        let t_read = t0.elapsed().as_secs_f64();
        let next = next_of(&base, &changes)?;
        if !commit_changes(&a.dir, Some(&base), &next, &changes, &id)? {
            return Err(format!("version {v} exists already").into());
        }
        let t_commit = t0.elapsed().as_secs_f64();
        if measured {
            let t1 = Instant::now();
            publish_changes(&a.dir, version, &next, &changes, &id)?;
            timed.push((t_read, t_commit, t1.elapsed().as_secs_f64()));
        }
        version = v;
        next_shard += 1;
        if point == Some(v) {
            report(&a, &mut timed, start.elapsed().as_secs_f64())?;
            timed.clear();
        }
    }
    let last = latest_manifest(&a.dir)?.ok_or("the dataset vanished")?;
    publish_version(&a.dir, &last, &id)?;
    if !a.measure_at.contains(&version) {
        report(&a, &mut timed, start.elapsed().as_secs_f64())?;
    }
    Ok(())
}

fn report(a: &Args, timed: &mut [(f64, f64, f64)], build_s: f64) -> Res<()> {
    let m = latest_manifest(&a.dir)?.ok_or("the dataset vanished")?;
    let (log_bytes, log_files) = dir_bytes(&a.dir.join(MANIFEST_LOG_DIR));
    let manifest_bytes = fs::metadata(a.dir.join(MANIFEST_FILE_NAME))
        .map(|m| m.len())
        .unwrap_or(0);
    let mut read: Vec<f64> = timed.iter().map(|t| t.0).collect();
    let mut commit: Vec<f64> = timed.iter().map(|t| t.1).collect();
    let mut publish: Vec<f64> = timed.iter().map(|t| t.2).collect();
    let mut out = serde_json::json!({
        "versions": m.manifest_version(),
        "shards": m.shards.len(),
        "log_bytes": log_bytes,
        "log_files": log_files,
        "manifest_bytes": manifest_bytes,
        "build_s": build_s,
        "samples": timed.len(),
    });
    if !timed.is_empty() {
        out["read_base_s"] = median(&mut read).into();
        out["commit_s"] = median(&mut commit).into();
        out["publish_s"] = median(&mut publish).into();
        out["commit_s_all"] = timed.iter().map(|t| t.1).collect::<Vec<_>>().into();
    }
    println!("{out}");
    if a.snapshot {
        let copy = PathBuf::from(format!("{}.v{}", a.dir.display(), m.manifest_version()));
        let _ = fs::remove_dir_all(&copy);
        let st = std::process::Command::new("cp")
            .arg("-al")
            .arg(&a.dir)
            .arg(&copy)
            .status()?;
        if !st.success() {
            return Err(format!("cp -al {} {}: {st}", a.dir.display(), copy.display()).into());
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("log_scale: {e}");
        std::process::exit(1);
    }
}
