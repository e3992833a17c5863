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
mod tests;
