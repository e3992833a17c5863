//! The native object-store client of the Python package (spec/python.md §2.1, "native client"):
//! S3 and S3-compatible endpoints through the Arrow project's `object_store` crate, on a tokio
//! runtime owned by this extension. Every call releases the GIL while its request runs, so the
//! package's read-ahead threads keep as many requests in flight as they are many, and the bytes
//! never pass through Python code (a range lands in one `bytearray`, a whole shard goes straight
//! into its file in the node cache).
//!
//! The client makes one attempt per call: retries are the package's `RetryPolicy` (the same for
//! this client and fsspec), which tells a lasting error from a transient one by the Python
//! exception raised here: `FileNotFoundError` (404), `PermissionError` (403, no or wrong
//! credentials), `TimeoutError`, else `OSError`. Every message names the object's URL.
//!
//! Fork: a DataLoader worker forked from a process that used a client inherits the memory of a
//! runtime whose threads do not exist in it. The runtime is per process (made again when the
//! process id changes, the parent's never touched nor dropped), and a client made in another
//! process is never used (`Client::check_process`: the Python side makes a new one) nor dropped
//! (its connection pool belongs to the parent's runtime).

use std::io::Write;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};
use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

/// This process's runtime: `(process id, runtime)`, leaked on purpose (never dropped: a forked
/// child must not join threads that only its parent has).
static RUNTIME: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);

fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    let pid = std::process::id();
    let mut guard = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, rt)) = *guard {
        if p == pid {
            return Ok(rt);
        }
    }
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("safetensors-spark-io")
        .enable_all()
        .build()
        .map_err(|e| {
            PyOSError::new_err(format!(
                "the native object-store client could not start its runtime: {e}"
            ))
        })?;
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(rt));
    *guard = Some((pid, rt));
    Ok(rt)
}

/// rustls's process-wide crypto provider (ring: no OpenSSL, no C toolchain beyond what `ring`
/// needs, so the aarch64 wheel cross-builds with zig); installed once.
fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err: another provider is installed already (by another library): it is used
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// An `object_store` error as the Python exception the package's retry rule classifies,
/// naming `url` and what was being done.
fn to_py(url: &str, what: &str, e: object_store::Error) -> PyErr {
    let msg = format!("{url}: {what}: {e}");
    match e {
        object_store::Error::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => PyPermissionError::new_err(msg),
        _ => {
            // the chain's text: reqwest's "operation timed out", hyper's "error reading a body"
            let mut text = msg.to_lowercase();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text.push_str(&s.to_string().to_lowercase());
                source = s.source();
            }
            if text.contains("timed out") || text.contains("timeout") {
                PyTimeoutError::new_err(msg)
            } else {
                PyOSError::new_err(msg)
            }
        }
    }
}

/// A `bytearray` of `len` bytes, not initialised (the caller fills every byte it keeps before
/// any Python code sees it).
fn fresh_buffer(py: Python<'_>, len: usize) -> PyResult<Bound<'_, PyByteArray>> {
    let n = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| PyValueError::new_err(format!("a range of {len} bytes is too large")))?;
    // SAFETY: a null source makes CPython allocate `n` bytes it does not initialise; the result
    // is a new reference (or null with the error set)
    let out = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyByteArray_FromStringAndSize(std::ptr::null(), n),
        )?
    };
    Ok(out.cast_into::<PyByteArray>()?)
}

