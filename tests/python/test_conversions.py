"""Cross-checks rust-core's `convert` module against numpy / ml_dtypes, bit for bit.

Runs the `convert_file` example (built once per session) on raw little-endian input files.

Reference findings (numpy 2.4, ml_dtypes 0.6), checked by the tests below:
* numpy `float32 -> float16` and `float64 -> float16` are correctly rounded (RNE, one rounding
  from the float64 value). We compare with numpy directly and also with `rne_reference` below.
* ml_dtypes `float32 -> bfloat16` is correctly rounded, but `float64 -> bfloat16` rounds TWICE
  (through float32): e.g. 1 + 2**-8 + 2**-30 gives 0x3F80 where the correct RNE result is 0x3F81.
  For float64 sources we therefore compare BF16 against `rne_reference`, an independent
  correctly-rounded implementation in integer arithmetic, and check that every disagreement with
  ml_dtypes is exactly ml_dtypes' double rounding.
* NaN: our converter keeps the sign and the top payload bits and sets the quiet bit (as x86/ARM
  hardware does). numpy's float16 cast keeps the payload too but does not quiet a signalling NaN;
  ml_dtypes returns the canonical NaN 0x7FC0 (with sign). So for quiet NaNs we compare F16 bits
  with numpy exactly; otherwise we compare NaN-ness and sign.
"""

import subprocess
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

SEED = 20240611
N_RANDOM = 1_000_000

# (explicit mantissa bits, exponent bias) of the 16-bit targets
FORMATS = {"F16": (10, 15), "BF16": (7, 127)}


@pytest.fixture(scope="session")
def convert_file(rust_tools):
    return rust_tools / "examples" / "convert_file"


@pytest.fixture
def run(convert_file, tmp_path):
    """run(array, src_type, dtype) -> (returncode, output bytes, stderr)."""

    def _run(arr, src_type, dtype):
        src = tmp_path / "in.bin"
        dst = tmp_path / "out.bin"
        if dst.exists():
            dst.unlink()
        np.ascontiguousarray(arr).astype(np.asarray(arr).dtype.newbyteorder("<")).tofile(src)
        proc = subprocess.run(
            [str(convert_file), src_type, dtype, str(src), str(dst)],
            capture_output=True,
            text=True,
        )
        out = dst.read_bytes() if proc.returncode == 0 else b""
        return proc.returncode, out, proc.stderr

    return _run


def convert16(run, arr, src_type, dtype):
    code, out, err = run(arr, src_type, dtype)
    assert code == 0, err
    bits = np.frombuffer(out, dtype="<u2")
    assert bits.size == np.asarray(arr).size
    return bits


def rne_reference(x, fmt):
    """Correct RNE rounding of float64 values to F16/BF16 bits, in exact integer arithmetic.

    Independent of the Rust implementation: value = m * 2**e2 exactly; choose the target quantum
    q (ulp of the result: the value's binade, but never below the subnormal quantum), then round
    m / 2**(q - e2) to nearest-even with an explicit remainder comparison.
    """
    dm, bias = FORMATS[fmt]
    x = np.asarray(x, dtype=np.float64)
    b = x.view(np.uint64)
    sign = ((b >> np.uint64(48)) & np.uint64(0x8000)).astype(np.uint16)
    ex = ((b >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    frac = b & np.uint64((1 << 52) - 1)
    m = np.where(ex == 0, frac, frac | np.uint64(1 << 52))
    e2 = np.where(ex == 0, 1, ex) - 1075  # value = m * 2**e2
    qmin = 1 - bias - dm  # quantum of the subnormals
    q = np.maximum(np.where(ex == 0, -2000, ex - 1023) - dm, qmin)
    shift = np.minimum(q - e2, 60).astype(np.uint64)  # always >= 52 - dm > 0
    n = m >> shift
    rem = m & ((np.uint64(1) << shift) - np.uint64(1))
    half = np.uint64(1) << (shift - np.uint64(1))
    up = (rem > half) | ((rem == half) & ((n & np.uint64(1)) == 1))
    n = n + up.astype(np.uint64)
    inf = ((1 << (15 - dm)) - 1) << dm
    mag = ((q - qmin) << dm) + n.astype(np.int64)  # unified normal/subnormal encoding
    mag = np.minimum(mag, inf)  # overflow (and ±Inf inputs, whose q is huge) -> Inf
    out = (sign | mag.astype(np.uint16)).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0xFFFF), out)  # NaN: checked separately


