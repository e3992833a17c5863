//! Bulk conversions from Spark's value types to every writable dtype.
//!
//! # API
//!
//! * [`Source`] borrows a slice of one of the value types Spark hands us
//!   (`f64 f32 i64 i32 i16 i8 bool`).
//! * [`append_converted`] appends the dense little-endian encoding of every element as a target
//!   [`Dtype`] to a `Vec<u8>` (on error the vector is left as it was).
//! * [`convert_into`] does the same into a preallocated `&mut [u8]` of exactly
//!   [`converted_len`] bytes (on error the buffer's contents are unspecified).
//!
//! # Semantics
//!
//! * **Float targets** (`F64 F32 F16 BF16`) are correctly rounded, round-to-nearest-even, from the
//!   *exact* source value: `f64 → F16/BF16` rounds once (never through `f32`), and integer sources
//!   are rounded from the exact integer (an `i64` beyond 2^53 is first narrowed to `f64` with
//!   round-to-odd, which makes the second rounding exact — see [`i64_to_f64_round_odd`]).
//!   Subnormals are kept, overflow gives ±Inf, -0.0 stays -0.0. A NaN stays a NaN of the same
//!   sign; it is made quiet and keeps the top bits of its payload (what x86/ARM hardware does).
//!   `f64 → F64` and `f32 → F32` copy the bits (NaN payloads included); `f32 → F64` is exact.
//! * **Integer targets** (`U8 I8 U16 I16 U32 I32 U64 I64`) are exact: a value that is out of range,
//!   fractional, NaN or infinite is a [`ConvertError`] naming the value, its element index, the
//!   source type and the target; nothing wraps or saturates. Integer sources never go through a
//!   float.
//! * **`BOOL`** accepts exactly 0 and 1 (and `false`/`true`), written as the bytes `0x00`/`0x01`;
//!   `bool` sources become 0/1 in every numeric dtype.
//!
//! The loops are branch-free per element (selects, no early exit inside a block, no allocation)
//! so the compiler can vectorise them; the F16/BF16 rounding is done with integer bit
//! manipulation plus one float addition for the subnormal range, which relies on the default
//! floating-point environment (round-to-nearest-even, no flush-to-zero) that Rust guarantees.

use std::fmt;

use crate::dtype::Dtype;

