"""What a read lists (spec/reading.md §1): a directory with a manifest is exactly its manifest's
shards, in Spark as in the Python package (a stray copy in a subdirectory adds no rows); a walk
enters each directory once and lists each file once by its real path, so a symbolic link loop
in a dataset or in a plain lake ends at once and a second name of a file or directory is not
read twice."""
import os
import shutil

import numpy as np
import safetensors_spark
from test_spark_read import batch_dataset, read, save_model, shards


def test_a_dataset_is_its_manifests_shards_not_its_subdirectories(spark, tmp_path):
    out = batch_dataset(spark, tmp_path / "ds", n=10, batch_size=4)
    # A stray copy of a shard in a subdirectory, a nested copy of the whole dataset (manifest
    # included) and a link loop back into the directory.
    (out / "backup").mkdir()
    shutil.copy(shards(out)[0], out / "backup")
    shutil.copytree(out, out / "nested", ignore=shutil.ignore_patterns("backup"))
    (out / "loop").symlink_to(".")
    assert read(spark, out).count() == 10
    assert sorted(r["id"] for r in read(spark, out).select("id").collect()) == list(range(10))
    assert len(safetensors_spark.open_dataset(str(out))) == 10  # the Python package agrees
    # A subdirectory named beside the dataset is still not part of it.
    assert read(spark, out, out / "backup").count() == 10


def test_a_plain_lake_walk_ends_link_loops_and_reads_each_file_once(spark, tmp_path):
    lake = tmp_path / "lake"
    w = {"w": np.zeros(2, np.float32)}
    save_model(lake / "a.safetensors", w)
    save_model(lake / "sub" / "b.safetensors", w)
    (lake / "sub" / "up").symlink_to("..")  # a loop through the parent
    assert read(spark, lake, layout="tensor").count() == 2

    twice = tmp_path / "twice"
    save_model(twice / "real" / "c.safetensors", w)
    (twice / "alias").symlink_to("real")  # a directory by a second name
    (twice / "d.safetensors").symlink_to("real/c.safetensors")  # a file by a second name
    outside = tmp_path / "outside"
    save_model(outside / "e.safetensors", w)
    (twice / "ext").symlink_to(outside)  # a directory reachable only through a link: read
    files = {os.path.basename(r["file"]) for r in read(spark, twice, layout="tensor").collect()}
    assert read(spark, twice, layout="tensor").count() == 2
    assert files == {"c.safetensors", "e.safetensors"}
    assert read(spark, twice, twice / "real", layout="tensor").count() == 2
