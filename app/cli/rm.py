"""`llamatui rm NAME`: delete a model (all its shards) and its sidecar from the store."""
from llamatui.models.store import delete_model, store_dir


def add_arguments(p):
    p.add_argument("name", nargs="+", help="a model as `llamatui ls` names it, its file name, "
                   "a starter name, or owner/repo:QUANT")


def run(args):
    for name in args.name:
        removed = delete_model(name, store=store_dir())
        for f in removed:
            print(f"removed {f}")
    return 0
