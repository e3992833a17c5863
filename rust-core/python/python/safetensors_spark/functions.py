"""PySpark Column API of the connector's tensor functions (spec/functions.md).

``arr_to_st`` turns a numeric array column into a Tensor Struct (``data`` binary, ``shape``
array<int>, ``dtype`` string), converting exactly as the writer does; ``st_to_array`` turns a
Tensor Struct back into an array of its natural Spark type. Both build a call of the SQL function
by name, so they work with any session (classic or Spark Connect) whose ``spark.sql.extensions``
holds ``io.safetensors.spark.SafetensorsExtensions`` (``safetensors_spark.spark.configure`` sets
it)::

    from safetensors_spark.functions import arr_to_st, st_to_array
    df.select(arr_to_st("x", "BF16", [2, 3]).alias("t"))      # or the peer's order: ("x", [2, 3], "BF16")
    df.select(st_to_array("t", "BF16", 2))                     # array<array<float>>
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

__all__ = ["arr_to_st", "st_to_array", "EXTENSIONS_CLASS"]

#: The ``spark.sql.extensions`` class that registers the SQL functions.
EXTENSIONS_CLASS = "io.safetensors.spark.SafetensorsExtensions"


def _functions(args: Sequence[Any]) -> ModuleType:
    """The functions module the call's Columns belong to: Spark Connect's when an argument is a
    Connect Column or, with column names only, when a Connect session is active and no classic one
    (a session from ``pyspark.sql.connect.session.SparkSession.builder`` does not switch
    ``pyspark.sql.functions`` to Connect); else ``pyspark.sql.functions``."""
    for a in args:
        if type(a).__module__.startswith("pyspark.sql.connect"):
            from pyspark.sql.connect import functions as CF
            return CF
        if isinstance(a, Column):
            return F
    from pyspark import SparkContext
    if SparkContext._active_spark_context is None:
        try:
            from pyspark.sql.connect.session import SparkSession as ConnectSession
        except ImportError:  # no Spark Connect client installed
            return F
        if ConnectSession.getActiveSession() is not None:
            from pyspark.sql.connect import functions as CF
            return CF
    return F


def _col(f: ModuleType, c: str | Column) -> Column:
    return f.col(c) if isinstance(c, str) else c


def _shape(f: ModuleType, shape: Sequence[int]) -> Column:
    dims = [int(d) for d in shape]
    if not dims:
        return f.array().cast("array<int>")
    return f.array(*[f.lit(d) for d in dims])


def _arg(f: ModuleType, a: Any) -> Column:
    if isinstance(a, Column) or type(a).__module__.startswith("pyspark.sql.connect"):
        return a
    if isinstance(a, str):
        return f.lit(a)
    if isinstance(a, (list, tuple)):
        return _shape(f, a)
    raise TypeError(f"arr_to_st: a dtype (str), a shape (list of int) or a Column was expected, got {a!r}")


def arr_to_st(col: str | Column, dtype: str | Sequence[int] | Column | None = None,
              shape: Sequence[int] | str | Column | None = None) -> Column:
    """The Tensor Struct of a numeric array column (nested arrays: rank = depth).

    ``dtype`` (default: the element type's natural dtype, float → F32, double → F64, …) and
    ``shape`` (default: the array's own shape; its element count must match) may also be given in
    the peer connector's order, ``arr_to_st(col, shape, dtype)``; Columns are accepted too.
    """
    f = _functions([col, dtype, shape])
    args = [_col(f, col)] + [_arg(f, a) for a in (dtype, shape) if a is not None]
    return f.call_function("arr_to_st", *args)


def st_to_array(col: str | Column, dtype: str | None = None, rank: int | None = None) -> Column:
    """The values of a Tensor Struct column as an array of the natural Spark type of ``dtype``
    (F16/BF16/F32 → float, U8 → short, …), nested ``rank`` deep.

    Without ``dtype``/``rank``: those of an ``arr_to_st(...)`` argument when fixed by its
    arguments, else float and flat (row-major). A row whose dtype does not widen exactly to the
    element type, or whose rank differs, is an error naming both.
    """
    f = _functions([col])
    args = [_col(f, col)]
    if dtype is not None:
        args.append(f.lit(str(dtype)))
    if rank is not None:
        args.append(f.lit(int(rank)))
    return f.call_function("st_to_array", *args)
