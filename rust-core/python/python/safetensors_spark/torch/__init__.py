"""PyTorch datasets over a safetensors-spark dataset (spec/python.md §3-§5).

* :class:`SafetensorsDataset` — map-style; ``ds[i]`` → ``{column: tensor}``.
* :class:`SafetensorsIterableDataset` — batches in a global order that depends only on the
  manifest, ``seed`` and the epoch; split over ranks and DataLoader workers; exact resume.
* :func:`loader` — a ``torch.utils.data.DataLoader`` over an iterable dataset that counts, in the
  training process, the batches the loop has taken, so ``dataset.state_dict()`` is exact with any
  ``num_workers``.

Inside: ``_datasets`` (the two datasets; the iterable one's epochs, rank plan and resume state),
``_reader`` (batches cut out of shard memory as tensors), ``_handoff`` (several batches per
worker message, in pooled shared-memory blocks) and ``_loader`` (``loader()``).
"""

# STATE_VERSION (the resume state's version) stays importable from here, as before the split
from ._datasets import STATE_VERSION, SafetensorsDataset, SafetensorsIterableDataset  # noqa: F401
from .._packing import Packing
from ._loader import loader

__all__ = ["SafetensorsDataset", "SafetensorsIterableDataset", "Packing", "loader"]
