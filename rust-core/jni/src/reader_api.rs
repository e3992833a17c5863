//! Exports of `io.safetensors.spark.jni.NativeReader` (the Spark read path). spec/jni.md
//! documents every native: arguments, ownership of each address, threading and errors.
//!
//! Glue only: strings/JSON/byte arrays in, the read engine (`safetensors_spark_engine::read::scan` on the
//! driver, `safetensors_spark_engine::read::task` on executors) in the middle, JSON or Arrow C Data out.
//! Invalid requests become `IllegalArgumentException`, format/IO/data errors
//! `SafetensorsException`; every message names the file (and tensor) concerned.

use std::path::Path;

use ::jni::objects::{JByteArray, JClass, JLongArray, JObjectArray, JString};
use ::jni::sys::{jboolean, jint, jlong};
use ::jni::{Env, EnvUnowned};
use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{Array, RecordBatch, StructArray};

use super::{
    arg, failed, guard, handle_mut, into_handle, parse_json, take_handle, to_json, JniError,
};
use safetensors_spark_engine::read::scan::{
    self, DescribeRequest, PartitionSpec, PlanRequest, Predicate, RowLayoutOption, ScanInput,
};
use safetensors_spark_engine::read::task::ReadTask;
use safetensors_spark_format::header;

fn bytes_arg(env: &Env<'_>, b: &JByteArray<'_>, what: &str) -> Result<Vec<u8>, JniError> {
    if b.is_null() {
        return Err(JniError::invalid_argument(format!(
            "{what} must not be null"
        )));
    }
    Ok(env.convert_byte_array(b)?)
}

fn length_arg(length: jlong, what: &str) -> Result<u64, JniError> {
    u64::try_from(length)
        .map_err(|_| JniError::invalid_argument(format!("{what} {length} is negative")))
}

// ---- pure bodies (unit-tested without a JVM) -------------------------------------------------

/// `headerLength`: N of the 8-byte prefix, checked against the file length and the 100 MB cap.
pub fn header_length(file: &str, prefix: &[u8], file_len: u64) -> Result<jlong, JniError> {
    let n = header::check_prefix(prefix, file_len).map_err(|e| JniError::from(e).context(file))?;
    // check_prefix caps N at 100,000,000, so it fits a jlong.
    Ok(n as jlong)
}

pub fn describe_json(request: &str, texts: Option<Vec<String>>) -> Result<String, JniError> {
    let mut req: DescribeRequest = parse_json(request, "describe request")?;
    with_manifest_texts(&mut req.input, texts)?;
    to_json(&scan::describe(&req)?)
}

pub fn plan_json(request: &str, texts: Option<Vec<String>>) -> Result<String, JniError> {
    let mut req: PlanRequest = parse_json(request, "plan request")?;
    with_manifest_texts(&mut req.input, texts)?;
    to_json(&scan::plan(&req)?)
}

/// The manifests' texts passed beside the request (`manifestTexts`, one per `manifests` entry,
/// in order), not escaped into its JSON: at 100,000 shards a manifest is 27 MB, and writing it
/// into the request and parsing it back out was a large part of planning such a scan.
fn with_manifest_texts(input: &mut ScanInput, texts: Option<Vec<String>>) -> Result<(), JniError> {
    let Some(texts) = texts else {
        return Ok(());
    };
    if texts.len() != input.manifests.len() {
        return Err(JniError::invalid_argument(format!(
            "manifestTexts has {} texts for {} manifests",
            texts.len(),
            input.manifests.len()
        )));
    }
    for (m, text) in input.manifests.iter_mut().zip(texts) {
        m.text = text;
    }
    Ok(())
}

/// A nullable `String[]` argument (no element may be null).
fn texts_arg(
    env: &mut Env<'_>,
    array: &JObjectArray<'_, JString<'_>>,
    what: &str,
) -> Result<Option<Vec<String>>, JniError> {
    if array.is_null() {
        return Ok(None);
    }
    let n = array.len(env)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let s: JString = array.get_element(env, i)?;
        out.push(arg(env, &s, what)?);
    }
    Ok(Some(out))
}

/// `indexEntries`: the [`scan::IndexSummary`] JSON of a dataset directory's
/// `_tensor_index.parquet` (all of its bytes) for the pushed predicates (a JSON array of
/// [`Predicate`]s). An invalid index is a `SafetensorsException` naming it.
pub fn index_entries_json(
    dir: &str,
    parquet: Vec<u8>,
    predicates: &str,
) -> Result<String, JniError> {
    let predicates: Vec<Predicate> = parse_json(predicates, "predicates")?;
    let summary = scan::index_summary(dir, bytes::Bytes::from(parquet), &predicates)?;
    to_json(&summary)
}

