"""One rank of test_torch_datasets.py's 2-process gloo job: reads its share of the dataset through
SafetensorsIterableDataset (rank and world size from torch.distributed) with 2 DataLoader
workers and writes the sample ids it got, in order, to the output file."""
import sys

import torch.distributed as dist

from safetensors_spark.torch import SafetensorsIterableDataset, loader


def main(path, out):
    dist.init_process_group("gloo", init_method="env://")
    ds = SafetensorsIterableDataset(path, batch_size=3, shuffle=True, seed=21)
    assert (ds.rank, ds.world_size) == (dist.get_rank(), 2), (ds.rank, ds.world_size)
    ids = [int(v) for batch in loader(ds, num_workers=2) for v in batch["y"].tolist()]
    counts = [None, None]
    dist.all_gather_object(counts, len(ids))
    assert counts[0] == counts[1], counts
    with open(out, "w") as f:
        f.write(" ".join(map(str, ids)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
