"""`llamatui quantize IN.gguf OUT.gguf TYPE [THREADS]`: llama-quantize's conversion."""
import sys

from rich.console import Console

from llamatui.inference import MIXES
from llamatui.models.store import resolve_model

from . import CommandError
from .progress import byte_progress


# The mixes the quantizer writes, from the catalog (which imports no numba: `llamatui` starts fast).
TYPE_NAMES = [m.name for m in MIXES if m.quantizable]


def add_arguments(p):
    p.add_argument("input", metavar="IN.gguf", help="the model to quantize (F32/F16/BF16)")
    p.add_argument("output", metavar="OUT.gguf", help="where to write the quantized model")
    p.add_argument("type", metavar="TYPE",
                   help=f"the quantization mix: {', '.join(TYPE_NAMES)} (Q3_K, Q4_K, Q5_K: the "
                        "_M mixes)")
    p.add_argument("threads", metavar="THREADS", nargs="?", type=int, default=None,
                   help="threads (default: all cores)")
    p.add_argument("--imatrix", metavar="FILE",
                   help="importance matrix from `llamatui imatrix` or llama-imatrix (GGUF or .dat); "
                        "required by IQ1_S, IQ1_M, IQ2_*, IQ3_XXS, IQ3_XS and Q2_K_S")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow converting tensors that are already quantized (loses quality)")
    p.add_argument("--output-tensor-type", metavar="T", help="ggml type for output.weight")
    p.add_argument("--token-embedding-type", metavar="T",
                   help="ggml type for token_embd.weight")
    p.add_argument("--leave-output-tensor", action="store_true",
                   help="leave output.weight as it is")
    p.add_argument("--pure", action="store_true",
                   help="no k-quant mix: every quantized tensor gets TYPE's base type")
    p.add_argument("--eval", metavar="TEXT",
                   help="afterwards, compare the new model with the input on this text file: "
                        "perplexity and KL divergence")
    p.add_argument("--eval-ctx", type=int, default=128, metavar="N",
                   help="context of the --eval chunks (default 128)")
    p.add_argument("--eval-chunks", type=int, default=4, metavar="N",
                   help="chunks scored by --eval (default 4; 0 = the whole text)")


def run(args):
    from llamatui.quantizer.model import parse_ftype, quantize_model

    ftype = parse_ftype(args.type)
    src = resolve_model(args.input)
    if args.threads is not None:
        import numba
        if args.threads < 1:
            raise CommandError("THREADS must be at least 1")
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    eval_text = None
    if args.eval:
        with open(args.eval, encoding="utf-8") as f:
            eval_text = f.read()
    console = Console(stderr=True)
    console.print(f"quantizing {src} to {args.output} as {ftype.name}")
    with byte_progress(console) as report:
        result = quantize_model(
            src, args.output, ftype, imatrix=args.imatrix,
            allow_requantize=args.allow_requantize,
            output_tensor_type=args.output_tensor_type,
            token_embedding_type=args.token_embedding_type, pure=args.pure,
            leave_output_tensor=args.leave_output_tensor,
            progress=lambda done, total: report(f"Quantizing to {ftype.name}", done, total))

    mib = 1024 * 1024
    counts = ", ".join(f"{t} {n}" for t, n in sorted(result.type_counts().items()))
    print(f"tensors: {counts}")
    if result.n_fallback:
        print(f"{result.n_fallback} of {len(result.plans)} tensor(s) needed a fallback type "
              "(row length not a multiple of the block)")
    if args.imatrix:
        print(f"importance matrix used for {len(result.imatrix_used)} tensor(s)")
    print(f"model size = {result.src_tensor_bytes / mib:8.2f} MiB "
          f"({result.src_bits_per_weight:.2f} BPW)")
    print(f"quant size = {result.dst_tensor_bytes / mib:8.2f} MiB "
          f"({result.bits_per_weight:.2f} BPW), file {result.file_size / mib:.2f} MiB")
    print(f"quantize time = {result.seconds * 1000:8.2f} ms")

    if eval_text is not None:
        from llamatui.quantizer.model import evaluate_against
        console.print(f"evaluating on {args.eval} (n_ctx {args.eval_ctx}, "
                      f"{args.eval_chunks or 'all'} chunks)…")
        ev = evaluate_against(src, args.output, eval_text, n_ctx=args.eval_ctx,
                              n_chunks=args.eval_chunks, threads=args.threads)
        print(f"eval: {ev.n_chunks} chunks of {ev.n_ctx}, {ev.n_scored} tokens scored")
        print(f"  size        {result.file_size / mib:.2f} MiB, "
              f"{result.bits_per_weight:.2f} bits per weight")
        print(f"  perplexity  {ev.ppl:.4f} (source {ev.ppl_base:.4f}, "
              f"{(ev.ppl / ev.ppl_base - 1) * 100:+.2f}%)")
        print(f"  mean KLD    {ev.kld_mean:.6f} ± {ev.kld_stderr:.6f}")
        print(f"  same top token {ev.top1_agreement * 100:.1f}% of the time")
    sys.stdout.flush()
    return 0
