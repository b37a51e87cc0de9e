"""Builds every registered model at full size and checks that the analytical
`spec.num_params()` equals `count_params()` of the built model (the unit tests
check the same on shrunk variants). Each model is built in a fresh process.

    python benchmarks/param_counts.py
"""

import json
import subprocess
import sys


def count(name):
    import zoo

    model = zoo.get(name)
    return {"name": name, "built": model.count_params(), "analytical": zoo.spec(name).num_params()}


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(count(sys.argv[2])))
        return
    import zoo

    rows = []
    print(f"{'model':10s} {'built':>14s} {'analytical':>14s}  equal")
    for name in zoo.names():
        out = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True)
        row = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
        row["equal"] = row["built"] == row["analytical"]
        rows.append(row)
        print(f"{name:10s} {row['built']:14,d} {row['analytical']:14,d}  {row['equal']}", flush=True)
    print(json.dumps({"benchmark": "param_counts", "results": rows}))
    sys.exit(0 if all(r["equal"] for r in rows) else 1)


if __name__ == "__main__":
    main()
