"""`zoo list` and `zoo info MODEL`: the registered models."""

import json

import zoo


def _list(args):
    specs = {name: zoo.spec(name) for name in zoo.names()}
    width, family_width = max(map(len, specs)), max(len(s.family) for s in specs.values())
    for name, s in specs.items():
        print(f"{name:{width}s} {s.family:{family_width}s} {s.num_params() / 1e6:8.1f}M  {s.description}")
    return 0


def _info(args):
    s = zoo.spec(args.model)
    print(json.dumps({"name": args.model, **s.to_dict(), "num_params": s.num_params()}, indent=2))
    return 0


def register(subparsers):
    p = subparsers.add_parser("list", help="registered models")
    p.set_defaults(func=_list)
    p = subparsers.add_parser("info", help="a model's spec and parameter count")
    p.add_argument("model")
    p.set_defaults(func=_info)
