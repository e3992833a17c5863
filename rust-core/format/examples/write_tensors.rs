//! Test tool for the cross-language checks: writes a safetensors file with the core writer.
//!
//! `write_tensors SPEC.json OUT.safetensors`, where SPEC is
//! `{"metadata": {..} | null, "tensors": [{"name", "dtype", "shape", "data_file"}]}` and each
//! `data_file` holds the tensor's raw little-endian bytes. Exits 1 with the error on stderr.

use safetensors_spark_format::file::write_file;
use safetensors_spark_format::header::TensorEntry;
use safetensors_spark_format::Dtype;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::ExitCode;

fn run(spec_path: &str, out: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(spec_path).map_err(|e| format!("{spec_path}: {e}"))?;
    let spec: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let metadata: Option<BTreeMap<String, String>> =
        serde_json::from_value(spec["metadata"].clone()).map_err(|e| e.to_string())?;
    let mut tensors = Vec::new();
    for t in spec["tensors"]
        .as_array()
        .ok_or("tensors must be an array")?
    {
        let name = t["name"].as_str().ok_or("name")?.to_string();
        let dtype_name = t["dtype"].as_str().ok_or("dtype")?;
        let dtype = Dtype::from_name(dtype_name).ok_or(format!("unknown dtype {dtype_name}"))?;
        let shape: Vec<u64> =
            serde_json::from_value(t["shape"].clone()).map_err(|e| e.to_string())?;
        let data_file = t["data_file"].as_str().ok_or("data_file")?;
        let data = std::fs::read(data_file).map_err(|e| format!("{data_file}: {e}"))?;
        tensors.push((TensorEntry { name, dtype, shape }, data));
    }
    let refs: Vec<(TensorEntry, &[u8])> = tensors
        .iter()
        .map(|(e, d)| (e.clone(), d.as_slice()))
        .collect();
    write_file(out, metadata.as_ref(), &refs).map_err(|e| e.to_string())?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, spec, out] = args.as_slice() else {
        eprintln!("usage: write_tensors SPEC.json OUT.safetensors");
        return ExitCode::from(2);
    };
    match run(spec, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
