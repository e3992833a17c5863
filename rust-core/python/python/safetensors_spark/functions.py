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

from pyspark.sql import Column
from pyspark.sql import functions as F

__all__ = ["arr_to_st", "st_to_array", "EXTENSIONS_CLASS"]

#: The ``spark.sql.extensions`` class that registers the SQL functions.
EXTENSIONS_CLASS = "io.safetensors.spark.SafetensorsExtensions"


def _col(c):
    return c if isinstance(c, Column) else F.col(c)


def _shape(shape):
    dims = [int(d) for d in shape]
    if not dims:
        return F.array().cast("array<int>")
    return F.array(*[F.lit(d) for d in dims])


def _arg(a):
    if isinstance(a, Column):
        return a
    if isinstance(a, str):
        return F.lit(a)
    if isinstance(a, (list, tuple)):
        return _shape(a)
    raise TypeError(f"arr_to_st: a dtype (str), a shape (list of int) or a Column was expected, got {a!r}")


def arr_to_st(col, dtype=None, shape=None):
    """The Tensor Struct of a numeric array column (nested arrays: rank = depth).

    ``dtype`` (default: the element type's natural dtype, float → F32, double → F64, …) and
    ``shape`` (default: the array's own shape; its element count must match) may also be given in
    the peer connector's order, ``arr_to_st(col, shape, dtype)``; Columns are accepted too.
    """
    args = [_col(col)] + [_arg(a) for a in (dtype, shape) if a is not None]
    return F.call_function("arr_to_st", *args)


def st_to_array(col, dtype=None, rank=None):
    """The values of a Tensor Struct column as an array of the natural Spark type of ``dtype``
    (F16/BF16/F32 → float, U8 → short, …), nested ``rank`` deep.

    Without ``dtype``/``rank``: those of an ``arr_to_st(...)`` argument when fixed by its
    arguments, else float and flat (row-major). A row whose dtype does not widen exactly to the
    element type, or whose rank differs, is an error naming both.
    """
    args = [_col(col)]
    if dtype is not None:
        args.append(F.lit(str(dtype)))
    if rank is not None:
        args.append(F.lit(int(rank)))
    return F.call_function("st_to_array", *args)
