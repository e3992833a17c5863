//! `safetensors-spark`: look inside and validate safetensors files.
//!
//! ```text
//! safetensors-spark inspect FILE...   per file, JSON: metadata and each tensor's dtype, shape, offsets
//! safetensors-spark validate [--quiet] PATH...
//!                                     exit 0 if every file is valid, else 1; prints `FILE: <error>`;
//!                                     a dataset directory: every version in its manifest log
//!                                     (shards present, sizes, CRC-32C where recorded)
//! safetensors-spark history [--json] DATASET
//!                                     one line per version: time, operation, rows and bytes
//!                                     added/removed, writer (spec/dataset.md §5.8)
//! safetensors-spark report [--json] [--no-hash] [--jobs N] [--quiet] PATH...
//!                                     forensic report per file and per sharded checkpoint
//!                                     (spec/forensics.md); exit 0 clean, 1 warnings, 2 errors
//! safetensors-spark vacuum [--retention DURATION] [--allow-shorter-retention] [--dry-run] [--quiet] DATASET
//!                                     delete superseded shards outside the retention period
//!                                     (spec/dataset.md §5.8.1; local paths); JSON plan on stdout
//! safetensors-spark compact [--batch-size N | --target-shard-size-mb M] [--partition K=V]...
//!                           [--message TEXT] [--dry-run] [--quiet] DATASET
//!                                     merge small shards into full ones as one `compaction`
//!                                     version per dataset (spec/dataset.md §5.8.2; local paths)
//! safetensors-spark delete (--keys FILE | --rows FILE) [--message TEXT] [--dry-run] DATASET
//!                                     delete a KV dataset's keys or a batch dataset's rows
//!                                     (SHARD ROW lines) as one `delete` version (§5.11)
//! ```
//!
//! `report`, `validate`, `vacuum` and `compact` draw a progress bar on stderr when it is a
//! terminal (`--quiet`: never); see [`progress`].

mod delete;
mod progress;
mod report;

use safetensors_spark_dataset::versions::{format_ms, history_dir, validate_dir};
use safetensors_spark_format::file::read_header;
use safetensors_spark_format::forensics::metadata::escape;
use safetensors_spark_format::header::Header;
use serde_json::{json, Value};
use std::process::ExitCode;

const USAGE: &str = "usage: safetensors-spark inspect FILE...
       safetensors-spark validate [--quiet] FILE|DATASET...
       safetensors-spark history [--json] DATASET
       safetensors-spark report [--json] [--no-hash] [--jobs N] [--quiet] PATH...
       safetensors-spark vacuum [--retention DURATION] [--allow-shorter-retention] [--dry-run] [--quiet] DATASET
       safetensors-spark compact [--batch-size N | --target-shard-size-mb M] [--partition K=V]... [--message TEXT] [--dry-run] [--quiet] DATASET
       safetensors-spark delete (--keys FILE | --rows FILE) [--message TEXT] [--dry-run] DATASET
--quiet: no progress bar (drawn on stderr only when it is a terminal)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((cmd, files)) if cmd == "inspect" && !files.is_empty() => inspect(files),
        Some((cmd, args)) if cmd == "validate" => validate(args),
        Some((cmd, rest)) if cmd == "report" => report::run(rest, USAGE),
        Some((cmd, rest)) if cmd == "vacuum" => vacuum(rest),
        Some((cmd, rest)) if cmd == "compact" => compact(rest),
        Some((cmd, rest)) if cmd == "delete" => delete::run(rest, USAGE),
        Some((cmd, rest)) if cmd == "history" => history(rest),
        Some((cmd, _)) if cmd == "--help" || cmd == "-h" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// One line of human output (a table row, `validate`'s verdict, an error on stderr) with its
/// control and invisible characters written as `\u{…}`: a file name or `__metadata__` value
/// holding an escape sequence, a carriage return, a newline or a bidi override reaches the
/// terminal as text, and cannot recolour it, overwrite a line or forge an `ok` line. Every human
/// line goes through here; JSON output does not (serde_json escapes control characters itself).
fn shown(line: std::fmt::Arguments) -> String {
    escape(&line.to_string())
}