def rne_int_reference(v, fmt):
    """Correct RNE rounding of a Python int to F16/BF16 bits, with Python integers/fractions."""
    dm, bias = FORMATS[fmt]
    sign = 0x8000 if v < 0 else 0
    a = abs(v)
    if a == 0:
        return sign
    e = a.bit_length() - 1
    q = max(e - dm, 1 - bias - dm)
    n = Fraction(a, 1) / Fraction(2) ** q
    fl = n.numerator // n.denominator
    r = n - fl
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    mag = ((q - (1 - bias - dm)) << dm) + fl
    return sign | min(mag, ((1 << (15 - dm)) - 1) << dm)


def f32_bits(*bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def f64_bits(*bits):
    return np.array(bits, dtype=np.uint64).view(np.float64)


SPECIAL_F32 = np.concatenate(
    [
        np.array(
            [0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 65504.0, 65519.0, 65520.0, -65520.0, 65536.0, 1e10]
            + [2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-25, 1023 * 2.0**-24, 1023.5 * 2.0**-24, 2049.0, 2051.0]
            + [2.0**-126, 2.0**-133, 2.0**-134, 3 * 2.0**-134, 1.5, 1 / 3],
            dtype=np.float32,
        ),
        f32_bits(
            0x00000001, 0x80000001, 0x007FFFFF, 0x00008000, 0x00018000, 0x00008001,  # f32 subnormals
            0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF818000,  # BF16 ties
            0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0xFF7F8000,  # around the BF16 overflow
            0x477FEFFF, 0x477FF000, 0x477FF001,  # around 65520
            0x33000000, 0x33000001, 0x337FFFFF, 0x387FC000,  # F16 subnormal ties/neighbours
            0x7FC00000, 0xFFC00000, 0x7FC12345, 0xFFC12345,  # quiet NaNs
        ),
    ]
)

SIGNALLING_NAN_F32 = f32_bits(0x7F800001, 0xFF800001, 0x7FA00000)


def special_f64():
    ties = []
    for fmt in FORMATS:
        # every 16-bit midpoint of a few binades, and the f64 values right next to them
        dm, bias = FORMATS[fmt]
        for e in [-bias - dm + 1, -bias + 1, -1, 0, 1, 10, 15, bias]:
            for k in [0, 1, 2, (1 << dm) - 1]:
                mid = (2.0**e) * (1 + (k + 0.5) / 2**dm) if e > -bias else (k + 0.5) * 2.0 ** (1 - bias - dm)
                ties += [mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)]
    return np.concatenate(
        [
            SPECIAL_F32.astype(np.float64),
            np.array(
                ties
                + [65519.999999, 1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-8 - 2.0**-30]
                + [np.finfo(np.float64).max, -np.finfo(np.float64).max, 1e-300, 5e-324, -5e-324]
                + [(2 - 2.0**-8) * 2.0**127, np.nextafter((2 - 2.0**-8) * 2.0**127, 0)],
                dtype=np.float64,
            ),
            f64_bits(0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8123456789ABC),
        ]
    )


def near_midpoints_f64(rng, fmt, count):
    """Random f64 on or within a few ulps of a random 16-bit rounding midpoint."""
    dm, _ = FORMATS[fmt]
    inf = ((1 << (15 - dm)) - 1) << dm
    p = rng.integers(0, inf - 1, count, dtype=np.uint16)
    lo = p.view(np.float16).astype(np.float64) if fmt == "F16" else p.view(ml_dtypes.bfloat16).astype(np.float64)
    hi = (p + 1).view(np.float16).astype(np.float64) if fmt == "F16" else (p + 1).view(ml_dtypes.bfloat16).astype(np.float64)
    mid = (lo + hi) / 2
    d = rng.integers(-3, 4, count)
    x = (mid.view(np.int64) + d).view(np.float64)
    return np.where(rng.integers(0, 2, count) == 1, -x, x)


