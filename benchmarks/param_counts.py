"""Builds every registered model at full size and checks that the analytical
`spec.num_params()` equals `count_params()` of the built model (the unit tests
check the same on shrunk variants). Each model is built in a fresh process.

    python benchmarks/param_counts.py [--models enc-mini dec-base]
"""

import argparse
import json
import sys

import _harness


def measure(name):
    """One model, in this (child) process."""
    import zoo

    model = zoo.get(name)
    return {"name": name, "built": model.count_params(), "analytical": zoo.spec(name).num_params()}


def main():
    import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=zoo.names(), help="default: every registered model")
    args = parser.parse_args()
    rows = []
    print(f"{'model':10s} {'built':>14s} {'analytical':>14s}  equal")
    for name in args.models:
        run = _harness.run_child({"name": name})
        if not run.ok:
            sys.exit(f"{name}: {run.status}: {run.error}")
        row = run.result
        row["equal"] = row["built"] == row["analytical"]
        rows.append(row)
        print(f"{name:10s} {row['built']:14,d} {row['analytical']:14,d}  {row['equal']}", flush=True)
    print(json.dumps({"benchmark": "param_counts", "results": rows}))
    sys.exit(0 if all(r["equal"] for r in rows) else 1)


if __name__ == "__main__":
    if not _harness.child_main(measure):
        main()
