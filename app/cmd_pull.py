"""`llamatui pull NAME`: fetch a starter model into the store."""
import sys

from llamatui.models.store import STARTER_MODELS, pull_starter, store_dir

from .progress import byte_progress


def add_arguments(p):
    p.add_argument("name", help="starter model: " + ", ".join(STARTER_MODELS))


def run(args):
    quiet = not sys.stderr.isatty()
    with byte_progress() as report:
        path = pull_starter(args.name, store=store_dir(), progress=report, quiet=quiet)
    print(path)
