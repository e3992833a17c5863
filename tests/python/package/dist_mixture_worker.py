"""One rank of test_mixture_filter.py's 2-process gloo job: a SafetensorsMixture (rank and world
size from torch.distributed, a filtered and a renamed source) read with 2 DataLoader workers;
writes the sample ids it got, in order, and its state after the epoch. Then the README's pattern:
the same epoch under StatefulDataLoader with persistent workers, saved after 2 batches with
torch.distributed.checkpoint (a key per rank), restored into a new loader and read to the end."""
import json
import os
import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchdata.stateful_dataloader import StatefulDataLoader

from safetensors_spark.torch import Filter, SafetensorsMixture, Source, loader


def mixture(a, b, c):
    return SafetensorsMixture([Source(a, columns=["x", "y"], filter=Filter.mask("keep")), b,
                               Source(c, columns={"x": "feat", "y": "id"})],
                              weights=[1, 3, 0.5], num_samples=50, batch_size=3, shuffle=True, seed=4)


def main(a, b, c, out):
    dist.init_process_group("gloo", init_method="env://")
    ds = mixture(a, b, c)
    assert (ds.rank, ds.world_size) == (dist.get_rank(), 2), (ds.rank, ds.world_size)
    ids = [int(v) for batch in loader(ds, num_workers=2) for v in batch["y"].tolist()]
    counts = [None, None]
    dist.all_gather_object(counts, len(ids))
    assert counts[0] == counts[1], counts
    ckpt, key = os.path.join(os.path.dirname(out), "ckpt"), f"data_{dist.get_rank()}"
    dl = StatefulDataLoader(mixture(a, b, c), batch_size=None, num_workers=2, persistent_workers=True)
    head = []
    for batch in dl:
        head += batch["y"].tolist()
        if len(head) == 6:
            dcp.save({key: dl}, checkpoint_id=ckpt)
            break
    again = StatefulDataLoader(mixture(a, b, c), batch_size=None, num_workers=2, persistent_workers=True)
    dcp.load({key: again}, checkpoint_id=ckpt)
    resumed = head + [int(v) for batch in again for v in batch["y"].tolist()]
    with open(out, "w") as f:
        json.dump({"ids": ids, "consumed_per_source": ds.state_dict()["consumed_per_source"],
                   "resumed": resumed}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
