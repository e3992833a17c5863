"""The package's extras (rust-core/python/pyproject.toml) against what is tested: `spark` admits
every Spark 4 line the bundled jar is smoke-tested on (tests/spark-lines/lines.txt) and no line
it is not; `s3` brings s3fs (the README trains from S3); `all` is every other extra."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]


def extras():
    project = tomllib.loads((ROOT / "rust-core/python/pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}


def spark_lines():
    lines = [line.split() for line in (ROOT / "tests/spark-lines/lines.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return [(version, jar) for version, jar in lines]


def test_the_spark_extra_admits_every_tested_spark_4_line_and_nothing_past_them():
    (pyspark,) = extras()["spark"]
    assert pyspark.name == "pyspark"
    tested = [v for v, jar in spark_lines() if jar == "4"]
    assert len(tested) >= 4 and all(pyspark.specifier.contains(v) for v in tested), (pyspark, tested)
    newest = max(tuple(int(x) for x in v.split(".")[:2]) for v in tested)
    untested = [f"{newest[0]}.{newest[1] + 1}.0", "3.5.9", "5.0.0"]
    assert not any(pyspark.specifier.contains(v) for v in untested), (pyspark, untested)


def test_the_s3_and_all_extras():
    ex = extras()
    assert [r.name for r in ex["s3"]] == ["s3fs"]
    others = {str(r) for name, reqs in ex.items() if name != "all" for r in reqs}
    assert {str(r) for r in ex["all"]} == others
