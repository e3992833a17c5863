//! `safetensors-spark report PATH...`: the forensic report (spec/forensics.md §6) of files,
//! directories (recursive) and globs, as JSON lines or, on a terminal, a table.

use crate::shown;
use safetensors_spark_format::forensics::sharded::{self, ModelReport};
use safetensors_spark_format::forensics::{report_files, FileReport, Flag, Level, ReportOptions};
use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

struct Args {
    json: bool,
    hash: bool,
    jobs: usize,
    quiet: bool,
    paths: Vec<String>,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        json: false,
        hash: true,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        quiet: false,
        paths: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => out.json = true,
            "--no-hash" => out.hash = false,
            "--quiet" => out.quiet = true,
            "--jobs" => {
                let n = it.next().ok_or("--jobs needs a number")?;
                out.jobs = n
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("--jobs needs a number ≥ 1, got `{n}`"))?;
            }
            "--" => out.paths.extend(it.by_ref().cloned()),
            s if s.starts_with("--") => return Err(format!("unknown option `{s}`")),
            _ => out.paths.push(a.clone()),
        }
    }
    if out.paths.is_empty() {
        return Err("no PATH given".into());
    }
    Ok(out)
}

/// What the paths name: safetensors files and index files, each once, in the order found.
#[derive(Default)]
struct Found {
    files: Vec<PathBuf>,
    indexes: Vec<PathBuf>,
    /// [`identity`] of every file, index and directory taken.
    seen: HashSet<PathBuf>,
    problems: Vec<String>,
}

/// What makes two names of one file the same: its canonical path (symbolic links and `..`
/// resolved), or, when the name itself does not resolve (a dangling link or a link loop), the
/// canonical path of its directory and its name. A file reached by a second name (a glob's `**`
/// through a link to a directory above it, `lake` and `./lake`) is then taken once.
fn identity(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match (dir.canonicalize(), path.file_name()) {
        (Ok(d), Some(name)) => d.join(name),
        _ => path.to_path_buf(),
    }
}

impl Found {
    /// Takes `path` unless a name of the same file was taken before.
    fn first(&mut self, path: &Path) -> bool {
        self.seen.insert(identity(path))
    }

    fn add(&mut self, path: PathBuf, explicit: bool) {
        if sharded::is_index(&path) {
            if self.first(&path) {
                self.indexes.push(path);
            }
        } else if path.is_dir() {
            if self.first(&path) {
                self.walk(&path);
            }
        } else if (explicit || path.extension().is_some_and(|e| e == "safetensors"))
            && self.first(&path)
        {
            self.files.push(path);
        }
    }

    fn walk(&mut self, dir: &Path) {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                self.problems.push(format!("{}: {e}", dir.display()));
                return;
            }
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            // The walk rule of spec/reading.md §1: links are followed, but each directory is
            // entered and each file taken once, by its real path (`add` → `first`), so a link
            // loop ends at once and a second name of a file is not reported twice.
            self.add(p, false);
        }
    }

    fn arg(&mut self, arg: &str) {
        let path = PathBuf::from(arg);
        if path.exists() {
            self.add(path, true);
            return;
        }
        if arg.contains(['*', '?', '[']) {
            match glob::Pattern::new(arg) {
                Ok(pattern) => {
                    let mut matches = Vec::new();
                    let root = literal_prefix(Path::new(arg));
                    glob_walk(&root, &pattern, &mut HashSet::new(), &mut matches);
                    if matches.is_empty() {
                        self.problems
                            .push(format!("{arg}: no file matches this glob"));
                    }
                    for p in matches {
                        self.add(p, false);
                    }
                }
                Err(e) => self.problems.push(format!("{arg}: invalid glob: {e}")),
            }
        } else {
            self.problems
                .push(format!("{arg}: no such file or directory"));
        }
    }
}

/// The leading components of a glob that hold no wildcard: where its walk starts (empty: `.`).
fn literal_prefix(pattern: &Path) -> PathBuf {
    pattern
        .components()
        .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
        .collect()
}

/// The paths under `dir` (named as the glob names them) that `pattern` matches, in sorted order,
/// found under the walk rule of spec/reading.md §1: links are followed but each directory is
/// entered once, by its real path, so a glob's `**` through link loops ends (the `glob` crate's
/// own `**` follows every link and grows exponentially with two of them).
fn glob_walk(
    dir: &Path,
    pattern: &glob::Pattern,
    entered: &mut HashSet<PathBuf>,
    out: &mut Vec<PathBuf>,
) {
    let on_disk = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if !entered.insert(identity(on_disk)) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(on_disk) else {
        return;
    };
    let mut names: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..glob::MatchOptions::new()
    };
    for name in names {
        let path = dir.join(&name);
        if pattern.matches_path_with(&path, opts) {
            out.push(path.clone());
        }
        if path.is_dir() {
            glob_walk(&path, pattern, entered, out);
        }
    }
}