/// A borrowed slice of one of the value types Spark gives the writer.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
    I64(&'a [i64]),
    I32(&'a [i32]),
    I16(&'a [i16]),
    I8(&'a [i8]),
    Bool(&'a [bool]),
}

impl<'a> Source<'a> {
    /// Elements `range` of this slice, of the same type; `None` when out of bounds.
    #[inline]
    pub fn slice(&self, range: std::ops::Range<usize>) -> Option<Source<'a>> {
        Some(match *self {
            Source::F64(s) => Source::F64(s.get(range)?),
            Source::F32(s) => Source::F32(s.get(range)?),
            Source::I64(s) => Source::I64(s.get(range)?),
            Source::I32(s) => Source::I32(s.get(range)?),
            Source::I16(s) => Source::I16(s.get(range)?),
            Source::I8(s) => Source::I8(s.get(range)?),
            Source::Bool(s) => Source::Bool(s.get(range)?),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Source::F64(s) => s.len(),
            Source::F32(s) => s.len(),
            Source::I64(s) => s.len(),
            Source::I32(s) => s.len(),
            Source::I16(s) => s.len(),
            Source::I8(s) => s.len(),
            Source::Bool(s) => s.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn source_type(&self) -> SourceType {
        match self {
            Source::F64(_) => SourceType::F64,
            Source::F32(_) => SourceType::F32,
            Source::I64(_) => SourceType::I64,
            Source::I32(_) => SourceType::I32,
            Source::I16(_) => SourceType::I16,
            Source::I8(_) => SourceType::I8,
            Source::Bool(_) => SourceType::Bool,
        }
    }

    /// Element `index`, for messages.
    pub fn value(&self, index: usize) -> Option<Value> {
        match self {
            Source::F64(s) => s.get(index).map(|&v| Value::F64(v)),
            Source::F32(s) => s.get(index).map(|&v| Value::F32(v)),
            Source::I64(s) => s.get(index).map(|&v| Value::Int(v)),
            Source::I32(s) => s.get(index).map(|&v| Value::Int(v.into())),
            Source::I16(s) => s.get(index).map(|&v| Value::Int(v.into())),
            Source::I8(s) => s.get(index).map(|&v| Value::Int(v.into())),
            Source::Bool(s) => s.get(index).map(|&v| Value::Bool(v)),
        }
    }
}

/// The element type of a [`Source`], named like the Rust type (`"f64"`, …, `"bool"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceType {
    F64,
    F32,
    I64,
    I32,
    I16,
    I8,
    Bool,
}

impl SourceType {
    /// Every source type.
    pub const ALL: [SourceType; 7] = [
        SourceType::F64,
        SourceType::F32,
        SourceType::I64,
        SourceType::I32,
        SourceType::I16,
        SourceType::I8,
        SourceType::Bool,
    ];

    /// `"f64"`, `"f32"`, `"i64"`, `"i32"`, `"i16"`, `"i8"` or `"bool"`.
    pub fn name(self) -> &'static str {
        match self {
            SourceType::F64 => "f64",
            SourceType::F32 => "f32",
            SourceType::I64 => "i64",
            SourceType::I32 => "i32",
            SourceType::I16 => "i16",
            SourceType::I8 => "i8",
            SourceType::Bool => "bool",
        }
    }

    /// Exact parse of [`SourceType::name`].
    pub fn from_name(name: &str) -> Option<SourceType> {
        SourceType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Size of one element in memory (a `bool` is one byte).
    pub fn byte_size(self) -> usize {
        match self {
            SourceType::F64 => size_of::<f64>(),
            SourceType::F32 => size_of::<f32>(),
            SourceType::I64 => size_of::<i64>(),
            SourceType::I32 => size_of::<i32>(),
            SourceType::I16 => size_of::<i16>(),
            SourceType::I8 => size_of::<i8>(),
            SourceType::Bool => size_of::<bool>(),
        }
    }
}

impl fmt::Display for SourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One source element, as quoted in a [`ConvertError`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    F64(f64),
    F32(f32),
    Int(i64),
    Bool(bool),
}

impl Value {
    fn as_f64(self) -> Option<f64> {
        match self {
            Value::F64(x) => Some(x),
            Value::F32(x) => Some(f64::from(x)),
            Value::Int(_) | Value::Bool(_) => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}` prints the shortest round-tripping decimal and switches to exponent notation for
        // very large/small magnitudes (1e300 rather than 301 digits).
        fn float(
            f: &mut fmt::Formatter<'_>,
            x: impl fmt::Debug,
            nan: bool,
            inf: Option<bool>,
        ) -> fmt::Result {
            match (nan, inf) {
                (true, _) => f.write_str("NaN"),
                (false, Some(true)) => f.write_str("Infinity"),
                (false, Some(false)) => f.write_str("-Infinity"),
                (false, None) => write!(f, "{x:?}"),
            }
        }
        match *self {
            Value::F64(x) => float(f, x, x.is_nan(), x.is_infinite().then_some(x > 0.0)),
            Value::F32(x) => float(f, x, x.is_nan(), x.is_infinite().then_some(x > 0.0)),
            Value::Int(i) => write!(f, "{i}"),
            Value::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// The inclusive range of an integer dtype, displayed as `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRange {
    pub min: i128,
    pub max: i128,
}

impl IntRange {
    /// The range of an integer dtype; `None` for float dtypes and `BOOL`.
    pub fn of(dtype: Dtype) -> Option<IntRange> {
        fn r(min: impl Into<i128>, max: impl Into<i128>) -> Option<IntRange> {
            Some(IntRange {
                min: min.into(),
                max: max.into(),
            })
        }
        match dtype {
            Dtype::U8 => r(u8::MIN, u8::MAX),
            Dtype::I8 => r(i8::MIN, i8::MAX),
            Dtype::U16 => r(u16::MIN, u16::MAX),
            Dtype::I16 => r(i16::MIN, i16::MAX),
            Dtype::U32 => r(u32::MIN, u32::MAX),
            Dtype::I32 => r(i32::MIN, i32::MAX),
            Dtype::U64 => r(u64::MIN, u64::MAX),
            Dtype::I64 => r(i64::MIN, i64::MAX),
            _ => None,
        }
    }
}

impl fmt::Display for IntRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

/// Why values cannot be converted to the requested dtype.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConvertError {
    /// A whole number outside the target integer dtype's range.
    #[error("value {value} at element {index} ({from}) does not fit in {to} (allowed {range})")]
    OutOfRange {
        value: Value,
        index: usize,
        from: SourceType,
        to: Dtype,
        range: IntRange,
    },
    /// A fractional float for an integer dtype.
    #[error(
        "value {value} at element {index} ({from}) is not a whole number; {to} holds integers only"
    )]
    NotWhole {
        value: Value,
        index: usize,
        from: SourceType,
        to: Dtype,
    },
    /// NaN or ±Infinity for an integer dtype or `BOOL`.
    #[error("{value} at element {index} ({from}) cannot be stored as {to}")]
    NotFinite {
        value: Value,
        index: usize,
        from: SourceType,
        to: Dtype,
    },
    /// A number other than 0 or 1 for `BOOL`.
    #[error("value {value} at element {index} ({from}) cannot be stored as BOOL (allowed 0 or 1)")]
    NotBool {
        value: Value,
        index: usize,
        from: SourceType,
    },
    /// The target dtype is one the writer does not produce.
    #[error("{0} cannot be written; writable dtypes are {names}", names = Dtype::writable_names().join(", "))]
    NotWritable(Dtype),
    /// The output size does not fit in memory.
    #[error("{elements} elements of {to} do not fit in memory")]
    TooLarge { elements: usize, to: Dtype },
    /// [`convert_into`] got a buffer of the wrong size.
    #[error("output buffer has {actual} bytes but {elements} elements of {to} take {expected}")]
    BufferSize {
        elements: usize,
        to: Dtype,
        expected: usize,
        actual: usize,
    },
}

/// Number of bytes that `elements` elements of `dst` take.
pub fn converted_len(elements: usize, dst: Dtype) -> Result<usize, ConvertError> {
    if !dst.is_writable() {
        return Err(ConvertError::NotWritable(dst));
    }
    dst.byte_size()
        .and_then(|size| elements.checked_mul(size))
        .ok_or(ConvertError::TooLarge { elements, to: dst })
}

/// Appends the little-endian encoding of every element of `src` as `dst` to `out`.
///
/// `out` grows by exactly [`converted_len`]`(src.len(), dst)` bytes; on error it is truncated
/// back to its original length.
pub fn append_converted(
    src: Source<'_>,
    dst: Dtype,
    out: &mut Vec<u8>,
) -> Result<(), ConvertError> {
    let len = converted_len(src.len(), dst)?;
    let start = out.len();
    out.try_reserve_exact(len)
        .map_err(|_| ConvertError::TooLarge {
            elements: src.len(),
            to: dst,
        })?;
    if let Some(bytes) = identity_bytes(src, dst) {
        // Same type, little-endian host: the converted bytes are the source bytes (one copy, no
        // zero fill of `out` first).
        out.extend_from_slice(bytes);
        return Ok(());
    }
    out.resize(start + len, 0);
    let result = convert_into(src, dst, &mut out[start..]);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Primitive numbers: no padding, every byte initialised, any bit pattern valid.
trait PlainNumber: Copy {}
impl PlainNumber for f64 {}
impl PlainNumber for f32 {}
impl PlainNumber for i64 {}
impl PlainNumber for i32 {}
impl PlainNumber for i16 {}
impl PlainNumber for i8 {}

/// The in-memory bytes of a slice of primitive numbers (their little-endian encoding on a
/// little-endian host).
fn plain_bytes<T: PlainNumber>(s: &[T]) -> &[u8] {
    // SAFETY: `T` is a primitive number (no padding, all bytes initialised); `u8` has alignment
    // 1; the length is the slice's size in bytes, and the borrow keeps the memory alive.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of `src` when converting it to `dst` is a bit-for-bit copy on this host (the same
/// type, little-endian), else `None`.
fn identity_bytes<'a>(src: Source<'a>, dst: Dtype) -> Option<&'a [u8]> {
    if !cfg!(target_endian = "little") {
        return None;
    }
    match (src, dst) {
        (Source::F64(s), Dtype::F64) => Some(plain_bytes(s)),
        (Source::F32(s), Dtype::F32) => Some(plain_bytes(s)),
        (Source::I64(s), Dtype::I64) => Some(plain_bytes(s)),
        (Source::I32(s), Dtype::I32) => Some(plain_bytes(s)),
        (Source::I16(s), Dtype::I16) => Some(plain_bytes(s)),
        (Source::I8(s), Dtype::I8) => Some(plain_bytes(s)),
        _ => None,
    }
}

/// Writes the little-endian encoding of every element of `src` as `dst` into `out`, which must be
/// exactly [`converted_len`]`(src.len(), dst)` bytes long. On error the contents of `out` are
/// unspecified.
pub fn convert_into(src: Source<'_>, dst: Dtype, out: &mut [u8]) -> Result<(), ConvertError> {
    let expected = converted_len(src.len(), dst)?;
    if out.len() != expected {
        return Err(ConvertError::BufferSize {
            elements: src.len(),
            to: dst,
            expected,
            actual: out.len(),
        });
    }
    let first_bad = match src {
        Source::F64(s) => from_float(s, dst, out, |x| x),
        Source::F32(s) => from_f32(s, dst, out),
        Source::I64(s) => from_int(s, dst, out),
        Source::I32(s) => from_int(s, dst, out),
        Source::I16(s) => from_int(s, dst, out),
        Source::I8(s) => from_int(s, dst, out),
        Source::Bool(s) => from_bool(s, dst, out),
    };
    match first_bad {
        None => Ok(()),
        Some(index) => Err(describe(src, index, dst)),
    }
}

/// The error for element `index`, which the conversion loop found unrepresentable in `to`.
fn describe(src: Source<'_>, index: usize, to: Dtype) -> ConvertError {
    let from = src.source_type();
    // The loops only report an index they read, so `value` is always present.
    let value = src.value(index).unwrap_or(Value::Int(0));
    let range = IntRange::of(to);
    if let Some(x) = value.as_f64() {
        if !x.is_finite() {
            return ConvertError::NotFinite {
                value,
                index,
                from,
                to,
            };
        }
        if to == Dtype::Bool {
            return ConvertError::NotBool { value, index, from };
        }
        if let Some(range) = range {
            // Out of range when no integer next to x is in range (so -0.5 -> U8 is "not whole").
            // Both bounds are 0 or ± a power of two, so exact as f64.
            let t = x.trunc();
            if t < range.min as f64 || t >= (range.max + 1) as f64 {
                return ConvertError::OutOfRange {
                    value,
                    index,
                    from,
                    to,
                    range,
                };
            }
        }
        return ConvertError::NotWhole {
            value,
            index,
            from,
            to,
        };
    }
    match range {
        Some(range) => ConvertError::OutOfRange {
            value,
            index,
            from,
            to,
            range,
        },
        None => ConvertError::NotBool { value, index, from },
    }
}

// ---------------------------------------------------------------------------------------------
// Block loops
// ---------------------------------------------------------------------------------------------

/// Elements per block of [`fill_checked`]: small enough to stop early on a bad value, large
/// enough that the per-block check costs nothing.
const BLOCK: usize = 4096;

/// `out[i] = f(src[i])` over `N`-byte chunks. `out` holds exactly `src.len() * N` bytes.
/// Returns `None` (no bad element) so that it slots in next to [`fill_checked`].
///
/// On x86-64 CPUs with AVX2 the loop runs compiled for AVX2 (detected at run time; the library
/// itself targets baseline x86-64): the branch-free 16-bit rounding kernels then use 256-bit
/// lanes, about 2.2 × the baseline's throughput for f64 → F16/BF16.
#[inline(always)]
fn fill<T: Copy, const N: usize>(
    src: &[T],
    out: &mut [u8],
    f: impl Fn(T) -> [u8; N],
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { fill_avx2(src, out, f) };
    }
    fill_baseline(src, out, f)
}

/// [`fill`]'s loop compiled for AVX2 (`f` and the loop are inlined into it).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2<T: Copy, const N: usize>(
    src: &[T],
    out: &mut [u8],
    f: impl Fn(T) -> [u8; N],
) -> Option<usize> {
    fill_baseline(src, out, f)
}

#[inline(always)]
fn fill_baseline<T: Copy, const N: usize>(
    src: &[T],
    out: &mut [u8],
    f: impl Fn(T) -> [u8; N],
) -> Option<usize> {
    let (chunks, _) = out.as_chunks_mut::<N>();
    for (o, &v) in chunks.iter_mut().zip(src) {
        *o = f(v);
    }
    None
}

/// Like [`fill`], but `f` also says whether the element is representable. Returns the index of
/// the first element that is not (the output is then unspecified).
#[inline(always)]
fn fill_checked<T: Copy, const N: usize>(
    src: &[T],
    out: &mut [u8],
    f: impl Fn(T) -> ([u8; N], bool),
) -> Option<usize> {
    let (chunks, _) = out.as_chunks_mut::<N>();
    for (block, (s, o)) in src.chunks(BLOCK).zip(chunks.chunks_mut(BLOCK)).enumerate() {
        let mut all_ok = true;
        for (o, &v) in o.iter_mut().zip(s) {
            let (bytes, ok) = f(v);
            *o = bytes;
            all_ok &= ok;
        }
        if !all_ok {
            let offset = s.iter().position(|&v| !f(v).1).unwrap_or(0);
            return Some(block * BLOCK + offset);
        }
    }
    None
}

/// Checked conversion of a float (already widened exactly to f64) to an integer dtype.
macro_rules! float_to_int {
    ($src:expr, $out:expr, $widen:expr, $int:ty) => {{
        // -2^(bits-1) or 0, and 2^bits or 2^(bits-1): exact in f64.
        const LO: f64 = <$int>::MIN as f64;
        const END: f64 = ((<$int>::MAX / 2 + 1) as f64) * 2.0;
        fill_checked($src, $out, |v| {
            let x: f64 = $widen(v);
            let i = x as $int; // saturating; only kept when exact
            // In range, `x as $int` truncates exactly and `i as f64` is exact iff x is whole.
            (i.to_le_bytes(), (LO..END).contains(&x) && i as f64 == x)
        })
    }};
}

/// Checked conversion of an integer (widened to i64) to an integer dtype.
macro_rules! int_to_int {
    ($src:expr, $out:expr, $int:ty) => {
        fill_checked($src, $out, |v| match <$int>::try_from(v.to_i64()) {
            Ok(i) => (i.to_le_bytes(), true),
            Err(_) => (<$int>::default().to_le_bytes(), false),
        })
    };
}

/// f64 (or f32 widened by `widen`, exactly) to any writable dtype.
#[inline(always)]
fn from_float<T: Copy>(
    src: &[T],
    dst: Dtype,
    out: &mut [u8],
    widen: impl Fn(T) -> f64,
) -> Option<usize> {
    match dst {
        Dtype::F64 => fill(src, out, |v| widen(v).to_le_bytes()),
        Dtype::F32 => fill(src, out, |v| (widen(v) as f32).to_le_bytes()),
        Dtype::F16 => fill(src, out, |v| f64_to_f16_bits(widen(v)).to_le_bytes()),
        Dtype::Bf16 => fill(src, out, |v| f64_to_bf16_bits(widen(v)).to_le_bytes()),
        Dtype::Bool => fill_checked(src, out, |v| {
            let x = widen(v);
            ([u8::from(x == 1.0)], x == 0.0 || x == 1.0)
        }),
        Dtype::U8 => float_to_int!(src, out, widen, u8),
        Dtype::I8 => float_to_int!(src, out, widen, i8),
        Dtype::U16 => float_to_int!(src, out, widen, u16),
        Dtype::I16 => float_to_int!(src, out, widen, i16),
        Dtype::U32 => float_to_int!(src, out, widen, u32),
        Dtype::I32 => float_to_int!(src, out, widen, i32),
        Dtype::U64 => float_to_int!(src, out, widen, u64),
        Dtype::I64 => float_to_int!(src, out, widen, i64),
        // Not writable: rejected by `converted_len` before we get here.
        _ => Some(0),
    }
}

/// f32 to any writable dtype: dedicated 32-bit loops for the float targets, the f64 path
/// (after an exact widening) for the checked ones.
fn from_f32(src: &[f32], dst: Dtype, out: &mut [u8]) -> Option<usize> {
    match dst {
        // Bit-for-bit copy (keeps NaN payloads).
        Dtype::F32 => fill(src, out, f32::to_le_bytes),
        Dtype::F16 => fill(src, out, |x| f32_to_f16_bits(x).to_le_bytes()),
        Dtype::Bf16 => fill(src, out, |x| f32_to_bf16_bits(x).to_le_bytes()),
        _ => from_float(src, dst, out, f64::from),
    }
}

/// The integer source types.
trait IntSource: Copy {
    fn to_i64(self) -> i64;
    /// The value as f64: exact for 32 bits and less, round-to-odd for i64 (see
    /// [`i64_to_f64_round_odd`]), so that one more rounding to F16/BF16 is correct.
    fn to_f64_odd(self) -> f64;
}

macro_rules! small_int_source {
    ($($t:ty),*) => {$(
        impl IntSource for $t {
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self.into()
            }
            #[inline(always)]
            fn to_f64_odd(self) -> f64 {
                self.into()
            }
        }
    )*};
}
small_int_source!(i32, i16, i8);

impl IntSource for i64 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
    #[inline(always)]
    fn to_f64_odd(self) -> f64 {
        i64_to_f64_round_odd(self)
    }
}

