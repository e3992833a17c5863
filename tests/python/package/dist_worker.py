"""One rank of test_torch_datasets.py's 2-process gloo job: reads its share of the dataset through
SafetensorsIterableDataset (rank and world size from torch.distributed) with 2 DataLoader
workers and writes the sample ids it got, in order, to the output file. Given a checkpoint
directory, it also saves the loader (Stateful) there with torch.distributed.checkpoint after
its second batch."""
import sys

import torch.distributed as dist

from safetensors_spark.torch import SafetensorsIterableDataset, loader


def main(path, out, checkpoint=None):
    dist.init_process_group("gloo", init_method="env://")
    ds = SafetensorsIterableDataset(path, batch_size=3, shuffle=True, seed=21)
    assert (ds.rank, ds.world_size) == (dist.get_rank(), 2), (ds.rank, ds.world_size)
    ids = []
    dl = loader(ds, num_workers=2)
    for i, batch in enumerate(dl):
        ids += [int(v) for v in batch["y"].tolist()]
        if checkpoint is not None and i == 1:
            import torch.distributed.checkpoint as dcp

            dcp.save({"data": dl}, checkpoint_id=checkpoint)
    counts = [None, None]
    dist.all_gather_object(counts, len(ids))
    assert counts[0] == counts[1], counts
    with open(out, "w") as f:
        f.write(" ".join(map(str, ids)))
    # both ranks past every collective before either closes its gloo pairs: a rank that exits while
    # the other still reads the all_gather's last message kills it with SIGABRT ("Connection closed
    # by peer"), which the 2-rank test met about once in 20 runs
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