/// `indexPartLookup`: one step of a key lookup in the index part of `shard` (spec/dataset.md
/// §6.1): `ranges_json` (`[[start, length], ...]`) says where the bytes of `data` (concatenated)
/// lie in the part of `file_len` bytes. Answers `{"need": [[start, length], ...]}` (fetch those
/// too and ask again) or `{"summary": IndexSummary}`.
pub fn index_part_lookup_json(
    dir: &str,
    shard: &str,
    file_len: u64,
    ranges_json: &str,
    data: Vec<u8>,
    predicates: &str,
) -> Result<String, JniError> {
    let predicates: Vec<Predicate> = parse_json(predicates, "predicates")?;
    let ranges: Vec<(u64, u64)> = parse_json(ranges_json, "byte ranges")?;
    let data = bytes::Bytes::from(data);
    let mut file = safetensors_spark_dataset::index::SparseFile::new(file_len);
    let mut at = 0usize;
    for (start, len) in ranges {
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| JniError::invalid_argument("byte ranges exceed the data given"))?;
        file.add(start, data.slice(at..end));
        at = end;
    }
    let answer = scan::index_part_summary(dir, shard, &file, &predicates)?;
    to_json(&answer)
}

/// `indexPartName`: the index part's file name of shard `shard` (spec/dataset.md §6.1).
pub fn index_part_name(shard: &str) -> Result<String, JniError> {
    safetensors_spark_dataset::names::shard_index_part_file_name(shard)
        .ok_or_else(|| JniError::invalid_argument(format!("'{shard}' is not a shard file name")))
}

/// The native state behind a `NativeReader` handle.
pub struct ReaderHandle {
    task: ReadTask,
}

pub fn open_reader(partition_json: &str) -> Result<jlong, JniError> {
    let spec: PartitionSpec = parse_json(partition_json, "partition")?;
    Ok(into_handle(ReaderHandle {
        task: ReadTask::new(spec),
    }))
}

/// The read task behind `handle` and the index of its unit `unit` (checked against its units).
///
/// # Safety
/// As [`handle_mut`]: `handle` is a live reader handle and the Java owner serialises calls on it.
unsafe fn task_unit<'a>(handle: jlong, unit: jint) -> Result<(&'a mut ReadTask, usize), JniError> {
    // SAFETY: the caller keeps handle_mut's contract.
    let task = &mut unsafe { handle_mut::<ReaderHandle>(handle)? }.task;
    let units = task.unit_count();
    let i = usize::try_from(unit)
        .ok()
        .filter(|&u| u < units)
        .ok_or_else(|| {
            JniError::invalid_argument(format!(
                "unit {unit} out of range (the partition has {units} units)"
            ))
        })?;
    Ok((task, i))
}

/// Moves `batch` (as one Struct array) into the C Data structs at the given addresses.
///
/// # Safety
/// The addresses must point to writable, released (or freshly allocated) `ArrowArray` /
/// `ArrowSchema` structs; their old contents are overwritten without being released.
pub unsafe fn export_batch(
    batch: RecordBatch,
    array_addr: jlong,
    schema_addr: jlong,
) -> Result<(), JniError> {
    if array_addr == 0 || schema_addr == 0 {
        return Err(JniError::invalid_argument("Arrow C Data address is 0"));
    }
    let array = StructArray::from(batch);
    let (ffi_array, ffi_schema) = arrow_array::ffi::to_ffi(&array.to_data())
        .map_err(|e| failed(format!("cannot export the Arrow batch: {e}")))?;
    // SAFETY: per the contract, both addresses are valid for writes of these structs; the JVM
    // takes ownership (it calls their release callbacks when it closes the vectors).
    unsafe {
        std::ptr::write_unaligned(array_addr as *mut FFI_ArrowArray, ffi_array);
        std::ptr::write_unaligned(schema_addr as *mut FFI_ArrowSchema, ffi_schema);
    }
    Ok(())
}