fn from_int<S: IntSource>(src: &[S], dst: Dtype, out: &mut [u8]) -> Option<usize> {
    match dst {
        // Rust's int-to-float `as` rounds the exact value to nearest-even (single rounding).
        Dtype::F64 => fill(src, out, |v| (v.to_i64() as f64).to_le_bytes()),
        Dtype::F32 => fill(src, out, |v| (v.to_i64() as f32).to_le_bytes()),
        Dtype::F16 => fill(src, out, |v| f64_to_f16_bits(v.to_f64_odd()).to_le_bytes()),
        Dtype::Bf16 => fill(src, out, |v| f64_to_bf16_bits(v.to_f64_odd()).to_le_bytes()),
        Dtype::Bool => fill_checked(src, out, |v| {
            let i = v.to_i64();
            ([u8::from(i == 1)], i == 0 || i == 1)
        }),
        Dtype::U8 => int_to_int!(src, out, u8),
        Dtype::I8 => int_to_int!(src, out, i8),
        Dtype::U16 => int_to_int!(src, out, u16),
        Dtype::I16 => int_to_int!(src, out, i16),
        Dtype::U32 => int_to_int!(src, out, u32),
        Dtype::I32 => int_to_int!(src, out, i32),
        Dtype::U64 => int_to_int!(src, out, u64),
        Dtype::I64 => int_to_int!(src, out, i64),
        _ => Some(0),
    }
}