def check_nans(got, x, fmt):
    nan = np.isnan(x)
    dm, _ = FORMATS[fmt]
    inf = ((1 << (15 - dm)) - 1) << dm
    g = got[nan]
    assert np.all((g & inf) == inf) and np.all((g & ((1 << dm) - 1)) != 0), "NaN must stay NaN"
    assert np.array_equal(g >> 15, np.signbit(x[nan]).astype(np.uint16)), "NaN keeps its sign"
    assert np.all(g & (1 << (dm - 1))), "NaN is quiet"


def assert_bits_equal(got, want, x, what):
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{what}: {bad.size} mismatches, first: "
        + ", ".join(f"{x[i]!r} ({x.view(np.uint64 if x.dtype == np.float64 else np.uint32)[i]:#x}) "
                    f"got {got[i]:#06x} want {want[i]:#06x}" for i in bad[:5])
    )


# ---------------------------------------------------------------- f32 sources

@pytest.mark.parametrize("name", ["special", "random"])
def test_f32_to_f16_and_bf16_match_numpy_and_ml_dtypes(run, name):
    if name == "special":
        x = np.concatenate([SPECIAL_F32, -SPECIAL_F32])
    else:
        x = np.random.default_rng(SEED).integers(0, 2**32, N_RANDOM, dtype=np.uint64).astype(np.uint32).view(np.float32)
    nan = np.isnan(x)
    with np.errstate(all="ignore"):
        want16 = x.astype(np.float16).view(np.uint16)
        wantb = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    got16 = convert16(run, x, "f32", "F16")
    gotb = convert16(run, x, "f32", "BF16")
    assert_bits_equal(got16[~nan], want16[~nan], x[~nan], "f32->F16 vs numpy")
    assert_bits_equal(gotb[~nan], wantb[~nan], x[~nan], "f32->BF16 vs ml_dtypes")
    # the independent reference agrees too
    with np.errstate(invalid="ignore"):  # widening a signalling NaN
        x64 = x.astype(np.float64)
    assert_bits_equal(got16[~nan], rne_reference(x64, "F16")[~nan], x[~nan], "f32->F16 vs reference")
    assert_bits_equal(gotb[~nan], rne_reference(x64, "BF16")[~nan], x[~nan], "f32->BF16 vs reference")
    check_nans(got16, x, "F16")
    check_nans(gotb, x, "BF16")
    # quiet NaNs: same bits as numpy (sign + top payload bits)
    quiet = nan & ((x.view(np.uint32) & 0x00400000) != 0)
    assert np.array_equal(got16[quiet], want16[quiet])
    if name == "random":
        assert nan.sum() > 1000 and (~nan).sum() > 990_000


def test_f32_signalling_nans_are_quieted(run):
    x = SIGNALLING_NAN_F32
    got16 = convert16(run, x, "f32", "F16")
    assert [hex(v) for v in got16] == ["0x7e00", "0xfe00", "0x7f00"]
    with np.errstate(all="ignore"):
        assert [hex(v) for v in x.astype(np.float16).view(np.uint16)] == ["0x7c01", "0xfc01", "0x7d00"]  # numpy keeps sNaN
    assert [hex(v) for v in convert16(run, x, "f32", "BF16")] == ["0x7fc0", "0xffc0", "0x7fe0"]


# ---------------------------------------------------------------- f64 sources