/// `nextBatch`: the number of rows of the next batch, or -1 when the current unit is done.
/// A batch with columns is exported to the addresses; one without columns (`count()`) is not.
///
/// # Safety
/// `handle` as for [`handle_mut`]; addresses as for [`export_batch`].
pub unsafe fn next_batch(
    handle: jlong,
    array_addr: jlong,
    schema_addr: jlong,
) -> Result<jlong, JniError> {
    // SAFETY: per the contract of this function.
    let state = unsafe { handle_mut::<ReaderHandle>(handle)? };
    let Some(batch) = state.task.next_batch()? else {
        return Ok(-1);
    };
    let rows = batch.num_rows() as jlong;
    if batch.num_columns() > 0 {
        // SAFETY: per the contract of this function.
        unsafe { export_batch(batch, array_addr, schema_addr)? };
    }
    Ok(rows)
}

// ---- exports ---------------------------------------------------------------------------------

/// `static native long headerLength(String file, byte[] prefix, long fileLength)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_headerLength<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    file: JString<'local>,
    prefix: JByteArray<'local>,
    file_length: jlong,
) -> jlong {
    guard(&mut env, |env| {
        let file = arg(env, &file, "file")?;
        let prefix = bytes_arg(env, &prefix, "prefix")?;
        header_length(&file, &prefix, length_arg(file_length, "fileLength")?)
    })
}

/// `static native String validatedHeader(String file, byte[] prefixAndHeader, long fileLength)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_validatedHeader<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    file: JString<'local>,
    bytes: JByteArray<'local>,
    file_length: jlong,
) -> JString<'local> {
    guard(&mut env, |env| {
        let file = arg(env, &file, "file")?;
        let bytes = bytes_arg(env, &bytes, "prefixAndHeader")?;
        let len = length_arg(file_length, "fileLength")?;
        let text = scan::validated_header_text(&file, &bytes, len)?;
        Ok(env.new_string(text)?)
    })
}

/// `static native String describe(String requestJson, String[] manifestTextsOrNull)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_describe<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    request: JString<'local>,
    texts: JObjectArray<'local, JString<'local>>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let request = arg(env, &request, "requestJson")?;
        let texts = texts_arg(env, &texts, "manifestTexts")?;
        let answer = describe_json(&request, texts)?;
        Ok(env.new_string(answer)?)
    })
}

/// `static native String plan(String requestJson, String[] manifestTextsOrNull)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_plan<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    request: JString<'local>,
    texts: JObjectArray<'local, JString<'local>>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let request = arg(env, &request, "requestJson")?;
        let texts = texts_arg(env, &texts, "manifestTexts")?;
        let answer = plan_json(&request, texts)?;
        Ok(env.new_string(answer)?)
    })
}

/// `static native String indexEntries(String dir, byte[] parquet, String predicatesJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_indexEntries<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    dir: JString<'local>,
    parquet: JByteArray<'local>,
    predicates: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let dir = arg(env, &dir, "dir")?;
        let parquet = bytes_arg(env, &parquet, "parquet")?;
        let predicates = arg(env, &predicates, "predicatesJson")?;
        let answer = index_entries_json(&dir, parquet, &predicates)?;
        Ok(env.new_string(answer)?)
    })
}

/// `static native String indexPartLookup(String dir, String shard, long fileLength,
/// String rangesJson, byte[] data, String predicatesJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_indexPartLookup<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    dir: JString<'local>,
    shard: JString<'local>,
    file_len: jlong,
    ranges: JString<'local>,
    data: JByteArray<'local>,
    predicates: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let dir = arg(env, &dir, "dir")?;
        let shard = arg(env, &shard, "shard")?;
        let ranges = arg(env, &ranges, "rangesJson")?;
        let data = bytes_arg(env, &data, "data")?;
        let predicates = arg(env, &predicates, "predicatesJson")?;
        let file_len = u64::try_from(file_len)
            .map_err(|_| JniError::invalid_argument(format!("{shard}: negative file length")))?;
        let answer = index_part_lookup_json(&dir, &shard, file_len, &ranges, data, &predicates)?;
        Ok(env.new_string(answer)?)
    })
}

/// `static native String indexPartName(String shard)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_indexPartName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    shard: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let shard = arg(env, &shard, "shard")?;
        let name = index_part_name(&shard)?;
        Ok(env.new_string(name)?)
    })
}

/// `static native long open(String partitionJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_open<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    partition: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let partition = arg(env, &partition, "partitionJson")?;
        open_reader(&partition)
    })
}

/// `static native int unitCount(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_unitCount<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> jint {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let state = unsafe { handle_mut::<ReaderHandle>(handle)? };
        jint::try_from(state.task.unit_count())
            .map_err(|_| JniError::invalid_argument("too many units in one partition"))
    })
}

