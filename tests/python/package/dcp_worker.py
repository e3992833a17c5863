"""One rank of test_torch_stateful.py's 2-process gloo job: takes 3 batches of epoch 1 through
loader() with 1 worker, then saves a model and the loader with torch.distributed.checkpoint
(the loader is Stateful) and writes the sample ids it took, in order, to the output file."""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from safetensors_spark.torch import SafetensorsIterableDataset, loader


def main(path, checkpoint, out):
    dist.init_process_group("gloo", init_method="env://")
    ds = SafetensorsIterableDataset(path, batch_size=2, shuffle=True, seed=21)
    ds.set_epoch(1)
    ids = []
    dl = loader(ds, num_workers=1)
    for batch in dl:
        ids += batch["y"].tolist()
        if len(ids) == 6:
            break
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    dcp.save({"model": model.state_dict(), "data": dl}, checkpoint_id=checkpoint)
    with open(out, "w") as f:
        f.write(" ".join(map(str, ids)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