/// Maps in every whole page of a fresh pooled buffer at once (`MADV_POPULATE_WRITE`, Linux ≥
/// 5.14): the kernel allocates them in one call instead of one page fault per 4 KiB as the body is
/// written (a fault costs ≈ 4–12 µs on a VM: spec/performance.md §13.7). Elsewhere, or when the
/// kernel refuses, the pages fault in as the body lands, as before.
fn populate(b: &Bound<'_, PyByteArray>) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the bytearray is this call's alone; only its own pages are advised
        let buf = unsafe { b.as_bytes_mut() };
        let page = 4096usize;
        let start = buf.as_mut_ptr() as usize;
        let first = start.div_ceil(page) * page;
        let end = (start + buf.len()) / page * page;
        if end > first {
            // SAFETY: [first, end) lies inside the buffer's allocation; the advice changes no byte
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    end - first,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = b;
}

/// `dst.copy_from_slice(src)` with non-temporal stores on x86-64 (AVX2 not needed: SSE2's
/// `movntdq`): the range buffer is read again only when a batch gathers from it, so its lines need
/// not be read for ownership nor kept in cache by this copy.
fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        if dst.len() >= 4096 {
            let head = dst.as_ptr().align_offset(16).min(dst.len());
            dst[..head].copy_from_slice(&src[..head]);
            let body = (dst.len() - head) / 16 * 16;
            // SAFETY: [head, head + body) is inside both slices; dst + head is 16-byte aligned
            unsafe {
                let d = dst.as_mut_ptr().add(head) as *mut __m128i;
                let s = src.as_ptr().add(head) as *const __m128i;
                for i in 0..body / 16 {
                    _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
                }
                _mm_sfence();
            }
            dst[head + body..].copy_from_slice(&src[head + body..]);
            return;
        }
    }
    dst.copy_from_slice(src);
}

/// Buffers a client keeps for its range GETs: at most this many, of at most this many bytes in
/// all (about a read-ahead window and a reader's recent shards: 4 + 8 shards of 16 MiB).
const POOL_BUFFERS: usize = 32;
const POOL_BYTES: usize = 256 << 20;
/// Smaller ranges (a shard's header, a manifest's) get a fresh buffer, never pooled: they would
/// push a shard's buffer out of the pool, and their page faults are few.
const POOL_MIN: usize = 1 << 20;

/// The range GETs' buffers of one client, reused (spec/performance.md §13.7). A range of a shard
/// is megabytes: landing in fresh memory it costs a page fault per 4 KiB (the kernel allocates
/// and zeroes each page), the largest CPU cost of a remote epoch once the bytes stopped being
/// copied in Python. A pooled `bytearray` is handed out again only when the pool holds its only
/// reference — no array, view, `memoryview` or read-ahead slot of it is left — so no byte anyone
/// can still see is ever overwritten; `(buffer, the size it was made with)`.
#[derive(Default)]
struct Buffers(Mutex<Vec<(Py<PyByteArray>, usize)>>);

impl Buffers {
    /// A `bytearray` of `len` bytes, contents unspecified (the caller overwrites them all before
    /// anyone sees them): a free pooled one whose memory holds `len` bytes without moving, else
    /// a fresh one (pooled while the pool has room or a free buffer of another size to replace).
    fn take<'py>(&self, py: Python<'py>, len: usize) -> PyResult<Bound<'py, PyByteArray>> {
        if len < POOL_MIN {
            return fresh_buffer(py, len);
        }
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut spare = None; // a free buffer of the wrong size: replaced by the new one
        for (i, (b, made)) in pool.iter().enumerate() {
            // SAFETY: the GIL is held; the count of a live object is read
            if unsafe { pyo3::ffi::Py_REFCNT(b.as_ptr()) } != 1 {
                continue; // someone still holds it (or a view of it)
            }
            // CPython resizes a bytearray in place down to half its allocation
            if len <= *made && len * 2 > *made + 1 {
                let b = b.bind(py).clone();
                b.resize(len)?;
                return Ok(b);
            }
            spare.get_or_insert(i);
        }
        let b = fresh_buffer(py, len)?;
        populate(&b);
        let pooled: usize = pool.iter().map(|(_, made)| made).sum();
        if let Some(i) = spare {
            if pooled - pool[i].1 + len <= POOL_BYTES {
                pool[i] = (b.clone().unbind(), len);
            }
        } else if pool.len() < POOL_BUFFERS && pooled + len <= POOL_BYTES {
            pool.push((b.clone().unbind(), len));
        }
        Ok(b)
    }
}

/// An S3 bucket (or an S3-compatible endpoint's) as the package reads it.
#[pyclass(
    frozen,
    module = "safetensors_spark._native",
    name = "ObjectStoreClient"
)]
pub struct Client {
    /// `None` only while dropped
    store: Option<Arc<dyn ObjectStore>>,
    /// `s3://bucket`, the start of every URL an error names
    base: String,
    pid: u32,
    buffers: Buffers,
}

impl Drop for Client {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // made in the parent before a fork: its pool belongs to the parent's runtime
            std::mem::forget(self.store.take());
        }
    }
}

impl Client {
    fn url(&self, key: &str) -> String {
        format!("{}/{key}", self.base)
    }

