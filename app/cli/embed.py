"""`llamatui embed -m MODEL [--pooling mean|cls|last] TEXT...`: llama-embedding's vectors, one
line per text (its `--embd-output-format` default's raw form: values separated by spaces), each
pooled as the model says (or --pooling) and normalized as --embd-normalize says."""
from .engine_args import add_model_arguments, load_engine
from .flags import int_at_least


def add_arguments(p):
    from llamatui.inference import POOLINGS
    add_model_arguments(p, default_ctx=512)
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="how a text's token states become one vector (default: the model's "
                        "own pooling_type; a chat model has none, so choose one)")
    p.add_argument("--embd-normalize", type=int_at_least(-1, "must be -1 (none), 0 (max "
                                                             "absolute), 2 (Euclidean) or p > 0"),
                   default=2, metavar="N",
                   help="-1 none, 0 max absolute (int16 range), 2 Euclidean (default), "
                        "p > 0 p-norm")
    p.add_argument("text", nargs="+", help="the texts to embed, one vector each")


def run(args):
    engine = load_engine(args)
    try:
        vectors = engine.embed(args.text, pooling=args.pooling, normalize_as=args.embd_normalize)
    finally:
        engine.close()
    for row in vectors:
        print(" ".join(f"{v:.7f}" for v in row))
