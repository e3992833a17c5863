"""What a batch of ragged rows looks like to the training loop (spec/python.md §3.2), and the
user's ``transform``.

A batch is read as ``{column: values, "<column>.offsets": offsets}`` for each ragged column
(the shard convention); :class:`Finish` turns it into the form asked for, then runs the
transform. Forms:

* ``"offsets"`` (default): ``batch[c]`` the rows' values concatenated, ``batch["c.offsets"]``
  int64 ``[rows + 1]`` from 0. No copy beyond the gather.
* ``"nested"``: ``batch[c]`` a ``torch.nested`` jagged tensor over those values and offsets (a
  view: no copy).
* ``"padded"``: ``batch[c]`` ``[rows, longest, *inner]`` filled with ``pad_value`` past each row's
  end, ``batch["c.lengths"]`` int64 ``[rows]``. A copy.
"""

import numpy as np
import torch

from .._dataset import offsets_name

FORMS = ("offsets", "nested", "padded")
DEFAULT_FORM = "offsets"


def lengths_name(column):
    return f"{column}.lengths"


def resolve_forms(dataset, columns, ragged):
    """``{ragged column: form}`` for the selected columns: ``ragged`` is None (the default form),
    one form for every ragged column, or ``{column: form}`` (unnamed ragged columns take the
    default)."""
    cols = [c for c in columns if c in dataset.ragged]
    if ragged is None:
        return {c: DEFAULT_FORM for c in cols}
    if isinstance(ragged, str):
        _check_form(ragged, "ragged")
        return {c: ragged for c in cols}
    if not isinstance(ragged, dict):
        raise ValueError(f"ragged must be one of {list(FORMS)}, a dict of column -> form, or None; got {ragged!r}")
    for c, form in ragged.items():
        if c not in dataset.ragged:
            what = "not a selected column" if c not in columns else "not a ragged column"
            raise ValueError(f"ragged={{{c!r}: ...}}: column '{c}' is {what} of dataset {dataset.path} "
                             f"(its ragged columns: {sorted(dataset.ragged)})")
        _check_form(form, f"ragged['{c}']")
    return {c: ragged.get(c, DEFAULT_FORM) for c in cols}


def _check_form(form, what):
    if form not in FORMS:
        raise ValueError(f"{what} must be one of {list(FORMS)}, got {form!r}")


class Finish:
    """Applies the forms, then the user's ``transform``, to one read batch. Picklable (it goes
    to DataLoader workers) when ``transform`` is."""

    def __init__(self, forms, pad_value, transform):
        self.forms = forms
        self.pad_value = pad_value
        self.transform = transform

    @property
    def in_worker(self):
        """Whether a worker must finish its batches before sending them (a copy or the user's
        code): padding and transforms; the offsets and nested forms are views, made where the
        batch is handed to the loop."""
        return self.transform is not None or "padded" in self.forms.values()

    def __call__(self, batch):
        batch = self.forms_only(batch)
        if self.transform is not None:
            out = self.transform(batch)
            if not isinstance(out, dict):
                raise TypeError(f"transform must return a dict of tensors, got {type(out).__name__}")
            batch = out
        return batch

    def forms_only(self, batch):
        for c, form in self.forms.items():
            if c not in batch or form == "offsets":
                continue
            values, offsets = batch[c], batch.pop(offsets_name(c))
            if form == "nested":
                batch[c] = nested(values, offsets)
            else:
                batch[c], batch[lengths_name(c)] = padded(values, offsets, self.pad_value)
        return batch


def nested(values, offsets):
    """A jagged nested tensor of rows ``values[offsets[i]:offsets[i+1]]`` (a view of ``values``)."""
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def padded(values, offsets, pad_value):
    """``([rows, longest, *inner] padded with pad_value, lengths int64 [rows])``."""
    n = len(offsets) - 1
    o = offsets.numpy()
    lengths = np.diff(o)
    longest = int(lengths.max()) if n else 0
    out = torch.full((n, longest, *values.shape[1:]), pad_value, dtype=values.dtype)
    if len(values):
        # numpy does the scatter for every dtype (bf16 through its 16-bit pattern)
        raw = (lambda t: t.view(torch.int16).numpy()) if values.dtype == torch.bfloat16 else (lambda t: t.numpy())
        rows = np.repeat(np.arange(n), lengths)
        cols = np.arange(len(values)) - np.repeat(o[:-1], lengths)
        raw(out)[rows, cols] = raw(values)
    return out, torch.from_numpy(lengths.astype(np.int64))