    /// The store, in the process that made it.
    fn store(&self) -> PyResult<Arc<dyn ObjectStore>> {
        self.check_process()?;
        self.store
            .as_ref()
            .map(Arc::clone)
            .ok_or_else(|| PyOSError::new_err(format!("{}: the client is closed", self.base)))
    }

    fn check_process(&self) -> PyResult<()> {
        if self.pid != std::process::id() {
            return Err(PyOSError::new_err(format!(
                "{}: this object-store client was made in process {} before a fork; make a new \
                 one in this process",
                self.base, self.pid
            )));
        }
        Ok(())
    }

    fn path(&self, key: &str) -> PyResult<ObjPath> {
        ObjPath::parse(key).map_err(|e| {
            PyValueError::new_err(format!("{}: not an object key: {e}", self.url(key)))
        })
    }

    fn block<T>(
        &self,
        py: Python<'_>,
        fut: impl std::future::Future<Output = PyResult<T>> + Send,
    ) -> PyResult<T>
    where
        T: Send,
    {
        self.check_process()?;
        let rt = runtime()?;
        py.detach(|| rt.block_on(fut))
    }

    /// [`Self::block`] with `fut` run as a task of the runtime, next to its connection's task: a
    /// response body's chunks go from one task to the other without waking the calling thread
    /// per chunk (a third of the runtime's CPU went to those wake-ups, spec/performance.md
    /// §13.6–13.7). `failed` names the request in the error of a task that panicked.
    fn block_on_task<T>(
        &self,
        py: Python<'_>,
        failed: &str,
        fut: impl std::future::Future<Output = PyResult<T>> + Send + 'static,
    ) -> PyResult<T>
    where
        T: Send + 'static,
    {
        self.block(py, async move {
            tokio::spawn(fut).await.map_err(|e| {
                PyOSError::new_err(format!("{failed}: the request's task failed: {e}"))
            })?
        })
    }
}

