"""One rank of test_mixture_filter.py's 2-process gloo job: a SafetensorsMixture (rank and world
size from torch.distributed, a filtered and a renamed source) read with 2 DataLoader workers;
writes the sample ids it got, in order, and its state after the epoch."""
import json
import sys

import torch.distributed as dist

from safetensors_spark.torch import Filter, SafetensorsMixture, Source, loader


def main(a, b, c, out):
    dist.init_process_group("gloo", init_method="env://")
    ds = SafetensorsMixture([Source(a, columns=["x", "y"], filter=Filter.mask("keep")), b,
                             Source(c, columns={"x": "feat", "y": "id"})],
                            weights=[1, 3, 0.5], num_samples=50, batch_size=3, shuffle=True, seed=4)
    assert (ds.rank, ds.world_size) == (dist.get_rank(), 2), (ds.rank, ds.world_size)
    ids = [int(v) for batch in loader(ds, num_workers=2) for v in batch["y"].tolist()]
    counts = [None, None]
    dist.all_gather_object(counts, len(ids))
    assert counts[0] == counts[1], counts
    with open(out, "w") as f:
        json.dump({"ids": ids, "consumed_per_source": ds.state_dict()["consumed_per_source"]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