pub fn run(args: &[String], usage: &str) -> ExitCode {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "{}\n{usage}",
                shown(format_args!("safetensors-spark report: {e}"))
            );
            return ExitCode::from(2);
        }
    };
    let mut found = Found::default();
    for a in &args.paths {
        found.arg(a);
    }
    // Every shard an index names is reported, found by the walk or not.
    let indexes: Vec<_> = found
        .indexes
        .iter()
        .map(|p| (p.clone(), sharded::read_index(p)))
        .collect();
    for (p, index) in &indexes {
        if let Ok(index) = index {
            for shard in sharded::shard_paths(p, index) {
                if shard.is_file() && found.first(&shard) {
                    found.files.push(shard);
                }
            }
        }
    }
    let opts = ReportOptions { hash: args.hash };
    let bar = crate::progress::Bar::new("report", "files", args.quiet);
    let reports = report_files(&found.files, opts, args.jobs, &bar);
    let models: Vec<ModelReport> = indexes
        .iter()
        .map(|(p, index)| {
            sharded::model_report(p, index, |shard| {
                reports.iter().find(|r| Path::new(&r.path) == shard)
            })
        })
        .collect();

    let mut worst: Option<Level> = None;
    for r in &reports {
        worst = worst.max(r.worst());
    }
    for m in &models {
        worst = worst.max(m.flags.iter().map(|f| f.level).max());
    }
    for p in &found.problems {
        eprintln!("{}", shown(format_args!("safetensors-spark report: {p}")));
        worst = Some(Level::Error);
    }

    let stdout = std::io::stdout();
    let table = !args.json && stdout.is_terminal();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let written = if table {
        write_table(&mut out, &reports, &models)
    } else {
        write_json(&mut out, &reports, &models)
    };
    if let Err(e) = written.and_then(|()| out.flush()) {
        eprintln!("safetensors-spark report: cannot write the report: {e}");
        return ExitCode::from(2);
    }
    match worst {
        Some(Level::Error) => ExitCode::from(2),
        Some(Level::Warning) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    }
}

fn write_json(
    out: &mut impl Write,
    reports: &[FileReport],
    models: &[ModelReport],
) -> std::io::Result<()> {
    for r in reports {
        serde_json::to_writer(&mut *out, r)?;
        out.write_all(b"\n")?;
    }
    for m in models {
        serde_json::to_writer(&mut *out, m)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Writes one line of the table, escaped by [`shown`].
fn line(out: &mut impl Write, text: std::fmt::Arguments) -> std::io::Result<()> {
    writeln!(out, "{}", shown(text))
}

fn write_flags(out: &mut impl Write, flags: &[Flag]) -> std::io::Result<()> {
    for f in flags {
        line(
            out,
            format_args!("    {:<7} {:<26} {}", f.level, f.code, f.message),
        )?;
    }
    Ok(())
}

fn write_table(
    out: &mut impl Write,
    reports: &[FileReport],
    models: &[ModelReport],
) -> std::io::Result<()> {
    line(
        out,
        format_args!(
            "{:<9} {:>10} {:>8} {:>15} {:>6}  PATH",
            "VERDICT", "SIZE", "TENSORS", "PARAMETERS", "FLAGS"
        ),
    )?;
    for r in reports {
        let counts = (r.tensor_count, r.parameter_count, r.flags.len());
        write_row(out, r.verdict.name(), r.file_size, counts, &r.path)?;
        if let Some(h) = &r.sha256 {
            line(out, format_args!("    sha256  {h}"))?;
        }
        let info = &r.model_info;
        let named: Vec<String> = [
            ("name", info.name.as_deref()),
            ("base", info.base_model.as_deref()),
            ("arch", info.architecture.as_deref()),
            ("tool", info.training_tool.as_deref()),
            ("resolution", info.resolution.as_deref()),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect();
        if !named.is_empty() {
            line(out, format_args!("    model   {}", named.join("  ")))?;
        }
        if !info.trigger_words.is_empty() {
            line(
                out,
                format_args!("    trigger {}", info.trigger_words.join(", ")),
            )?;
        }
        write_flags(out, &r.flags)?;
    }
    for m in models {
        let counts = (m.tensor_count, m.parameter_count, m.flags.len());
        let path = format!("{} (model, {} shards)", m.path, m.shards.len());
        write_row(out, m.verdict.name(), m.data_bytes, counts, &path)?;
        write_flags(out, &m.flags)?;
    }
    Ok(())
}

/// One row of the table: verdict, size, (tensors, parameters, flags), path.
fn write_row(
    out: &mut impl Write,
    verdict: &str,
    size: u64,
    (tensors, parameters, flags): (u64, u64, usize),
    path: &str,
) -> std::io::Result<()> {
    line(
        out,
        format_args!(
            "{verdict:<9} {:>10} {tensors:>8} {parameters:>15} {flags:>6}  {path}",
            human(size)
        ),
    )
}
