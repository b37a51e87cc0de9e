"""`zoo list` and `zoo info MODEL`: the registered models."""

import json

import zoo


def _list(args):
    for name in zoo.names():
        s = zoo.spec(name)
        print(f"{name:10s} {s.family:6s} {s.num_params() / 1e6:8.1f}M  {s.description}")
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