/// Prints a command's outcome as pretty JSON on stdout (exit 0), or its error on stderr prefixed
/// by the command's name (exit 1).
fn print_outcome<T: serde::Serialize, E: std::fmt::Display>(
    what: &str,
    out: Result<T, E>,
) -> ExitCode {
    let text = out
        .map_err(|e| shown(format_args!("{what}: {e}")))
        .and_then(|o| serde_json::to_string_pretty(&o).map_err(|e| e.to_string()));
    match text {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn describe(path: &str, header: &Header) -> Value {
    let tensors: Vec<Value> = header
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "dtype": t.dtype.name(),
                "shape": t.shape,
                "data_offsets": t.data_offsets,
            })
        })
        .collect();
    json!({
        "file": path,
        "header_size": header.header_len,
        "file_size": header.file_len(),
        "metadata": header.metadata,
        "tensors": tensors,
    })
}

fn inspect(files: &[String]) -> ExitCode {
    let mut ok = true;
    for path in files {
        match read_header(path) {
            Ok(header) => match serde_json::to_string_pretty(&describe(path, &header)) {
                Ok(text) => println!("{text}"),
                Err(e) => {
                    eprintln!("{}", shown(format_args!("{path}: {e}")));
                    ok = false;
                }
            },
            Err(e) => {
                eprintln!("{}", shown(format_args!("{path}: {e}")));
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn history(args: &[String]) -> ExitCode {
    let json = args.iter().any(|a| a == "--json");
    let rest: Vec<&String> = args.iter().filter(|a| *a != "--json").collect();
    let [dir] = rest.as_slice() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rows = match history_dir(std::path::Path::new(dir.as_str())) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("{}", shown(format_args!("{dir}: {e}")));
            return ExitCode::FAILURE;
        }
    };
    if json {
        match serde_json::to_string_pretty(&rows) {
            Ok(t) => println!("{t}"),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    println!("version  committed_at                 operation     rows +/-            bytes +/-             writer");
    for r in rows {
        let op = r
            .operation
            .and_then(|o| serde_json::to_value(o).ok())
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "-".to_string());
        let mut writer = r.created_by.clone().unwrap_or_default();
        if let Some(a) = &r.app_id {
            writer.push_str(&format!(" app={a}"));
        }
        if let Some(m) = &r.commit_message {
            writer.push_str(&format!(" message={m:?}"));
        }
        println!(
            "{}",
            shown(format_args!(
                "{:<8} {:<28} {:<13} +{}/-{:<12} +{}/-{:<14} {}",
                r.version,
                format_ms(r.committed_at_ms),
                op,
                r.rows_added,
                r.rows_removed,
                r.bytes_added,
                r.bytes_removed,
                writer
            ))
        );
    }
    ExitCode::SUCCESS
}

/// `validate DATASET`: every version in the log; true when all are as written.
fn validate_dataset(dir: &str, quiet: bool) -> bool {
    let bar = progress::Bar::new("validate", "shards", quiet);
    match validate_dir(std::path::Path::new(dir), &bar) {
        Ok(checks) => {
            let mut ok = true;
            for c in checks {
                match &c.error {
                    None => println!(
                        "{}",
                        shown(format_args!(
                            "{dir}: version {}: ok ({} shards, {} with CRC-32C verified)",
                            c.version, c.shards, c.verified
                        ))
                    ),
                    Some(e) => {
                        ok = false;
                        println!("{}", shown(format_args!("{dir}: {e}")));
                    }
                }
            }
            ok
        }
        Err(e) => {
            println!("{}", shown(format_args!("{dir}: {e}")));
            false
        }
    }
}

fn validate(args: &[String]) -> ExitCode {
    use safetensors_spark_format::progress::{FinishOnDrop, Progress};
    let (quiet, files) = progress::take_quiet(args);
    if files.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let is_dir = |p: &String| std::path::Path::new(p).is_dir();
    // one bar for the files (each header read and checked); each dataset draws its own
    let bar = progress::Bar::new("validate", "files", quiet);
    bar.start(files.iter().filter(|p| !is_dir(p)).count() as u64, 0);
    let _finish = FinishOnDrop(&bar);
    let mut ok = true;
    for path in &files {
        if is_dir(path) {
            ok &= bar.suspend(|| validate_dataset(path, quiet));
            continue;
        }
        let line = match read_header(path) {
            Ok(h) => shown(format_args!(
                "{path}: ok ({} tensors, {} bytes)",
                h.tensors.len(),
                h.file_len()
            )),
            Err(e) => {
                ok = false;
                shown(format_args!("{path}: {e}"))
            }
        };
        bar.suspend(|| println!("{line}"));
        bar.advance(1, 0);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `compact`: spec/dataset.md §5.8.2 on a local dataset (or the chosen partitions of a
/// `partitionBy` root). Prints one JSON outcome per dataset directory. Exit 0 done (or dry run,
/// or nothing to merge), 1 on an error (printed; nothing of that dataset committed), 2 on a
/// usage error.
fn compact(args: &[String]) -> ExitCode {
    use safetensors_spark_dataset::compaction::local::{
        compact_path, write_index_part, CompactionOptions,
    };
    let mut quiet = false;
    let mut opts = CompactionOptions::default();
    let (mut partitions, mut dir) = (Vec::new(), None);
    let mut it = args.iter();
    let number = |flag: &str, v: Option<&String>| -> Result<u64, ExitCode> {
        match v.map(|v| (v, v.parse::<u64>())) {
            Some((_, Ok(n))) => Ok(n),
            Some((v, Err(_))) => {
                eprintln!(
                    "{}",
                    shown(format_args!("{flag} '{v}': expected a whole number"))
                );
                Err(ExitCode::from(2))
            }
            None => {
                eprintln!("{flag} needs a value");
                Err(ExitCode::from(2))
            }
        }
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dry-run" => opts.dry_run = true,
            "--quiet" => quiet = true,
            "--batch-size" => match number(a, it.next()) {
                Ok(n) => opts.request.batch_size = Some(n),
                Err(c) => return c,
            },
            "--target-shard-size-mb" => match number(a, it.next()) {
                Ok(n) => opts.request.target_shard_size_mb = Some(n),
                Err(c) => return c,
            },
            "--partition" => match it.next() {
                Some(p) => partitions.push(p.clone()),
                None => {
                    eprintln!("--partition needs column=value");
                    return ExitCode::from(2);
                }
            },
            "--message" => match it.next() {
                Some(m) => opts.commit_message = Some(m.clone()),
                None => {
                    eprintln!("--message needs a text");
                    return ExitCode::from(2);
                }
            },
            _ if dir.is_none() && !a.starts_with("--") => dir = Some(a.clone()),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    // Test hook (tests/python/test_compaction.py races a real Spark append against this
    // process): with SAFETENSORS_SPARK_TEST_COMPACT_PAUSE=F set, once the new shards are in
    // place the command creates F.ready and waits (at most 10 minutes) until F exists.
    let pause =
        std::env::var_os("SAFETENSORS_SPARK_TEST_COMPACT_PAUSE").map(std::path::PathBuf::from);
    let mut hold = |_: &safetensors_spark_dataset::compaction::CompactionPlan| {
        if let Some(go) = &pause {
            let mut ready = go.clone().into_os_string();
            ready.push(".ready");
            let _ = std::fs::write(&ready, b"");
            for _ in 0..6000 {
                if go.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    };
    let bar = progress::Bar::new("compact", "shards", quiet);
    let out = compact_path(
        std::path::Path::new(&dir),
        &partitions,
        &opts,
        Some(write_index_part),
        &mut hold,
        &bar,
    );
    print_outcome("compact", out)
}

/// `vacuum`: spec/dataset.md §5.8.1 on a local dataset directory. Exit 0 done (or dry run), 1 on
/// an error (printed, nothing more deleted), 2 on a usage error.
fn vacuum(args: &[String]) -> ExitCode {
    use safetensors_spark_dataset::local::{now_ms, vacuum_dir};
    use safetensors_spark_dataset::vacuum::{parse_retention, VacuumRequest, RETENTION_EXPECTED};
    let mut quiet = false;
    let mut req = VacuumRequest::default();
    let (mut dry_run, mut dir) = (false, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dry-run" => dry_run = true,
            "--quiet" => quiet = true,
            "--allow-shorter-retention" => req.allow_shorter_retention = true,
            "--retention" => {
                let Some(v) = it.next() else {
                    eprintln!("--retention needs a value: {RETENTION_EXPECTED}");
                    return ExitCode::from(2);
                };
                let Some(s) = parse_retention(v) else {
                    eprintln!(
                        "{}",
                        shown(format_args!(
                            "--retention '{v}': expected {RETENTION_EXPECTED}"
                        ))
                    );
                    return ExitCode::from(2);
                };
                req.retention_seconds = Some(s);
            }
            _ if dir.is_none() && !a.starts_with("--") => dir = Some(a.clone()),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    req.now_ms = now_ms();
    let bar = progress::Bar::new("vacuum", "files", quiet);
    print_outcome(
        "vacuum",
        vacuum_dir(std::path::Path::new(&dir), &req, dry_run, &mut |_| {}, &bar),
    )
}