fn from_bool(src: &[bool], dst: Dtype, out: &mut [u8]) -> Option<usize> {
    let one = |b: bool| f32::from(u8::from(b));
    match dst {
        Dtype::F64 => fill(src, out, |b| f64::from(one(b)).to_le_bytes()),
        Dtype::F32 => fill(src, out, |b| one(b).to_le_bytes()),
        Dtype::F16 => fill(src, out, |b| f32_to_f16_bits(one(b)).to_le_bytes()),
        Dtype::Bf16 => fill(src, out, |b| f32_to_bf16_bits(one(b)).to_le_bytes()),
        Dtype::Bool | Dtype::U8 => fill(src, out, |b| [u8::from(b)]),
        Dtype::I8 => fill(src, out, |b| i8::from(b).to_le_bytes()),
        Dtype::U16 => fill(src, out, |b| u16::from(b).to_le_bytes()),
        Dtype::I16 => fill(src, out, |b| i16::from(b).to_le_bytes()),
        Dtype::U32 => fill(src, out, |b| u32::from(b).to_le_bytes()),
        Dtype::I32 => fill(src, out, |b| i32::from(b).to_le_bytes()),
        Dtype::U64 => fill(src, out, |b| u64::from(b).to_le_bytes()),
        Dtype::I64 => fill(src, out, |b| i64::from(b).to_le_bytes()),
        _ => Some(0),
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar rounding kernels
// ---------------------------------------------------------------------------------------------

/// Defines `fn $name(x: $float) -> u16`: round `x` to nearest-even into a 16-bit IEEE-style
/// format with `$dst_mant` explicit mantissa bits and `$dst_exp` exponent bits, in one rounding.
///
/// Branch-free: all four candidate results are computed and one is selected.
/// * normal range — rebias the exponent, add `half-ulp - 1 + lsb` and shift (carries into the
///   exponent and up to infinity are the right answer);
/// * subnormal range — add a power of two `M` whose ulp is the target's smallest subnormal, so the
///   hardware's single RNE addition rounds to the target grid; the low bits of the sum's encoding
///   are the target mantissa (2^mant of them means the smallest normal, also right);
/// * `|x| >=` the first value that rounds up past the largest finite — infinity;
/// * NaN — quiet NaN with the sign and the top payload bits.
macro_rules! narrow_to_16 {
    ($(#[$doc:meta])* $name:ident, $float:ty, $bits:ty, $signed:ty, $dst_mant:expr, $dst_exp:expr) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(x: $float) -> u16 {
            const SRC_BITS: u32 = <$bits>::BITS;
            const SM: u32 = <$float>::MANTISSA_DIGITS - 1;
            const DM: u32 = $dst_mant;
            const SHIFT: u32 = SM - DM;
            const SRC_BIAS: $bits = (1 << (SRC_BITS - 2 - SM)) - 1;
            const DST_BIAS: $bits = (1 << ($dst_exp - 1)) - 1;
            const ABS: $bits = <$bits>::MAX >> 1;
            const SRC_INF: $bits = ABS & !((1 << SM) - 1);
            const DST_INF: u16 = ((1 << $dst_exp) - 1) << DM;
            const DST_QUIET: u16 = 1 << (DM - 1);
            const DST_MANT: u16 = (1 << DM) - 1;
            // (2 - 2^-(DM+1)) * 2^DST_BIAS: halfway between the largest finite and 2^(emax+1).
            const OVERFLOW: $bits =
                ((SRC_BIAS + DST_BIAS) << SM) | (((1 << (DM + 1)) - 1) << (SHIFT - 1));
            const MIN_NORMAL: $bits = (SRC_BIAS + 1 - DST_BIAS) << SM;
            const REBIAS: $bits = (SRC_BIAS - DST_BIAS) << SM;
            const HALF_ULP_MINUS_1: $bits = (1 << (SHIFT - 1)) - 1;
            // 2^(SM + 1 - DST_BIAS - DM): its ulp is the target's smallest subnormal.
            const MAGIC: $bits = (SRC_BIAS + SM as $bits + 1 - DST_BIAS - DM as $bits) << SM;

            let bits = x.to_bits();
            let sign = (bits >> (SRC_BITS - 16)) as u16 & 0x8000;
            let a = bits & ABS;
            let normal = (a
                .wrapping_sub(REBIAS)
                .wrapping_add(HALF_ULP_MINUS_1)
                .wrapping_add((a >> SHIFT) & 1)
                >> SHIFT) as u16;
            let subnormal =
                (<$float>::from_bits(a) + <$float>::from_bits(MAGIC)).to_bits().wrapping_sub(MAGIC) as u16;
            let nan = DST_INF | DST_QUIET | ((a >> SHIFT) as u16 & DST_MANT);
            // All-ones when `a >= bound` (a < 2^(SRC_BITS-1), so the signed difference is exact).
            // Masks rather than `if`: LLVM turns the `if` chain into branches, which mispredict
            // on data that mixes ranges.
            let at_least = |bound: $bits| !((a.wrapping_sub(bound) as $signed) >> (SRC_BITS - 1)) as u16;
            let select = |mask: u16, yes: u16, no: u16| (yes & mask) | (no & !mask);
            let magnitude = select(at_least(MIN_NORMAL), normal, subnormal);
            let magnitude = select(at_least(OVERFLOW), DST_INF, magnitude);
            let magnitude = select(at_least(SRC_INF + 1), nan, magnitude);
            sign | magnitude
        }
    };
}

narrow_to_16!(
    /// The F16 (IEEE binary16) bits of `x`, rounded to nearest-even.
    f32_to_f16_bits, f32, u32, i32, 10, 5
);
narrow_to_16!(
    /// The F16 (IEEE binary16) bits of `x`, rounded once to nearest-even from the f64 value.
    f64_to_f16_bits, f64, u64, i64, 10, 5
);
narrow_to_16!(
    /// The BF16 bits of `x`, rounded once to nearest-even from the f64 value.
    f64_to_bf16_bits, f64, u64, i64, 7, 8
);

/// The BF16 bits of `x`, rounded to nearest-even. BF16 is the top half of an f32, so rounding is
/// one addition on the bits (which also carries into infinity and handles subnormals); NaN is
/// quieted keeping sign and payload top bits.
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7FFF).wrapping_add((bits >> 16) & 1) >> 16) as u16;
    let nan = (bits >> 16) as u16 | 0x0040;
    if x.is_nan() {
        nan
    } else {
        rounded
    }
}

