"""`llamatui perplexity -m MODEL -f FILE -c N`: llama-perplexity's measurement."""
import sys

from llamatui.inference import run_perplexity

from .engine_args import add_model_arguments, load_engine
from .flags import add_chunks, chunk_limit


def add_arguments(p):
    add_model_arguments(p, default_ctx=512, model_ctx=False)
    p.add_argument("-f", "--file", required=True, help="text file to score")
    add_chunks(p)


def run(args):
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    engine = load_engine(args)
    try:
        tok = engine.tokenizer
        tokens = tok.encode(text, add_special=True, parse_special=False)
        bos = tok.bos_id if tok.add_bos else None
        print(f"tokenized {len(tokens)} tokens; {len(tokens) // args.ctx_size} chunks of "
              f"{args.ctx_size}", file=sys.stderr)

        def on_chunk(i, n, ppl):
            print(f"[{i}]{ppl:.4f},", end="", flush=True)

        result = run_perplexity(engine.logits, tokens, args.ctx_size, bos,
                            chunk_limit(args.chunks), on_chunk)
        print()
        print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.stderr:.5f}")
    finally:
        engine.close()
