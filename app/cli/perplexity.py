"""`llamatui perplexity -m MODEL -f FILE -c N`: llama-perplexity's measurement.

With `--kl-divergence-base OUT` the run also writes the base model's log-probabilities in
llama-perplexity's format; with `--kl-divergence-base FILE --kl-divergence` it scores the model
against such a file (written by either program) and prints llama-perplexity's statistics.
"""
import sys

from llamatui.inference import (KLD_CHUNK_HEADER, LogitsFile, LogitsFileWriter, count_chunks,
                                kld_chunk_line, kld_report, run_kl_divergence, run_perplexity)

from .engine_args import add_model_arguments, load_engine
from . import UsageError
from .flags import add_chunks, chunk_limit


def add_arguments(p):
    add_model_arguments(p, default_ctx=512, model_ctx=False)
    p.add_argument("-f", "--file", help="text file to score")
    add_chunks(p)
    p.add_argument("--kl-divergence-base", metavar="FNAME",
                   help="file of the base model's log-probabilities: written by a plain run, "
                        "read with --kl-divergence (llama-perplexity's format)")
    p.add_argument("--kl-divergence", action="store_true",
                   help="compare the model with the log-probabilities in --kl-divergence-base")


def run(args):
    if args.kl_divergence:
        if not args.kl_divergence_base:
            raise UsageError("--kl-divergence needs --kl-divergence-base FNAME: the file of the "
                             "base model's log-probabilities")
        return run_kl(args)
    if not args.file:
        raise UsageError("-f/--file is required: the text file to score")
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    engine = load_engine(args)
    try:
        score_text(engine, text, args)
    finally:
        engine.close()


def score_text(engine, text: str, args) -> None:
    tok = engine.tokenizer
    tokens = tok.encode(text, add_special=True, parse_special=False)
    bos = tok.bos_id if tok.add_bos else None
    n_chunks = count_chunks(len(tokens), args.ctx_size, chunk_limit(args.chunks))
    print(f"tokenized {len(tokens)} tokens; {n_chunks} chunks of {args.ctx_size}",
          file=sys.stderr)
    writer = None
    if args.kl_divergence_base:
        writer = LogitsFileWriter(args.kl_divergence_base, args.ctx_size, engine.info.n_vocab,
                                  tokens, n_chunks)
        print(f"saving all logits to {args.kl_divergence_base}", file=sys.stderr)

    def on_chunk(i, n, ppl):
        print(f"[{i}]{ppl:.4f},", end="", flush=True)

    try:
        result = run_perplexity(engine.logits, tokens, args.ctx_size, bos, n_chunks, on_chunk,
                                writer.write_chunk if writer else None)
    except BaseException:
        if writer:
            writer.abort()
        raise
    if writer:
        writer.close()
    print()
    print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.stderr:.5f}")


def run_kl(args) -> None:
    base = LogitsFile.open(args.kl_divergence_base)
    if base.n_ctx > args.ctx_size:
        raise UsageError(f"{base.path} has been computed with {base.n_ctx}, while the current "
                         f"context is {args.ctx_size}. Increase it with -c and retry")
    engine = load_engine(args)
    try:
        tok = engine.tokenizer
        bos = tok.bos_id if tok.add_bos else None
        print(f"computing over {base.n_chunks} chunks, n_ctx={base.n_ctx}", file=sys.stderr)
        print(KLD_CHUNK_HEADER)

        def on_chunk(i, n, running):
            print(kld_chunk_line(i, running), flush=True)

        result = run_kl_divergence(engine.logits, base, bos, engine.info.n_vocab, on_chunk)
    finally:
        engine.close()
    print()
    for line in kld_report(result):
        print(line)
