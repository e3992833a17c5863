//! Converts a file of raw little-endian elements with `safetensors_spark_format::convert`.
//!
//! ```text
//! cargo run --release --example convert_file -- <SRC_TYPE> <DST_DTYPE> <in.bin> <out.bin>
//! ```
//!
//! `SRC_TYPE` is one of `f64 f32 i64 i32 i16 i8 bool` (a `bool` is one byte, 0 or 1);
//! `DST_DTYPE` a writable safetensors dtype name (`F16`, `BF16`, `U8`, …). The output file gets the
//! converted little-endian bytes. Exit status: 0 on success, 1 on a conversion error (message on
//! stderr), 2 on bad usage or I/O errors. Used by `tests/python/test_conversions.py`.

use std::process::ExitCode;

use safetensors_spark_format::convert::{append_converted, Source, SourceType};
use safetensors_spark_format::Dtype;

/// Decodes `bytes` as little-endian `N`-byte elements.
fn decode<T, const N: usize>(bytes: &[u8], from_le: fn([u8; N]) -> T) -> Result<Vec<T>, String> {
    let (chunks, rest) = bytes.as_chunks::<N>();
    if !rest.is_empty() {
        return Err(format!(
            "input length {} is not a multiple of {N}",
            bytes.len()
        ));
    }
    Ok(chunks.iter().map(|&c| from_le(c)).collect())
}

fn run(args: &[String]) -> Result<Result<(), String>, String> {
    let [_, src, dst, input, output] = args else {
        return Err(
            "usage: convert_file <f64|f32|i64|i32|i16|i8|bool> <DTYPE> <in.bin> <out.bin>".into(),
        );
    };
    let src = SourceType::from_name(src).ok_or_else(|| format!("unknown source type {src:?}"))?;
    let dst = Dtype::from_name(dst).ok_or_else(|| format!("unknown dtype {dst:?}"))?;
    let bytes = std::fs::read(input).map_err(|e| format!("cannot read {input}: {e}"))?;
    let mut out = Vec::new();
    let result = match src {
        SourceType::F64 => append_converted(
            Source::F64(&decode(&bytes, f64::from_le_bytes)?),
            dst,
            &mut out,
        ),
        SourceType::F32 => append_converted(
            Source::F32(&decode(&bytes, f32::from_le_bytes)?),
            dst,
            &mut out,
        ),
        SourceType::I64 => append_converted(
            Source::I64(&decode(&bytes, i64::from_le_bytes)?),
            dst,
            &mut out,
        ),
        SourceType::I32 => append_converted(
            Source::I32(&decode(&bytes, i32::from_le_bytes)?),
            dst,
            &mut out,
        ),
        SourceType::I16 => append_converted(
            Source::I16(&decode(&bytes, i16::from_le_bytes)?),
            dst,
            &mut out,
        ),
        SourceType::I8 => append_converted(
            Source::I8(&decode(&bytes, i8::from_le_bytes)?),
            dst,
            &mut out,
        ),
        SourceType::Bool => {
            let bools = bytes
                .iter()
                .enumerate()
                .map(|(i, &b)| match b {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(format!("byte {i} is {b}, not a bool (0 or 1)")),
                })
                .collect::<Result<Vec<bool>, String>>()?;
            append_converted(Source::Bool(&bools), dst, &mut out)
        }
    };
    if let Err(e) = result {
        return Ok(Err(e.to_string()));
    }
    std::fs::write(output, &out).map_err(|e| format!("cannot write {output}: {e}"))?;
    Ok(Ok(()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(conversion)) => {
            eprintln!("conversion error: {conversion}");
            ExitCode::from(1)
        }
        Err(usage_or_io) => {
            eprintln!("{usage_or_io}");
            ExitCode::from(2)
        }
    }
}
