"""The curves of spec/performance.md §14 as one image: ours beside Delta Lake, from scale.py's JSON.

    bash jvm-connector/bench/scale.sh plot --versions V.json --delta D.json [D2.json ...]
         --shards S.json [--out jvm-connector/bench/scale-curves.svg]

Three panels, log-log: (1) a one-row Spark append's seconds against the versions (commits)
already in the dataset or table, ours (V.json's `spark.versions` appends, median) and Delta's
(the `delta.commits` medians of every D.json, merged by commit count); (2) the log's bytes against
the versions: ours `_manifest_log/` (V.json's `commit` part), Delta's `_delta_log/` (its JSON
commits, checksums and checkpoints); (3) Spark's plan seconds against the shards / files:
S.json's `spark.shards` plans and its `delta.plan`. A dashed line in each panel is what growing
linearly from the first point would give. Runs under the `plot` venv (matplotlib, an overlay on
the project's venv made by loaders/venvs.sh).
"""
import argparse
import json
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return json.load(f)


def series(points):
    xs = sorted(points)
    return xs, [points[x] for x in xs]


def linear(ax, xs, ys):
    """Linear growth from the first point (the dashed guide)."""
    if xs:
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], ":", color="grey", lw=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", required=True, help="scale.py JSON with the commit and spark parts")
    ap.add_argument("--delta", required=True, nargs="+", help="scale.py JSONs with Delta's commits")
    ap.add_argument("--shards", required=True, help="scale.py JSON with the spark shards and Delta's plan")
    ap.add_argument("--out", default="jvm-connector/bench/scale-curves.svg")
    args = ap.parse_args()
    v, s = load(args.versions), load(args.shards)
    ours_append = {int(n): statistics.median(r["append"]["append_s"])
                   for n, r in v["spark"]["versions"].items() if r.get("append", {}).get("append_s")}
    ours_log = {p["versions"]: p["log_bytes"] / 2**20 for p in v["commit"]}
    delta_append, delta_log = {}, {}
    for path in args.delta:
        d = load(path).get("delta", {})
        # a table built over several runs (--delta-resume): the building run's last appends, warm
        # as the single runs' points are (the timing run's are a fresh session's)
        for p in [d["build_run"]["commits"][-1]] if "build_run" in d else d.get("commits", []):
            delta_append[p["commits"]] = p["append_s"]
            delta_log[p["commits"]] = p["log_bytes"] / 2**20
    ours_plan = {int(n): r["plan"]["s"] for n, r in s["spark"]["shards"].items()}
    delta_plan = {int(n): r["plan"]["s"] for n, r in s.get("delta", {}).get("plan", {}).items()}

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    panels = [
        (axes[0], "Spark append (s), one row", "versions / commits", ours_append, delta_append),
        (axes[1], "log size (MiB)", "versions / commits", ours_log, delta_log),
        (axes[2], "Spark plan (s)", "shards / files", ours_plan, delta_plan),
    ]
    for ax, title, xlabel, ours, delta in panels:
        for name, pts, style in (("safetensors-spark", ours, "o-"), ("Delta Lake 4.0.1", delta, "s--")):
            xs, ys = series(pts)
            ax.plot(xs, ys, style, label=name)
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        linear(ax, *series(ours))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"scale.sh, 2 cores: ours {v.get('git', '')} ({v.get('date', '')}), "
                 f"plan {s.get('git', '')} ({s.get('date', '')}); dotted: linear growth from ours' first point",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, metadata={"Date": None})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
