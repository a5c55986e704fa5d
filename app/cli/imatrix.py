"""`llamatui imatrix -m MODEL -f TEXT -o FILE`: llama-imatrix's activation statistics."""
import os
import sys
import time

from llamatui.models.store import resolve_model

from .flags import add_chunks, add_ctx_size, add_threads, chunk_limit


def add_arguments(p):
    p.add_argument("-m", "--model", required=True, help="GGUF file, or a model name in the store")
    p.add_argument("-f", "--file", required=True, help="text to run the model over")
    p.add_argument("-o", "--output", default="imatrix.gguf",
                   help="where to write the importance matrix (default imatrix.gguf)")
    from llamatui.quantizer.imatrix import MIN_ROWS
    add_ctx_size(p, 512, model_default=False, what="tokens per chunk",
                 minimum=2 * MIN_ROWS)  # collect_imatrix refuses smaller chunks
    add_chunks(p)
    add_threads(p)
    p.add_argument("--process-output", action="store_true",
                   help="collect data for output.weight too")


def run(args):
    from llamatui.inference import default_threads
    from llamatui.quantizer.imatrix import collect_imatrix

    path = resolve_model(args.model)
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    threads = args.threads or default_threads()
    print(f"computing over chunks of {args.ctx_size} tokens of {args.file}", file=sys.stderr)
    t0 = time.perf_counter()

    def on_chunk(i, n, ppl):
        if i == 1:
            eta = (time.perf_counter() - t0) * (n - 1)
            print(f"{n} chunks, about {eta:.0f} s to go", file=sys.stderr)
        print(f"[{i}]{ppl:.4f},", end="", flush=True)

    imatrix, result = collect_imatrix(path, text, n_ctx=args.ctx_size,
                                      n_chunks=chunk_limit(args.chunks), threads=threads,
                                      process_output=args.process_output,
                                      dataset=args.file, on_chunk=on_chunk)
    print()
    imatrix.save(args.output)
    print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.stderr:.5f}")
    print(f"stored collected data after {imatrix.chunk_count} chunks for "
          f"{len(imatrix.entries)} tensors in {os.fspath(args.output)}")
    return 0