#[pymethods]
impl Client {
    /// A client of `bucket` (`scheme` is `s3`, the only one built in). `options`: `(key,
    /// value)` pairs of `object_store`'s S3 and client configuration (`access_key_id`,
    /// `secret_access_key`, `token`, `endpoint`, `region`, `skip_signature`, `allow_http`,
    /// `connect_timeout`, `read_timeout`, `timeout`, …), applied over the environment's
    /// (`AWS_*` variables; then the usual chain: web identity, container and instance
    /// credentials). A key it does not know is a `ValueError` naming it.
    #[new]
    fn new(scheme: &str, bucket: &str, options: Vec<(String, String)>) -> PyResult<Self> {
        if scheme != "s3" {
            return Err(PyValueError::new_err(format!(
                "{scheme}://{bucket}: the native object-store client reads s3:// only"
            )));
        }
        install_crypto();
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            // one attempt per call: the package's RetryPolicy retries, for this client as for fsspec
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            });
        for (k, v) in options {
            let key = AmazonS3ConfigKey::from_str(&k).map_err(|_| {
                PyValueError::new_err(format!(
                    "s3://{bucket}: the native object-store client has no option '{k}'"
                ))
            })?;
            b = b.with_config(key, v);
        }
        let store = b.build().map_err(|e| {
            PyValueError::new_err(format!(
                "s3://{bucket}: the native object-store client: {e}"
            ))
        })?;
        Ok(Client {
            store: Some(Arc::new(store)),
            base: format!("s3://{bucket}"),
            pid: std::process::id(),
            buffers: Buffers::default(),
        })
    }

    /// The process that made this client (a forked worker makes its own).
    #[getter]
    fn pid(&self) -> u32 {
        self.pid
    }

    /// Bytes `[start, end)` of object `key` as a `bytearray`, with the object's whole size
    /// (from the answer's `Content-Range`): `(data, size)`. One GET; the body is written
    /// straight into the `bytearray` as it arrives (one copy, no buffer in between). An answer
    /// cut short is an `OSError` (retried); an object that ends before `end` gives its bytes.
    fn get_range<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        start: u64,
        end: u64,
    ) -> PyResult<(Bound<'py, PyByteArray>, u64)> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = self.store()?;
        let what = format!("GET bytes [{start}, {end})");
        let len = usize::try_from(end.saturating_sub(start))
            .map_err(|_| PyValueError::new_err(format!("{url}: {what}: too large a range")))?;
        let out = self.buffers.take(py, len)?;
        // the bytearray is this call's (and the pool's) alone until it returns (no Python code
        // sees it while the GIL is released below): its buffer is written by the request's task
        // only, while this thread waits for the task to end
        let addr = unsafe { out.as_bytes_mut() }.as_mut_ptr() as usize;
        let failed = format!("{url}: {what}");
        let request = async move {
            let opts = GetOptions {
                range: Some(GetRange::Bounded(start..end)),
                ..GetOptions::default()
            };
            let r = store
                .get_opts(&path, opts)
                .await
                .map_err(|e| to_py(&url, &what, e))?;
            let size = r.meta.size;
            let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
            let mut at = 0usize;
            let mut stream = r.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| to_py(&url, &what, e))?;
                let Some(dst) = buf.get_mut(at..at + chunk.len()) else {
                    return Err(PyOSError::new_err(format!(
                        "{url}: {what}: the answer is longer than the {len} bytes asked for"
                    )));
                };
                copy_streaming(dst, &chunk);
                at += chunk.len();
            }
            if at != len && size >= end {
                return Err(PyOSError::new_err(format!(
                    "{url}: {what}: got {at} of the {len} bytes asked for (a transfer cut short)"
                )));
            }
            Ok((size, at))
        };
        let (size, got) = self.block_on_task(py, &failed, request)?;
        if got != len {
            out.resize(got)?; // an object shorter than the range: its bytes, and its size says so
        }
        Ok((out, size))
    }

    /// The whole object `key` as `bytes` (one GET).
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = self.store()?;
        let data = self.block(py, async move {
            let r = store.get(&path).await.map_err(|e| to_py(&url, "GET", e))?;
            r.bytes().await.map_err(|e| to_py(&url, "GET", e))
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// The whole object `key` written into file `local` (created or truncated), streamed;
    /// returns the bytes written. One GET. A failure leaves the file to the caller to remove.
    /// `writeback`: the kernel is asked to start writing each MiB to disk as it is written
    /// (`sync_file_range`, not waiting), so the caller's `fsync` of a node-cache copy has little
    /// left to flush: an `fsync` of a whole shard after the download held the fetch thread, and
    /// with it the link, idle (performance.md §13.6).
    #[pyo3(signature = (key, local, writeback = false))]
    fn download(&self, py: Python<'_>, key: &str, local: &str, writeback: bool) -> PyResult<u64> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = self.store()?;
        let local = local.to_string();
        let failed = format!("{url}: GET (whole object)");
        let download = async move {
            let what = "GET (whole object)";
            let r = store.get(&path).await.map_err(|e| to_py(&url, what, e))?;
            let mut file = std::fs::File::create(&local)?;
            // the body's chunks as they came, written together once 1 MiB is pending (one
            // `writev`): no copy into a buffer of our own before the kernel's (performance.md §13.7)
            let mut pending = Vec::new();
            let mut pending_len = 0usize;
            let mut stream = r.into_stream();
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| to_py(&url, what, e))?;
                n += chunk.len() as u64;
                pending_len += chunk.len();
                pending.push(chunk);
                if pending_len >= 1 << 20 {
                    write_chunks(&mut file, &mut pending)?;
                    if writeback {
                        start_writeback(&file, n - pending_len as u64, pending_len as u64);
                    }
                    pending_len = 0;
                }
            }
            write_chunks(&mut file, &mut pending)?;
            Ok(n)
        };
        // a task of the runtime, as a range read is (on the shaped link a chunk is a few KiB)
        self.block_on_task(py, &failed, download)
    }

    /// The size of object `key` (one HEAD); `FileNotFoundError` when there is none.
    fn head(&self, py: Python<'_>, key: &str) -> PyResult<u64> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = self.store()?;
        self.block(py, async move {
            Ok(store
                .head(&path)
                .await
                .map_err(|e| to_py(&url, "HEAD", e))?
                .size)
        })
    }

    /// The objects directly under `prefix` (a "directory"): `([(name, size, modified ms)],
    /// [sub-directory names])`, names without the prefix. As many LIST requests as 1,000-key
    /// pages.
    #[allow(clippy::type_complexity)]
    fn list(
        &self,
        py: Python<'_>,
        prefix: &str,
    ) -> PyResult<(Vec<(String, u64, i64)>, Vec<String>)> {
        let path = self.path(prefix)?;
        let url = self.url(prefix);
        let store = self.store()?;
        self.block(py, async move {
            let r = store
                .list_with_delimiter(Some(&path))
                .await
                .map_err(|e| to_py(&url, "LIST", e))?;
            let objects = r
                .objects
                .into_iter()
                .map(|o| {
                    let name = o.location.filename().unwrap_or_default().to_string();
                    (name, o.size, o.last_modified.timestamp_millis())
                })
                .collect();
            let dirs = r
                .common_prefixes
                .into_iter()
                .map(|p| p.filename().unwrap_or_default().to_string())
                .collect();
            Ok((objects, dirs))
        })
    }
}