@pytest.mark.parametrize("name", ["special", "random_bits", "in_range", "near_midpoints"])
def test_f64_to_f16_and_bf16_round_once(run, name):
    rng = np.random.default_rng(SEED + 1)
    if name == "special":
        x = special_f64()
        x = np.concatenate([x, -x])
    elif name == "random_bits":  # uniformly random bit patterns: mostly 0/Inf after rounding
        x = rng.integers(0, 2**64, N_RANDOM, dtype=np.uint64).view(np.float64)
    elif name == "in_range":  # random mantissas with exponents covering both formats' ranges
        e = rng.integers(1023 - 140, 1023 + 130, N_RANDOM, dtype=np.uint64)
        m = rng.integers(0, 2**52, N_RANDOM, dtype=np.uint64)
        s = rng.integers(0, 2, N_RANDOM, dtype=np.uint64)
        x = ((s << np.uint64(63)) | (e << np.uint64(52)) | m).view(np.float64)
    else:
        x = np.concatenate([near_midpoints_f64(rng, "F16", N_RANDOM // 2), near_midpoints_f64(rng, "BF16", N_RANDOM // 2)])
    nan = np.isnan(x)
    with np.errstate(all="ignore"):
        want16 = x.astype(np.float16).view(np.uint16)
        ml = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        ml_via_f32 = x.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    ref16 = rne_reference(x, "F16")
    refb = rne_reference(x, "BF16")
    got16 = convert16(run, x, "f64", "F16")
    gotb = convert16(run, x, "f64", "BF16")

    # F16: numpy rounds f64 -> f16 once; it, our converter and the reference all agree.
    assert_bits_equal(want16[~nan], ref16[~nan], x[~nan], "numpy f64->F16 vs reference")
    assert_bits_equal(got16[~nan], want16[~nan], x[~nan], "f64->F16 vs numpy")
    # BF16: compare with the correct reference (ml_dtypes double-rounds, see module docstring).
    assert_bits_equal(gotb[~nan], refb[~nan], x[~nan], "f64->BF16 vs reference")
    differ = (ml != refb) & ~nan
    assert np.array_equal(ml[differ], ml_via_f32[differ]), "ml_dtypes differs only by rounding through f32"
    if name == "near_midpoints":
        assert differ.sum() > 1000, "the ml_dtypes double rounding shows up near midpoints"
    check_nans(got16, x, "F16")
    check_nans(gotb, x, "BF16")
    quiet = nan & ((x.view(np.uint64) & np.uint64(1 << 51)) != 0)
    assert np.array_equal(got16[quiet], want16[quiet])


def test_reference_double_rounding_example(run):
    x = np.array([1 + 2.0**-8 + 2.0**-30, 65519.999999])
    assert x[:1].astype(ml_dtypes.bfloat16).view(np.uint16)[0] == 0x3F80  # ml_dtypes: through f32
    assert convert16(run, x[:1], "f64", "BF16")[0] == 0x3F81  # correct: above the tie
    assert x[1:].astype(np.float16).view(np.uint16)[0] == 0x7BFF  # numpy rounds once
    assert convert16(run, x[1:], "f64", "F16")[0] == 0x7BFF


def test_f32_and_f64_wider_targets(run):
    x = np.concatenate([SPECIAL_F32[~np.isnan(SPECIAL_F32)], -SPECIAL_F32[~np.isnan(SPECIAL_F32)]])
    code, out, err = run(x, "f32", "F64")
    assert code == 0, err
    assert np.array_equal(np.frombuffer(out, "<f8").view(np.uint64), x.astype(np.float64).view(np.uint64))
    y = special_f64()
    y = y[~np.isnan(y)]
    code, out, err = run(y, "f64", "F32")
    assert code == 0, err
    with np.errstate(all="ignore"):
        assert np.array_equal(np.frombuffer(out, "<f4").view(np.uint32), y.astype(np.float32).view(np.uint32))


# ---------------------------------------------------------------- integer sources

def test_i64_to_16_bit_floats_correctly_rounded(run):
    rng = np.random.default_rng(SEED + 2)
    vals = [0, 1, -1, 257, 259, 2049, 2051, 65504, 65519, 65520, -65520, 2**53 + 1,
            2**62 + 2**54 + 1, 2**62 + 2**54, -(2**62) - 2**54 - 1, 2**63 - 1, -(2**63)]
    rand = rng.integers(-(2**63), 2**63 - 1, 20_000, dtype=np.int64, endpoint=True)
    shifted = rand >> rng.integers(0, 64, rand.size)
    x = np.concatenate([np.array(vals, dtype=np.int64), rand, shifted])
    for fmt in FORMATS:
        got = convert16(run, x, "i64", fmt)
        want = np.array([rne_int_reference(int(v), fmt) for v in x], dtype=np.uint16)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, [(int(x[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]
    # i64 -> f64 -> bf16 would double-round this one onto the tie (and down to 2**62):
    assert convert16(run, np.array([2**62 + 2**54 + 1]), "i64", "BF16")[0] == 0x5E81


def test_i64_to_64_bit_integers_is_exact(run):
    v = np.array([-(2**63), -1, 0, 1, 2**53 + 1, 2**63 - 2, 2**63 - 1], dtype=np.int64)
    code, out, err = run(v, "i64", "I64")
    assert code == 0, err
    assert np.array_equal(np.frombuffer(out, "<i8"), v)
    code, out, err = run(v[2:], "i64", "U64")
    assert code == 0, err
    assert np.array_equal(np.frombuffer(out, "<u8"), v[2:].astype(np.uint64))
    code, out, err = run(v, "i64", "U64")
    assert code == 1 and out == b""
    assert "value -9223372036854775808 at element 0 (i64) does not fit in U64 (allowed 0..=18446744073709551615)" in err


@pytest.mark.parametrize(
    "src_type,values,dtype,message",
    [
        ("i32", [0, 1, 2, 3, 4, 300], "U8", "value 300 at element 5 (i32) does not fit in U8 (allowed 0..=255)"),
        ("i64", [2**31], "I32", "value 2147483648 at element 0 (i64) does not fit in I32"),
        ("i16", [-129], "I8", "value -129 at element 0 (i16) does not fit in I8 (allowed -128..=127)"),
        ("f64", [2.5], "I32", "value 2.5 at element 0 (f64) is not a whole number; I32 holds integers only"),
        ("f32", [0, 1, 2, np.nan], "I16", "NaN at element 3 (f32) cannot be stored as I16"),
        ("f64", [2.0**63], "I64", "value 9.223372036854776e18 at element 0 (f64) does not fit in I64"),
        ("f64", [-np.inf], "U32", "-Infinity at element 0 (f64) cannot be stored as U32"),
        ("i8", [1, 0, 2], "BOOL", "value 2 at element 2 (i8) cannot be stored as BOOL (allowed 0 or 1)"),
    ],
)
def test_conversion_errors_exit_1_naming_the_value(run, src_type, values, dtype, message):
    arr = np.array(values, dtype={"f64": np.float64, "f32": np.float32, "i64": np.int64,
                                  "i32": np.int32, "i16": np.int16, "i8": np.int8}[src_type])
    code, out, err = run(arr, src_type, dtype)
    assert code == 1, err
    assert message in err


def test_integer_boundaries(run):
    for dtype, np_t in [("U8", np.uint8), ("I8", np.int8), ("U16", np.uint16), ("I16", np.int16),
                        ("U32", np.uint32), ("I32", np.int32), ("U64", np.uint64), ("I64", np.int64)]:
        info = np.iinfo(np_t)
        lo, hi = int(info.min), int(info.max)
        if hi <= 2**63 - 1:
            code, out, err = run(np.array([lo, hi], dtype=np.int64), "i64", dtype)
            assert code == 0, err
            assert np.frombuffer(out, np.dtype(np_t).newbyteorder("<")).tolist() == [lo, hi]
            if hi < 2**63 - 1:
                assert run(np.array([hi + 1], dtype=np.int64), "i64", dtype)[0] == 1
        if lo > -(2**63):
            assert run(np.array([lo - 1], dtype=np.int64), "i64", dtype)[0] == 1
        # f64: the boundaries are powers of two (exact); just past them fails
        code, out, err = run(np.array([float(lo)]), "f64", dtype)
        assert code == 0, err
        assert run(np.array([float(hi) + 1 if hi < 2**53 else float(hi + 1)]), "f64", dtype)[0] == 1


def test_bool(run):
    b = np.array([0, 1, 1, 0], dtype=np.uint8)
    assert run(b, "bool", "BOOL")[1] == bytes([0, 1, 1, 0])
    assert convert16(run, b, "bool", "F16").tolist() == [0, 0x3C00, 0x3C00, 0]
    assert convert16(run, b, "bool", "BF16").tolist() == [0, 0x3F80, 0x3F80, 0]
    assert np.frombuffer(run(b, "bool", "I64")[1], "<i8").tolist() == [0, 1, 1, 0]
    assert run(np.array([0.0, -0.0, 1.0]), "f64", "BOOL")[1] == bytes([0, 0, 1])
    code, _, err = run(np.array([0.5], dtype=np.float32), "f32", "BOOL")
    assert code == 1 and "value 0.5 at element 0 (f32)" in err