/// `x` as f64 rounded to **odd**: exact when |x| <= 2^53, otherwise truncated to 53 significant
/// bits with the last one set if anything nonzero was dropped. A round-to-odd result with at
/// least two more bits than the final format rounds to nearest-even into that format exactly as
/// the exact value would (Boldo & Melquiond), so `f64_to_bf16_bits(i64_to_f64_round_odd(x))` is
/// correctly rounded where `x as f64` first would double-round.
#[inline(always)]
pub fn i64_to_f64_round_odd(x: i64) -> f64 {
    let u = x.unsigned_abs();
    let dropped = (u64::BITS - u.leading_zeros()).saturating_sub(f64::MANTISSA_DIGITS); // <= 11
    let mask = (1u64 << dropped) - 1;
    let t = (u & !mask) | (u64::from(u & mask != 0) << dropped);
    // Exact: at most 53 significant bits. Converted as i64 (cheaper than u64 on x86); t = 2^63
    // becomes -2^63, whose sign bit is cleared below.
    let magnitude = (t as i64 as f64).to_bits() & !(1 << 63);
    // Apply the sign on the bits (a branch on random signs mispredicts).
    f64::from_bits(magnitude | (x as u64 & (1 << 63)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use proptest::prelude::*;
    use std::cmp::Ordering;

    const INT_DTYPES: [Dtype; 8] = [
        Dtype::U8,
        Dtype::I8,
        Dtype::U16,
        Dtype::I16,
        Dtype::U32,
        Dtype::I32,
        Dtype::U64,
        Dtype::I64,
    ];

    fn writable() -> Vec<Dtype> {
        crate::dtype::DTYPES
            .iter()
            .filter(|d| d.writable)
            .map(|d| d.dtype)
            .collect()
    }

    fn conv(src: Source<'_>, dst: Dtype) -> Result<Vec<u8>, ConvertError> {
        let mut out = vec![0xAA]; // appending keeps what was there
        append_converted(src, dst, &mut out)?;
        assert_eq!(out[0], 0xAA);
        assert_eq!(out.len(), 1 + converted_len(src.len(), dst).unwrap());
        // the preallocated form agrees
        let mut buf = vec![0u8; out.len() - 1];
        convert_into(src, dst, &mut buf).unwrap();
        assert_eq!(buf, out[1..]);
        Ok(out.split_off(1))
    }

    fn u16s(bytes: &[u8]) -> Vec<u16> {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }

    fn f16_of_f64(x: f64) -> u16 {
        u16s(&conv(Source::F64(&[x]), Dtype::F16).unwrap())[0]
    }
    fn bf16_of_f64(x: f64) -> u16 {
        u16s(&conv(Source::F64(&[x]), Dtype::Bf16).unwrap())[0]
    }
    fn f16_of_f32(x: f32) -> u16 {
        u16s(&conv(Source::F32(&[x]), Dtype::F16).unwrap())[0]
    }
    fn bf16_of_f32(x: f32) -> u16 {
        u16s(&conv(Source::F32(&[x]), Dtype::Bf16).unwrap())[0]
    }
    fn of_i64(x: i64, dst: Dtype) -> Vec<u8> {
        conv(Source::I64(&[x]), dst).unwrap()
    }

    /// Expected encoding of the small whole number `v` (0 or 1 or -1…) in `dst`, computed without
    /// the code under test.
    fn encode_small(v: i8, dst: Dtype) -> Vec<u8> {
        let x = f32::from(v);
        match dst {
            Dtype::F64 => f64::from(x).to_le_bytes().to_vec(),
            Dtype::F32 => x.to_le_bytes().to_vec(),
            Dtype::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
            Dtype::Bf16 => bf16::from_f32(x).to_le_bytes().to_vec(),
            Dtype::Bool | Dtype::U8 => vec![v as u8],
            Dtype::I8 => v.to_le_bytes().to_vec(),
            Dtype::U16 => (v as u16).to_le_bytes().to_vec(),
            Dtype::I16 => i16::from(v).to_le_bytes().to_vec(),
            Dtype::U32 => (v as u32).to_le_bytes().to_vec(),
            Dtype::I32 => i32::from(v).to_le_bytes().to_vec(),
            Dtype::U64 => (v as u64).to_le_bytes().to_vec(),
            Dtype::I64 => i64::from(v).to_le_bytes().to_vec(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn dispatched_loop_equals_the_baseline_loop() {
        // Random bit patterns (every exponent, NaN payloads) and values scaled across the
        // 16-bit formats' normal, subnormal and overflow ranges, plus the specials.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut vals: Vec<f64> = (0..20_000).map(|_| f64::from_bits(next())).collect();
        vals.extend((0..20_000).map(|i| {
            let unit = (next() >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            unit * 2f64.powi(i % 300 - 150)
        }));
        vals.extend([
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            65504.0,
            65520.0,
        ]);
        let floats: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
        let base16 = |v: &[f64], f: fn(f64) -> u16| {
            let mut out = vec![0u8; v.len() * 2];
            fill_baseline(v, &mut out, |x| f(x).to_le_bytes());
            out
        };
        assert_eq!(
            conv(Source::F64(&vals), Dtype::Bf16).unwrap(),
            base16(&vals, f64_to_bf16_bits)
        );
        assert_eq!(
            conv(Source::F64(&vals), Dtype::F16).unwrap(),
            base16(&vals, f64_to_f16_bits)
        );
        let mut out = vec![0u8; floats.len() * 2];
        fill_baseline(&floats, &mut out, |x| f32_to_bf16_bits(x).to_le_bytes());
        assert_eq!(conv(Source::F32(&floats), Dtype::Bf16).unwrap(), out);
        fill_baseline(&floats, &mut out, |x| f32_to_f16_bits(x).to_le_bytes());
        assert_eq!(conv(Source::F32(&floats), Dtype::F16).unwrap(), out);
    }

    #[test]
    fn every_source_to_every_writable_dtype() {
        assert_eq!(writable().len(), 13);
        for dst in writable() {
            let mut expect = encode_small(0, dst);
            expect.extend(encode_small(1, dst));
            expect.extend(encode_small(1, dst));
            for src in [
                Source::F64(&[0.0, 1.0, 1.0]),
                Source::F32(&[0.0, 1.0, 1.0]),
                Source::I64(&[0, 1, 1]),
                Source::I32(&[0, 1, 1]),
                Source::I16(&[0, 1, 1]),
                Source::I8(&[0, 1, 1]),
                Source::Bool(&[false, true, true]),
            ] {
                assert_eq!(
                    conv(src, dst).unwrap(),
                    expect,
                    "{} -> {dst}",
                    src.source_type()
                );
                assert_eq!(
                    conv(src.slice(0..0).unwrap(), dst).unwrap(),
                    Vec::<u8>::new()
                );
            }
        }
    }

    #[test]
    fn negative_one_everywhere() {
        for dst in writable() {
            let signed = dst != Dtype::Bool && IntRange::of(dst).is_none_or(|r| r.min < 0);
            for src in [
                Source::F64(&[-1.0]),
                Source::F32(&[-1.0]),
                Source::I64(&[-1]),
                Source::I32(&[-1]),
                Source::I16(&[-1]),
                Source::I8(&[-1]),
            ] {
                let got = conv(src, dst);
                if signed {
                    assert_eq!(got.unwrap(), encode_small(-1, dst), "{dst}");
                } else {
                    assert!(got.is_err(), "{} -> {dst}", src.source_type());
                }
            }
        }
    }

    #[test]
    fn non_writable_dtypes_are_refused() {
        for info in crate::dtype::DTYPES.iter().filter(|d| !d.writable) {
            let err = conv(Source::F32(&[1.0]), info.dtype).unwrap_err();
            assert_eq!(err, ConvertError::NotWritable(info.dtype));
            assert!(
                err.to_string().contains("writable dtypes are BOOL, U8"),
                "{err}"
            );
        }
    }

    #[test]
    fn wrong_buffer_size() {
        let mut buf = [0u8; 7];
        let err = convert_into(Source::I32(&[1, 2]), Dtype::I32, &mut buf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "output buffer has 7 bytes but 2 elements of I32 take 8"
        );
    }

    /// Is the whole number `c` exactly representable in the source type?
    fn in_source(c: i128, t: SourceType) -> bool {
        match t {
            SourceType::F64 => (c as f64) as i128 == c && c.unsigned_abs() <= 1 << 64,
            SourceType::F32 => (c as f32) as i128 == c && c.unsigned_abs() <= 1 << 64,
            SourceType::I64 => i64::try_from(c).is_ok(),
            SourceType::I32 => i32::try_from(c).is_ok(),
            SourceType::I16 => i16::try_from(c).is_ok(),
            SourceType::I8 => i8::try_from(c).is_ok(),
            SourceType::Bool => false,
        }
    }

    fn convert_one(c: i128, t: SourceType, dst: Dtype) -> Result<Vec<u8>, ConvertError> {
        match t {
            SourceType::F64 => conv(Source::F64(&[c as f64]), dst),
            SourceType::F32 => conv(Source::F32(&[c as f32]), dst),
            SourceType::I64 => conv(Source::I64(&[c as i64]), dst),
            SourceType::I32 => conv(Source::I32(&[c as i32]), dst),
            SourceType::I16 => conv(Source::I16(&[c as i16]), dst),
            SourceType::I8 => conv(Source::I8(&[c as i8]), dst),
            SourceType::Bool => unreachable!(),
        }
    }

    #[test]
    fn integer_dtype_boundaries_from_every_source() {
        let mut checked = 0;
        for dst in INT_DTYPES {
            let r = IntRange::of(dst).unwrap();
            let size = dst.byte_size().unwrap();
            // plus the largest f64/f32 below 2^64 and 2^63, which are in range for U64/I64
            let candidates = [
                r.min - 1,
                r.min,
                r.max,
                r.max + 1,
                (1 << 64) - 2048,
                (1 << 63) - 1024,
                (1 << 64) - (1 << 40),
                (1 << 63) - (1 << 39),
            ];
            for t in SourceType::ALL {
                for c in candidates {
                    if !in_source(c, t) {
                        continue;
                    }
                    checked += 1;
                    let got = convert_one(c, t, dst);
                    if r.min <= c && c <= r.max {
                        let bytes = got.unwrap_or_else(|e| panic!("{c} {t} -> {dst}: {e}"));
                        assert_eq!(bytes, c.to_le_bytes()[..size], "{c} {t} -> {dst}");
                    } else {
                        let err = got.unwrap_err();
                        let ConvertError::OutOfRange {
                            index: 0,
                            from,
                            to,
                            range,
                            ..
                        } = err
                        else {
                            panic!("{err:?}")
                        };
                        assert_eq!((from, to, range), (t, dst, r));
                        let text = err.to_string();
                        assert!(
                            text.contains(&format!("allowed {}..={}", r.min, r.max)),
                            "{text}"
                        );
                    }
                }
            }
        }
        assert!(checked > 150, "{checked}");
    }

    #[test]
    fn i64_to_64_bit_integers_is_exact() {
        let v = [i64::MIN, -1, 0, 1, (1 << 53) + 1, i64::MAX - 1, i64::MAX];
        let i = conv(Source::I64(&v), Dtype::I64).unwrap();
        let back: Vec<i64> = i
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, v);
        let u = conv(Source::I64(&v[2..]), Dtype::U64).unwrap();
        let back: Vec<u64> = u
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, v[2..].iter().map(|&x| x as u64).collect::<Vec<_>>());
        let err = conv(Source::I64(&v), Dtype::U64).unwrap_err();
        assert_eq!(
            err.to_string(),
            "value -9223372036854775808 at element 0 (i64) does not fit in U64 (allowed 0..=18446744073709551615)"
        );
    }

    #[test]
    fn f64_to_i64_boundary() {
        let two63 = 2f64.powi(63);
        assert_eq!(
            conv(Source::F64(&[-two63]), Dtype::I64).unwrap(),
            i64::MIN.to_le_bytes()
        );
        let below = f64::from_bits(two63.to_bits() - 1);
        assert_eq!(
            conv(Source::F64(&[below]), Dtype::I64).unwrap(),
            (below as i64).to_le_bytes()
        );
        assert_eq!(below as i64, i64::MAX - 1023);
        let err = conv(Source::F64(&[1.0, two63]), Dtype::I64).unwrap_err();
        assert_eq!(
            err.to_string(),
            "value 9.223372036854776e18 at element 1 (f64) does not fit in I64 (allowed -9223372036854775808..=9223372036854775807)"
        );
        let above_min = f64::from_bits((-two63).to_bits() + 1); // next below -2^63
        assert!(conv(Source::F64(&[above_min]), Dtype::I64).is_err());
        assert!(conv(Source::F32(&[two63 as f32]), Dtype::I64).is_err());
        assert!(conv(Source::F32(&[-two63 as f32]), Dtype::I64).is_ok());
    }

    #[test]
    fn error_messages() {
        let e = |src, dst| conv(src, dst).unwrap_err().to_string();
        assert_eq!(
            e(Source::I32(&[0, 1, 2, 3, 4, 300]), Dtype::U8),
            "value 300 at element 5 (i32) does not fit in U8 (allowed 0..=255)"
        );
        assert_eq!(
            e(Source::F64(&[2.5]), Dtype::I32),
            "value 2.5 at element 0 (f64) is not a whole number; I32 holds integers only"
        );
        assert_eq!(
            e(Source::F32(&[0.0, 1.0, 2.0, f32::NAN]), Dtype::I16),
            "NaN at element 3 (f32) cannot be stored as I16"
        );
        assert_eq!(
            e(Source::F64(&[f64::NEG_INFINITY]), Dtype::U64),
            "-Infinity at element 0 (f64) cannot be stored as U64"
        );
        assert_eq!(
            e(Source::F32(&[f32::INFINITY]), Dtype::Bool),
            "Infinity at element 0 (f32) cannot be stored as BOOL"
        );
        assert_eq!(
            e(Source::F32(&[0.1]), Dtype::I8),
            "value 0.1 at element 0 (f32) is not a whole number; I8 holds integers only"
        );
        assert_eq!(
            e(Source::F64(&[1e300]), Dtype::I8),
            "value 1e300 at element 0 (f64) does not fit in I8 (allowed -128..=127)"
        );
        assert_eq!(
            e(Source::F64(&[-0.5]), Dtype::U8),
            "value -0.5 at element 0 (f64) is not a whole number; U8 holds integers only"
        );
        assert_eq!(
            e(Source::F64(&[300.0]), Dtype::U8),
            "value 300.0 at element 0 (f64) does not fit in U8 (allowed 0..=255)"
        );
        assert_eq!(
            e(Source::I8(&[1, 0, 2]), Dtype::Bool),
            "value 2 at element 2 (i8) cannot be stored as BOOL (allowed 0 or 1)"
        );
        assert_eq!(
            e(Source::F64(&[0.5]), Dtype::Bool),
            "value 0.5 at element 0 (f64) cannot be stored as BOOL (allowed 0 or 1)"
        );
        assert_eq!(
            e(Source::I64(&[-1]), Dtype::Bool),
            "value -1 at element 0 (i64) cannot be stored as BOOL (allowed 0 or 1)"
        );
    }

    #[test]
    fn first_bad_element_found_across_blocks() {
        let mut v = vec![7i32; 3 * BLOCK + 5];
        v[2 * BLOCK + 17] = -3;
        v[2 * BLOCK + 20] = 1000;
        let err = conv(Source::I32(&v), Dtype::U8).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "value -3 at element {} (i32) does not fit in U8 (allowed 0..=255)",
                2 * BLOCK + 17
            )
        );
        // and append_converted leaves the vector alone on error
        let mut out = vec![1, 2, 3];
        assert!(append_converted(Source::I32(&v), Dtype::U8, &mut out).is_err());
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn bool_conversions() {
        assert_eq!(
            conv(Source::Bool(&[false, true, false]), Dtype::Bool).unwrap(),
            [0, 1, 0]
        );
        assert_eq!(
            conv(Source::F64(&[-0.0, 1.0, 0.0]), Dtype::Bool).unwrap(),
            [0, 1, 0]
        );
        assert_eq!(conv(Source::I64(&[1, 0]), Dtype::Bool).unwrap(), [1, 0]);
        assert_eq!(
            u16s(&conv(Source::Bool(&[true, false]), Dtype::F16).unwrap()),
            [0x3C00, 0]
        );
        assert_eq!(
            u16s(&conv(Source::Bool(&[true, false]), Dtype::Bf16).unwrap()),
            [0x3F80, 0]
        );
        assert!(conv(Source::F32(&[f32::NAN]), Dtype::Bool).is_err());
    }

    #[test]
    fn negative_zero() {
        assert_eq!(f16_of_f64(-0.0), 0x8000);
        assert_eq!(f16_of_f32(-0.0), 0x8000);
        assert_eq!(bf16_of_f64(-0.0), 0x8000);
        assert_eq!(bf16_of_f32(-0.0), 0x8000);
        assert_eq!(
            conv(Source::F64(&[-0.0]), Dtype::F32).unwrap(),
            (-0.0f32).to_le_bytes()
        );
        assert_eq!(
            conv(Source::F32(&[-0.0]), Dtype::F64).unwrap(),
            (-0.0f64).to_le_bytes()
        );
        for dst in INT_DTYPES {
            assert!(
                conv(Source::F64(&[-0.0]), dst)
                    .unwrap()
                    .iter()
                    .all(|&b| b == 0),
                "{dst}"
            );
            assert!(
                conv(Source::F32(&[-0.0]), dst)
                    .unwrap()
                    .iter()
                    .all(|&b| b == 0),
                "{dst}"
            );
        }
        // underflow keeps the sign
        assert_eq!(f16_of_f64(-1e-30), 0x8000);
        assert_eq!(bf16_of_f64(-1e-300), 0x8000);
    }

    #[test]
    fn f16_special_values_and_rounding() {
        for f in [f16_of_f64 as fn(f64) -> u16, |x| f16_of_f32(x as f32)] {
            assert_eq!(f(65504.0), 0x7BFF);
            assert_eq!(f(65519.0), 0x7BFF);
            assert_eq!(f(65520.0), 0x7C00); // tie with an odd max: rounds to infinity
            assert_eq!(f(-65520.0), 0xFC00);
            assert_eq!(f(1e10), 0x7C00);
            assert_eq!(f(f64::INFINITY), 0x7C00);
            assert_eq!(f(f64::NEG_INFINITY), 0xFC00);
            assert_eq!(f(1.0), 0x3C00);
            assert_eq!(f(2049.0), 0x6800); // tie -> even (2048)
            assert_eq!(f(2051.0), 0x6802); // tie -> even (2052)
            assert_eq!(f(2f64.powi(-14)), 0x0400); // smallest normal
            assert_eq!(f(2f64.powi(-24)), 0x0001); // smallest subnormal
            assert_eq!(f(1023.0 * 2f64.powi(-24)), 0x03FF); // largest subnormal
            assert_eq!(f(1023.5 * 2f64.powi(-24)), 0x0400); // tie rounds up into the normals
            assert_eq!(f(2f64.powi(-25)), 0x0000); // tie -> even (0)
            assert_eq!(f(3.0 * 2f64.powi(-25)), 0x0002); // tie -> even (2)
            assert_eq!(f(-1.5 * 2f64.powi(-24)), 0x8002);
            assert_eq!(f(2f64.powi(-26)), 0x0000);
            assert_eq!(f(f64::from(f32::from_bits(1))), 0x0000); // f32 subnormal
        }
        // just above the subnormal tie (not representable in f32)
        assert_eq!(f16_of_f64(2f64.powi(-25) * (1.0 + 2f64.powi(-40))), 0x0001);
        // single rounding from f64: through f32 these would round the wrong way
        assert_eq!(f16_of_f64(65519.999999), 0x7BFF); // f32: 65520 -> Inf
        assert_eq!(f16_of_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 0x3C01); // f32: tie -> 0x3C00
        assert_eq!(f16_of_f64(f64::from_bits(1)), 0x0000);
        assert_eq!(f16_of_f64(f64::MAX), 0x7C00);
    }

    #[test]
    fn bf16_special_values_and_ties() {
        let b = |bits: u32| bf16_of_f32(f32::from_bits(bits));
        assert_eq!(b(0x3F80_8000), 0x3F80); // tie -> even
        assert_eq!(b(0x3F81_8000), 0x3F82); // tie -> even
        assert_eq!(b(0x3F80_8001), 0x3F81);
        assert_eq!(b(0x3F80_7FFF), 0x3F80);
        assert_eq!(b(0xBF81_8000), 0xBF82);
        assert_eq!(b(0x7F7F_FFFF), 0x7F80); // f32::MAX rounds up to infinity
        assert_eq!(b(0x7F7F_7FFF), 0x7F7F);
        assert_eq!(b(0x7F7F_8000), 0x7F80); // tie with odd max -> infinity
        assert_eq!(b(0x0000_0001), 0x0000); // f32 subnormals
        assert_eq!(b(0x0000_8000), 0x0000); // tie -> even
        assert_eq!(b(0x0001_8000), 0x0002); // tie -> even
        assert_eq!(b(0x0000_8001), 0x0001);
        assert_eq!(b(0x007F_FFFF), 0x0080); // largest subnormal rounds to the smallest normal
        assert_eq!(b(0x7F80_0000), 0x7F80);
        assert_eq!(b(0xFF80_0000), 0xFF80);
        for bits in [
            0x3F80_8000u32,
            0x3F81_8000,
            0x3F80_8001,
            0x7F7F_FFFF,
            0x7F7F_8000,
            0x0000_8000,
            0x0001_8000,
            0x007F_FFFF,
            1,
        ] {
            assert_eq!(
                bf16_of_f64(f64::from(f32::from_bits(bits))),
                b(bits),
                "{bits:#x}"
            );
        }
        // f64: bf16 max, overflow, below-subnormal, and single rounding
        assert_eq!(bf16_of_f64(f64::from(bf16::MAX.to_f32())), 0x7F7F);
        assert_eq!(bf16_of_f64(f64::MAX), 0x7F80);
        assert_eq!(bf16_of_f64(1e-300), 0x0000);
        assert_eq!(bf16_of_f64(2f64.powi(-133)), 0x0001);
        assert_eq!(bf16_of_f64(2f64.powi(-134)), 0x0000); // tie -> even
        assert_eq!(
            bf16_of_f64(2f64.powi(-134) * (1.0 + 2f64.powi(-50))),
            0x0001
        );
        assert_eq!(bf16_of_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-30)), 0x3F81); // through f32: 0x3F80
        assert_eq!(bf16_of_f64(1.0 + 2f64.powi(-8) - 2f64.powi(-30)), 0x3F80);
        // (2 - 2^-8) * 2^127 is the overflow tie; the f64 just below stays finite
        let tie = (2.0 - 2f64.powi(-8)) * 2f64.powi(127);
        assert_eq!(bf16_of_f64(tie), 0x7F80);
        assert_eq!(bf16_of_f64(f64::from_bits(tie.to_bits() - 1)), 0x7F7F);
    }

    #[test]
    fn nan_stays_nan() {
        let f16_nan = |b: u16| b & 0x7C00 == 0x7C00 && b & 0x03FF != 0;
        let bf16_nan = |b: u16| b & 0x7F80 == 0x7F80 && b & 0x007F != 0;
        for bits in [
            0x7FC0_0000u32,
            0x7F80_0001,
            0xFF80_0001,
            0x7FA0_0000,
            0xFFC1_2345,
        ] {
            let x = f32::from_bits(bits);
            let sign = (bits >> 16) as u16 & 0x8000;
            let h = f16_of_f32(x);
            assert!(
                f16_nan(h) && h & 0x8000 == sign && h & 0x0200 != 0,
                "{bits:#x} -> {h:#x}"
            );
            let b = bf16_of_f32(x);
            assert!(
                bf16_nan(b) && b & 0x8000 == sign && b & 0x0040 != 0,
                "{bits:#x} -> {b:#x}"
            );
            assert_eq!(
                conv(Source::F32(&[x]), Dtype::F32).unwrap(),
                bits.to_le_bytes()
            );
        }
        assert_eq!(f16_of_f32(f32::from_bits(0xFFC1_2345)), 0xFE09); // payload top bits kept
        assert_eq!(bf16_of_f32(f32::from_bits(0xFFC1_2345)), 0xFFC1);
        for bits in [
            0x7FF8_0000_0000_0000u64,
            0x7FF0_0000_0000_0001,
            0xFFF4_0000_0000_0000,
        ] {
            let x = f64::from_bits(bits);
            let sign = (bits >> 48) as u16 & 0x8000;
            let h = f16_of_f64(x);
            assert!(f16_nan(h) && h & 0x8000 == sign, "{bits:#x} -> {h:#x}");
            let b = bf16_of_f64(x);
            assert!(bf16_nan(b) && b & 0x8000 == sign, "{bits:#x} -> {b:#x}");
            assert!(f32::from_le_bytes(
                conv(Source::F64(&[x]), Dtype::F32)
                    .unwrap()
                    .try_into()
                    .unwrap()
            )
            .is_nan());
            assert_eq!(
                conv(Source::F64(&[x]), Dtype::F64).unwrap(),
                bits.to_le_bytes()
            );
        }
    }

    #[test]
    fn integers_to_floats_round_once() {
        let bf = |x: i64| u16::from_le_bytes(of_i64(x, Dtype::Bf16).try_into().unwrap());
        let h = |x: i64| u16::from_le_bytes(of_i64(x, Dtype::F16).try_into().unwrap());
        let f = |x: i64| f32::from_le_bytes(of_i64(x, Dtype::F32).try_into().unwrap());
        let d = |x: i64| f64::from_le_bytes(of_i64(x, Dtype::F64).try_into().unwrap());
        // 2^62 + 2^54 + 1: just above a BF16 tie; `as f64` rounds it onto the tie (-> 2^62).
        assert_eq!(bf((1 << 62) + (1 << 54) + 1), 0x5E81);
        assert_eq!(bf((1 << 62) + (1 << 54)), 0x5E80);
        assert_eq!(bf(-(1 << 62) - (1 << 54) - 1), 0xDE81);
        assert_eq!(bf(i64::MAX), 0x5F00); // 2^63
        assert_eq!(bf(i64::MIN), 0xDF00);
        assert_eq!(bf((1 << 53) + 1), 0x5A00);
        assert_eq!(bf(257), 0x4380); // tie -> 256
        assert_eq!(bf(259), 0x4382); // tie -> 260
                                     // F32: 2^62 + 2^38 + 1 is above a tie; F64: 2^53 + 1 ties to 2^53, 2^63 - 1 -> 2^63
        assert_eq!(
            f((1 << 62) + (1 << 38) + 1),
            (2f64.powi(62) + 2f64.powi(39)) as f32
        );
        assert_eq!(f((1 << 62) + (1 << 38)), 2f32.powi(62));
        assert_eq!(f((1 << 24) + 1), 2f32.powi(24));
        assert_eq!(d((1 << 53) + 1), 2f64.powi(53));
        assert_eq!(d((1 << 53) + 3), 2f64.powi(53) + 4.0);
        assert_eq!(d(i64::MAX), 2f64.powi(63));
        assert_eq!(h(65504), 0x7BFF);
        assert_eq!(h(65519), 0x7BFF);
        assert_eq!(h(65520), 0x7C00);
        assert_eq!(h(-65520), 0xFC00);
        assert_eq!(h(2049), 0x6800);
        assert_eq!(h(2051), 0x6802);
        assert_eq!(h((1 << 53) + 1), 0x7C00);
        assert_eq!(h(i64::MIN), 0xFC00);
        // i32 sources: exact through f64, so no f32 double rounding
        let bf32 = |x: i32| {
            u16::from_le_bytes(
                conv(Source::I32(&[x]), Dtype::Bf16)
                    .unwrap()
                    .try_into()
                    .unwrap(),
            )
        };
        assert_eq!(bf32((1 << 30) + (1 << 22) + 1), 0x4E81); // via f32 this ties to 0x4E80
        assert_eq!(bf32(i32::MIN), 0xCF00);
        assert_eq!(bf32(i32::MAX), 0x4F00);
    }

    // ---- property tests against an independent, exact reference ----

    #[derive(Clone, Copy, Debug)]
    enum Fmt {
        F16,
        Bf16,
    }

    impl Fmt {
        fn inf(self) -> u16 {
            match self {
                Fmt::F16 => 0x7C00,
                Fmt::Bf16 => 0x7F80,
            }
        }
        /// Exact value of a finite non-negative pattern; `inf` counts as 2^(emax+1).
        fn value(self, p: u16) -> f64 {
            match (self, p == self.inf()) {
                (Fmt::F16, true) => 65536.0,
                (Fmt::Bf16, true) => 2f64.powi(128),
                (Fmt::F16, false) => f16::from_bits(p).to_f64(),
                (Fmt::Bf16, false) => bf16::from_bits(p).to_f64(),
            }
        }
    }

    /// Correct RNE rounding of a finite non-negative value, which `cmp(m)` compares against `m`:
    /// binary search for the neighbours, then compare with their midpoint (exact in f64).
    fn reference(fmt: Fmt, cmp: impl Fn(f64) -> Ordering) -> u16 {
        // largest p in [0, inf) with value(p) <= v
        let (mut lo, mut hi) = (0u16, fmt.inf());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if cmp(fmt.value(mid)) == Ordering::Less {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let (a, b) = (fmt.value(lo), fmt.value(lo + 1));
        match cmp(a) {
            Ordering::Equal => return lo,
            Ordering::Less => unreachable!(),
            Ordering::Greater => {}
        }
        match cmp((a + b) / 2.0) {
            Ordering::Less => lo,
            Ordering::Greater => lo + 1,
            Ordering::Equal => lo + (lo & 1),
        }
    }

    fn reference_f64(fmt: Fmt, x: f64) -> u16 {
        let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
        let a = x.abs();
        if a.is_infinite() {
            return sign | fmt.inf();
        }
        sign | reference(fmt, |m| a.partial_cmp(&m).unwrap())
    }

    fn reference_i64(fmt: Fmt, x: i64) -> u16 {
        let sign = if x < 0 { 0x8000 } else { 0 };
        let a = i128::from(x).abs();
        sign | reference(fmt, |m| {
            // exact comparison of the integer a with m (m < 2^129 here)
            let fl = m.floor();
            let fi = fl as i128;
            if m >= 2f64.powi(126) {
                return Ordering::Less; // a < 2^64
            }
            match a.cmp(&fi) {
                Ordering::Equal if m != fl => Ordering::Less,
                o => o,
            }
        })
    }

    fn check_nan(fmt: Fmt, got: u16, negative: bool) {
        let inf = fmt.inf();
        assert!(
            got & inf == inf && got & !0x8000 & !inf != 0,
            "{got:#x} not NaN"
        );
        assert_eq!(got & 0x8000 != 0, negative);
    }

    /// An f64 whose exponent is in or near the F16/BF16 ranges, with random mantissa bits.
    fn near_range(exp_lo: i32, exp_hi: i32) -> impl Strategy<Value = f64> {
        (any::<bool>(), exp_lo..exp_hi, any::<u64>()).prop_map(|(neg, e, m)| {
            let bits = (u64::from(neg) << 63) | (((e + 1023) as u64) << 52) | (m >> 12);
            f64::from_bits(bits)
        })
    }

    /// A value on or next to a rounding midpoint of `fmt` (the cases that catch double rounding).
    fn near_midpoint(fmt: Fmt) -> impl Strategy<Value = f64> {
        (0u16..fmt.inf(), -3i64..=3, any::<bool>()).prop_map(move |(p, d, neg)| {
            let m = (fmt.value(p) + fmt.value(p + 1)) / 2.0;
            let x = f64::from_bits((m.to_bits() as i64 + d) as u64);
            if neg {
                -x
            } else {
                x
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn f32_to_f16_is_correctly_rounded(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            let got = f16_of_f32(x);
            if x.is_nan() {
                check_nan(Fmt::F16, got, x.is_sign_negative());
            } else {
                prop_assert_eq!(got, reference_f64(Fmt::F16, f64::from(x)), "{:#x}", bits);
                prop_assert_eq!(got, f16::from_f32(x).to_bits()); // half rounds f32 correctly
            }
        }

        #[test]
        fn f32_to_bf16_is_correctly_rounded(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            let got = bf16_of_f32(x);
            if x.is_nan() {
                check_nan(Fmt::Bf16, got, x.is_sign_negative());
            } else {
                prop_assert_eq!(got, reference_f64(Fmt::Bf16, f64::from(x)), "{:#x}", bits);
            }
        }

        #[test]
        fn f64_to_f16_rounds_once(x in prop_oneof![any::<f64>(), near_range(-30, 17), near_midpoint(Fmt::F16)]) {
            let got = f16_of_f64(x);
            if x.is_nan() {
                check_nan(Fmt::F16, got, x.is_sign_negative());
            } else {
                prop_assert_eq!(got, reference_f64(Fmt::F16, x), "{:e} {:#x}", x, x.to_bits());
            }
        }

        #[test]
        fn f64_to_bf16_rounds_once(x in prop_oneof![any::<f64>(), near_range(-140, 129), near_midpoint(Fmt::Bf16)]) {
            let got = bf16_of_f64(x);
            if x.is_nan() {
                check_nan(Fmt::Bf16, got, x.is_sign_negative());
            } else {
                prop_assert_eq!(got, reference_f64(Fmt::Bf16, x), "{:e} {:#x}", x, x.to_bits());
            }
        }

        #[test]
        fn i64_to_half_floats_rounds_once(
            x in prop_oneof![
                any::<i64>(),
                (0u32..64, any::<i64>()).prop_map(|(s, v)| v >> s),
                -70000i64..70000,
                // on or next to a BF16 midpoint above 2^53, where `as f64` would round onto it
                (54u32..63, 0i64..128, -3i64..=3, any::<bool>()).prop_map(|(e, k, d, neg)| {
                    let x = (1i64 << e) + (2 * k + 1) * (1i64 << (e - 8)) + d;
                    if neg { -x } else { x }
                }),
            ]
        ) {
            let bf = u16::from_le_bytes(of_i64(x, Dtype::Bf16).try_into().unwrap());
            prop_assert_eq!(bf, reference_i64(Fmt::Bf16, x), "{}", x);
            let h = u16::from_le_bytes(of_i64(x, Dtype::F16).try_into().unwrap());
            prop_assert_eq!(h, reference_i64(Fmt::F16, x), "{}", x);
            // F32 and F64: compare with the exact integer through i128
            let f = f32::from_le_bytes(of_i64(x, Dtype::F32).try_into().unwrap());
            let d = f64::from_le_bytes(of_i64(x, Dtype::F64).try_into().unwrap());
            for (got, next_up, next_down) in [
                (f as f64, f64::from(f32::from_bits(f.to_bits() + 1)), f64::from(f32::from_bits(f.to_bits().wrapping_sub(1)))),
                (d, f64::from_bits(d.to_bits() + 1), f64::from_bits(d.to_bits().wrapping_sub(1))),
            ] {
                // no neighbour is strictly closer: |x - got| <= |x - other| in exact i128 arithmetic
                if x == 0 { prop_assert_eq!(got, 0.0); continue; }
                let xi = i128::from(x);
                let err = (xi - got as i128).abs();
                for other in [next_up, next_down] {
                    if other.is_finite() && other.abs() < 2f64.powi(100) && other.fract() == 0.0 {
                        prop_assert!(err <= (xi - other as i128).abs(), "{} {}", x, got);
                    }
                }
            }
        }

        #[test]
        fn i64_round_trips_through_wide_integers(x in any::<i64>()) {
            prop_assert_eq!(of_i64(x, Dtype::I64), x.to_le_bytes());
            match u64::try_from(x) {
                Ok(u) => prop_assert_eq!(of_i64(x, Dtype::U64), u.to_le_bytes()),
                Err(_) => prop_assert!(conv(Source::I64(&[x]), Dtype::U64).is_err()),
            }
        }

        #[test]
        fn integers_convert_exactly_or_fail(x in any::<i32>(), shift in 0u32..32) {
            let v = x >> shift;
            for dst in INT_DTYPES {
                let r = IntRange::of(dst).unwrap();
                let fits = r.min <= i128::from(v) && i128::from(v) <= r.max;
                let size = dst.byte_size().unwrap();
                let expect = i128::from(v).to_le_bytes()[..size].to_vec();
                for src in [Source::I32(&[v]), Source::I64(&[i64::from(v)]), Source::F64(&[f64::from(v)])] {
                    match conv(src, dst) {
                        Ok(bytes) => { prop_assert!(fits); prop_assert_eq!(&bytes, &expect); }
                        Err(e) => { prop_assert!(!fits, "{}", e); }
                    }
                }
            }
        }

        #[test]
        fn fractional_floats_never_become_integers(x in near_range(-5, 40)) {
            prop_assume!(x.fract() != 0.0);
            for dst in INT_DTYPES {
                prop_assert!(conv(Source::F64(&[x]), dst).is_err());
            }
        }
    }
}