/// Registers the client class.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()
}

/// Asks the kernel to start writing `len` bytes of `file` from `offset` back to disk, without
/// waiting (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`). Best effort: a file system without
/// it (or another OS) leaves the whole flush to the caller's `fsync`.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: a plain syscall on an open descriptor this function borrows; no memory is
        // passed.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Writes `chunks` to `file` whole, in as few `writev` calls as the kernel allows (a short write
/// continues where it stopped), and empties the list.
fn write_chunks<W: Write, T: AsRef<[u8]>>(
    file: &mut W,
    chunks: &mut Vec<T>,
) -> std::io::Result<()> {
    let (mut first, mut skip) = (0usize, 0usize); // the first chunk not written whole, bytes of it written
    while first < chunks.len() {
        let slices: Vec<std::io::IoSlice<'_>> =
            std::iter::once(std::io::IoSlice::new(&chunks[first].as_ref()[skip..]))
                .chain(
                    chunks[first + 1..]
                        .iter()
                        .map(|c| std::io::IoSlice::new(c.as_ref())),
                )
                .take(1024) // IOV_MAX
                .collect();
        let mut wrote = match file.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(w) => w,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while first < chunks.len() && wrote >= chunks[first].as_ref().len() - skip {
            wrote -= chunks[first].as_ref().len() - skip;
            first += 1;
            skip = 0;
        }
        skip += wrote;
    }
    chunks.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{copy_streaming, write_chunks};

    /// A file that takes at most `max` bytes a call, across slices, and is interrupted every
    /// third call: the short writes a kernel may make.
    struct Short {
        got: Vec<u8>,
        max: usize,
        calls: usize,
    }

    impl std::io::Write for Short {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.write_vectored(&[std::io::IoSlice::new(b)])
        }
        fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
            assert!(bufs.len() <= 1024, "more slices than IOV_MAX");
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.max - n);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn chunks_are_written_whole_through_short_and_interrupted_writes() {
        for (sizes, max) in [
            (vec![5usize, 0, 13, 1, 64], 7usize),
            (vec![1; 3000], 2000),
            (vec![100; 10], 1),
            (vec![], 4),
        ] {
            let mut chunks: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
                .collect();
            let want: Vec<u8> = chunks.concat();
            let mut out = Short {
                got: Vec::new(),
                max,
                calls: 0,
            };
            assert!(write_chunks(&mut out, &mut chunks).is_ok(), "{max}");
            assert_eq!(out.got, want, "{max}");
            assert!(chunks.is_empty());
        }
    }

    #[test]
    fn streaming_copy_writes_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        // lengths below, at and above the streaming threshold; every misalignment of the
        // destination and of the source (head and tail copied plainly, the body streamed)
        for len in [0, 1, 15, 4095, 4096, 4097, 10_000, 19_000] {
            for d_off in 0..17 {
                for s_off in [0, 1, 8, 13] {
                    let mut dst = vec![0xAAu8; len + 40];
                    copy_streaming(&mut dst[d_off..d_off + len], &src[s_off..s_off + len]);
                    assert_eq!(
                        dst[d_off..d_off + len],
                        src[s_off..s_off + len],
                        "{len} {d_off} {s_off}"
                    );
                    assert!(dst[..d_off].iter().all(|&b| b == 0xAA), "nothing before");
                    assert!(
                        dst[d_off + len..].iter().all(|&b| b == 0xAA),
                        "nothing after"
                    );
                }
            }
        }
    }
}