/// `static native String unitFile(long handle, int unit)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_unitFile<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    unit: jint,
) -> JString<'local> {
    guard(&mut env, |env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let (task, i) = unsafe { task_unit(handle, unit)? };
        let file = task.spec().units[i].file.clone();
        Ok(env.new_string(file)?)
    })
}

/// `static native long unitLength(long handle, int unit)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_unitLength<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    unit: jint,
) -> jlong {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let (task, i) = unsafe { task_unit(handle, unit)? };
        jlong::try_from(task.spec().units[i].length)
            .map_err(|_| JniError::invalid_argument("file length beyond 2^63"))
    })
}

/// `static native void openLocal(long handle, int unit, String path)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_openLocal<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    unit: jint,
    path: JString<'local>,
) {
    guard(&mut env, |env| {
        let path = arg(env, &path, "path")?;
        // SAFETY: the Java owner serialises calls on a live handle.
        let (task, i) = unsafe { task_unit(handle, unit)? };
        task.open_local(i, Path::new(&path)).map_err(JniError::from)
    })
}

/// `static native void openRemote(long handle, int unit, byte[] prefixAndHeader)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_openRemote<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    unit: jint,
    bytes: JByteArray<'local>,
) {
    guard(&mut env, |env| {
        let bytes = bytes_arg(env, &bytes, "prefixAndHeader")?;
        // SAFETY: the Java owner serialises calls on a live handle.
        let (task, i) = unsafe { task_unit(handle, unit)? };
        task.open_remote(i, &bytes).map_err(JniError::from)
    })
}

/// `static native long[] neededRanges(long handle)`: `[start0, end0, start1, end1, …]`.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_neededRanges<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> JLongArray<'local> {
    guard(&mut env, |env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let state = unsafe { handle_mut::<ReaderHandle>(handle)? };
        let ranges = state.task.needed_ranges()?;
        let flat: Vec<jlong> = ranges
            .iter()
            .flat_map(|r| [r.start as jlong, r.end as jlong])
            .collect();
        let array = env.new_long_array(flat.len())?;
        array.set_region(env, 0, &flat)?;
        Ok(array)
    })
}

/// `static native void supply(long handle, long start, byte[] bytes)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_supply<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    start: jlong,
    bytes: JByteArray<'local>,
) {
    guard(&mut env, |env| {
        let bytes = bytes_arg(env, &bytes, "bytes")?;
        let start = length_arg(start, "start")?;
        // SAFETY: the Java owner serialises calls on a live handle.
        let state = unsafe { handle_mut::<ReaderHandle>(handle)? };
        state.task.supply(start, bytes).map_err(JniError::from)
    })
}

/// `static native boolean verifyNeeded(long handle, int unit)`: the unit's file must be
/// streamed whole through `verifyUpdate` / `verifyFinish` before it is opened (read option
/// `verify_checksums`; local files are checked by `openLocal` itself).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_verifyNeeded<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    unit: jint,
) -> jboolean {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let (task, i) = unsafe { task_unit(handle, unit)? };
        task.verify_needed(i).map_err(JniError::from)
    })
}

/// `static native void verifyUpdate(long handle, int unit, byte[] bytes, int length)`: the
/// next `length` bytes of the unit's whole file, in order from offset 0.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_verifyUpdate<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    unit: jint,
    bytes: JByteArray<'local>,
    length: jint,
) {
    guard(&mut env, |env| {
        let bytes = bytes_arg(env, &bytes, "bytes")?;
        let n = usize::try_from(length)
            .ok()
            .filter(|&n| n <= bytes.len())
            .ok_or_else(|| {
                JniError::invalid_argument(format!(
                    "length {length} outside the {} bytes given",
                    bytes.len()
                ))
            })?;
        // SAFETY: the Java owner serialises calls on a live handle.
        let (task, i) = unsafe { task_unit(handle, unit)? };
        task.verify_update(i, &bytes[..n]).map_err(JniError::from)
    })
}

/// `static native void verifyFinish(long handle, int unit)`: the whole file was given; its size
/// and CRC-32C must be the manifest's (else a `SafetensorsException` naming the file).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_verifyFinish<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    unit: jint,
) {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let (task, i) = unsafe { task_unit(handle, unit)? };
        task.verify_finish(i).map_err(JniError::from)
    })
}

