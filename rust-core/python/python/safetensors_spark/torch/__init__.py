"""PyTorch datasets over a safetensors-spark dataset (spec/python.md §3-§5).

* :class:`SafetensorsDataset` — map-style; ``ds[i]`` → ``{column: tensor}``.
* :class:`SafetensorsIterableDataset` — batches in a global order that depends only on the
  manifest, ``seed`` and the epoch; split over ranks and DataLoader workers; exact resume.
* :class:`SafetensorsMixture` — a weighted mixture of several datasets (:class:`Source`: per-source
  columns mapping and filter), one global order per (seed, epoch) dealt to ranks; exact resume.
* ``filter=`` / :class:`Filter` — a mask column or a predicate on a scalar column, evaluated once
  up front: the order is over the kept samples.
* :func:`loader` — a ``torch.utils.data.DataLoader`` over an iterable dataset that counts, in the
  training process, the batches the loop has taken, so ``dataset.state_dict()`` is exact with any
  ``num_workers``.

Inside (one module per concern; the numpy-only rules they use are the package's ``_sampling``,
``_filter``, ``_packing`` and ``_mixture_order``):

* ``_torch_datasets`` — the two torch datasets; the iterable one's epochs, rank plan and resume state.
* ``_torch_mixture`` — ``SafetensorsMixture`` and ``Source``: the mixture order dealt to ranks and
  workers as ``_torch_datasets`` deals its positions.
* ``_follow`` — ``follow=``: after the epoch, the rows of newer versions, segment by segment.
* ``_reader`` — batches cut out of shard memory as tensors.
* ``_forms`` — what a batch of ragged rows looks like (nested, padded, offsets) and ``transform``.
* ``_handoff`` — several batches per worker message, in pooled shared-memory blocks.
* ``_provenance`` — ``provenance=True``: each batch's ``_file``/``_row_index``/``_added_version``.
* ``_loader`` — ``loader()``; ``_device`` its pinned memory and copies to the GPU; ``_stats`` its
  ``stats()``; ``_stateful`` resume under ``StatefulDataLoader`` and live workers.
"""

# STATE_VERSION (the resume state's version) stays importable from here
from ._torch_datasets import STATE_VERSION, SafetensorsDataset, SafetensorsIterableDataset  # noqa: F401
from .._packing import Packing
from ._loader import loader
from ._torch_mixture import SafetensorsMixture, Source
from .._filter import Filter
from ._follow import Follow

__all__ = ["SafetensorsDataset", "SafetensorsIterableDataset", "SafetensorsMixture", "Source", "Filter", "Follow", "Packing",
           "loader"]