/// `static native long nextBatch(long handle, long arrowArrayAddr, long arrowSchemaAddr)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_nextBatch<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    array_addr: jlong,
    schema_addr: jlong,
) -> jlong {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner serialises calls on a live handle and passes freshly
        // allocated C Data structs.
        unsafe { next_batch(handle, array_addr, schema_addr) }
    })
}

/// `static native long bytesRead(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_bytesRead<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> jlong {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let state = unsafe { handle_mut::<ReaderHandle>(handle)? };
        Ok(jlong::try_from(state.task.bytes_read()).unwrap_or(jlong::MAX))
    })
}

/// `static native long skipped(long handle)`: units skipped as corrupt (`ignoreCorruptFiles`).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_skipped<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> jlong {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner serialises calls on a live handle.
        let state = unsafe { handle_mut::<ReaderHandle>(handle)? };
        Ok(state.task.skipped().len() as jlong)
    })
}

/// `static native void close(long handle)`: frees the handle; exactly once.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_close<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) {
    guard(&mut env, |_env| {
        // SAFETY: the Java owner calls close exactly once on a live handle.
        drop(unsafe { take_handle::<ReaderHandle>(handle)? });
        Ok(())
    })
}

/// `static native String layoutOption(String given)`: the `layout` read option by the engine's
/// rule (`RowLayoutOption::parse`): its value's name, or SafetensorsOptionsException naming the
/// values allowed.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_layoutOption<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    given: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let given = arg(env, &given, "given")?;
        let layout = RowLayoutOption::parse(&given).map_err(JniError::Options)?;
        Ok(env.new_string(layout.name())?)
    })
}

/// `static native String layoutOptionNames()`: the `layout` option's values, comma-separated.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeReader_layoutOptionNames<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> JString<'local> {
    guard(
        &mut env,
        |env| Ok(env.new_string(RowLayoutOption::names())?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifests' texts beside the request fill its `manifests` in order; a count that does
    /// not match is refused, naming both counts.
    #[test]
    fn manifest_texts_beside_the_request_fill_its_manifests() {
        let parsed: Result<ScanInput, _> = serde_json::from_str(
            r#"{"files": [], "manifests": [{"dir": "a"}, {"dir": "b", "text": "x"}]}"#,
        );
        assert!(parsed.is_ok(), "{parsed:?}");
        let Ok(mut input) = parsed else { return };
        let e = with_manifest_texts(&mut input, Some(vec!["1".into()]));
        assert!(
            matches!(&e, Err(JniError::InvalidArgument(m)) if m.contains("1 texts for 2 manifests")),
            "{e:?}"
        );
        assert!(with_manifest_texts(&mut input, None).is_ok());
        assert_eq!(input.manifests[1].text, "x");
        assert!(with_manifest_texts(&mut input, Some(vec!["1".into(), "2".into()])).is_ok());
        let texts: Vec<&str> = input.manifests.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(texts, ["1", "2"]);
    }

    #[test]
    fn bad_requests_are_invalid_arguments() {
        assert!(matches!(
            describe_json("{", None),
            Err(JniError::InvalidArgument(_))
        ));
        assert!(matches!(
            plan_json("[]", None),
            Err(JniError::InvalidArgument(_))
        ));
        assert!(matches!(
            open_reader("{\"layout\":\"sample\"}"),
            Err(JniError::InvalidArgument(_))
        ));
        // indexEntries: bad predicates are the caller's fault, a bad index a dataset error.
        assert!(matches!(
            index_entries_json("file:/d", vec![], "{"),
            Err(JniError::InvalidArgument(_))
        ));
        let bad = index_entries_json("file:/d", b"not parquet".to_vec(), "[]");
        assert!(
            matches!(&bad, Err(JniError::Dataset(m)) if m.contains("file:/d/_tensor_index.parquet")),
            "{bad:?}"
        );
    }

    #[test]
    fn header_length_names_the_file() {
        let prefix = 10u64.to_le_bytes();
        assert!(matches!(header_length("f", &prefix, 18), Ok(10)));
        match header_length("some/file.safetensors", &prefix, 12) {
            Err(JniError::Format(m)) => assert!(m.contains("some/file.safetensors"), "{m}"),
            other => unreachable!("{other:?}"),
        }
    }

    #[test]
    fn zero_handles_and_addresses_are_rejected() {
        // SAFETY: 0 is always rejected before any dereference.
        unsafe {
            assert!(matches!(
                next_batch(0, 1, 1),
                Err(JniError::InvalidArgument(_))
            ));
        }
    }
}
