"""`llamatui run -m MODEL -p PROMPT`: generate text, or chat in the terminal with --chat."""
import math
import sys

from rich.console import Console

from llamatui.inference import ConstraintSpec, SamplingParams

from . import CommandError, UsageError
from .engine_args import add_chat_template_arguments, add_model_arguments, load_engine
from .flags import checked, finite_float, int_at_least, probability


def add_arguments(p):
    add_model_arguments(p)
    add_chat_template_arguments(p)
    p.add_argument("-p", "--prompt", default=None,
                   help="prompt to start generation with (raw text, no chat template)")
    p.add_argument("-f", "--file", default=None, help="a file containing the prompt")
    p.add_argument("-n", "--n-predict", "--predict", type=int_at_least(-2, N_PREDICT_RULE),
                   default=-1, metavar="N",
                   help="number of tokens to predict (default: -1, -1 = until end of "
                        "generation, -2 = until the context is full)")
    add_sampling_arguments(p)
    add_constraint_arguments(p)
    p.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="PROMPT",
                   help="halt generation at PROMPT (may be repeated)")
    p.add_argument("--chat", action="store_true",
                   help="interactive chat using the model's chat template")
    p.add_argument("-sys", "--system-prompt", default=None, metavar="PROMPT",
                   help="system message for --chat")


N_PREDICT_RULE = "must be at least -2 (-1 = until end of generation, -2 = until the context " \
                 "is full)"


def add_sampling_arguments(p):
    """llama.cpp's sampling flags, defaults and help (common/arg.cpp)."""
    s = SamplingParams()
    p.add_argument("--temp", "--temperature", type=finite_float("temp must be finite"),
                   default=s.temperature, metavar="N",
                   help=f"temperature (default: {s.temperature:.2f}, 0 or less = greedy)")
    p.add_argument("--top-k", type=int_at_least(0, "must be at least 0 (0 = disabled)"),
                   default=s.top_k, metavar="N",
                   help=f"top-k sampling (default: {s.top_k}, 0 = disabled)")
    for flag, dest, value, off, what in (
            ("--top-p", "top_p", s.top_p, "1.0", "top-p sampling"),
            ("--min-p", "min_p", s.min_p, "0.0", "min-p sampling"),
            ("--typical", "typical_p", s.typical_p, "1.0",
             "locally typical sampling, parameter p")):
        p.add_argument(flag, dest=dest, type=probability(flag[2:], off), default=value,
                       metavar="N", help=f"{what} (default: {value:.2f}, {off} = disabled)")
    p.add_argument("--repeat-last-n", metavar="N", default=s.repeat_last_n,
                   type=checked(int, lambda v: v >= -1,
                                "invalid repeat-last-n (0 = disabled, -1 = ctx size)"),
                   help=f"last n tokens to consider for penalize (default: {s.repeat_last_n}, "
                        "0 = disabled, -1 = ctx size)")
    p.add_argument("--repeat-penalty", metavar="N", default=s.repeat_penalty,
                   type=checked(float, _finite_and_positive,
                                "repeat-penalty must be finite and greater than 0"),
                   help=f"penalize repeat sequence of tokens (default: {s.repeat_penalty:.2f}, "
                        "1.0 = disabled)")
    for flag, value in (("--presence-penalty", s.presence_penalty),
                        ("--frequency-penalty", s.frequency_penalty)):
        p.add_argument(flag, type=finite_float(f"{flag[2:]} must be finite"), default=value,
                       metavar="N", help=f"repeat alpha {flag[2:-8]} penalty "
                                         f"(default: {value:.2f}, 0.0 = disabled)")
    p.add_argument("-s", "--seed", metavar="SEED", default=-1,
                   type=checked(int, lambda v: -1 <= v < 2**32,
                                "seed must be -1 (random) or between 0 and 4294967295"),
                   help="RNG seed (default: -1, use random seed for -1)")


def add_constraint_arguments(p):
    """llama.cpp's structured-output flags (common/arg.cpp); one of them at most."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--grammar", metavar="GRAMMAR", default=None,
                       help="GBNF grammar (llama.cpp's grammars/ format) to constrain "
                            "generations")
    group.add_argument("--grammar-file", metavar="FNAME", default=None,
                       help="file to read the GBNF grammar from")
    group.add_argument("-j", "--json-schema", metavar="SCHEMA", default=None,
                       help='JSON schema to constrain generations (https://json-schema.org/), '
                            'e.g. \'{"type": "object"}\' for any JSON object')
    group.add_argument("-jf", "--json-schema-file", metavar="FILE", default=None,
                       help="file containing a JSON schema to constrain generations")


def constraint_from_args(args) -> ConstraintSpec | None:
    """The flags' constraint, read and checked (ConstraintError names what is refused) before
    the model loads."""
    if args.grammar is not None:
        spec = ConstraintSpec("gbnf", args.grammar)
    elif args.json_schema is not None:
        spec = ConstraintSpec("json_schema", args.json_schema)
    elif args.grammar_file or args.json_schema_file:
        path = args.grammar_file or args.json_schema_file
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise CommandError(f"cannot read {path}: {e}") from None
        spec = ConstraintSpec("gbnf" if args.grammar_file else "json_schema", text)
    else:
        return None
    spec.compile()
    return spec


def _finite_and_positive(v: float) -> bool:
    return v > 0 and math.isfinite(v) and math.isfinite(1 / v)  # 1/v: penalties divide by it


def sampling_from_args(args) -> dict:
    """The engine's sampling options; max_tokens is set per prompt (see generation_budget)."""
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                typical_p=args.typical_p, repeat_penalty=args.repeat_penalty,
                repeat_last_n=args.repeat_last_n, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty,
                seed=None if args.seed < 0 else args.seed, stop=tuple(args.reverse_prompt))


def generation_budget(engine, prompt, n_predict: int) -> int | None:
    """-n as the engine's max_tokens, llama.cpp's meanings: N tokens, -1 (None) until end of
    generation, -2 until the context is full: what is left after the prompt as it will be
    evaluated (cut to fit, if it does not), as llama-completion stops when n_past reaches n_ctx."""
    if n_predict == -1:
        return None
    if n_predict == -2:
        return engine.info.n_ctx - len(engine.fit_prompt(engine.prompt_tokens(prompt)))
    return n_predict


def stream(engine, prompt, sampling, err):
    """Prints a generation as it arrives; returns (text, final event). A prompt cut to fit the
    context is reported on `err` first, as llama.cpp warns of truncated input."""
    parts = []
    for event in engine.generate(prompt, **sampling):
        if event.kind == "prompt" and event.n_prompt_dropped:
            n_given = event.n_prompt + event.n_prompt_dropped
            err.print(f"[yellow]warning: input truncated: the prompt is {n_given} tokens but the "
                      f"context holds {event.kv_total} (-c); {event.n_prompt_dropped} tokens "
                      f"after the first --keep were dropped, {event.n_prompt} kept[/]",
                      soft_wrap=True)
        if event.text:
            sys.stdout.write(event.text)
            sys.stdout.flush()
            parts.append(event.text)
        if event.kind == "done":
            return "".join(parts), event
    raise RuntimeError("generation ended without a final event")


def reply(engine, prompt, sampling, n_predict: int, err):
    """One generation with -n's meaning, printed as it arrives and followed by its statistics;
    returns (text, final event). -n 0 generates nothing (event None), as llama-completion's
    loop never starts with n_remain 0."""
    if n_predict == 0:
        return "", None
    budget = generation_budget(engine, prompt, n_predict)
    text, event = stream(engine, prompt, {**sampling, "max_tokens": budget}, err)
    if n_predict == -2 and event.finish_reason == "length":
        err.print("\n[dim]context full and n_predict == -2 => stopping[/]")  # llama-completion's
    print_stats(event, err)
    if cut_short(event):
        err.print(f"[yellow]warning: generation stopped ({event.finish_reason}) before the "
                  f"grammar was complete: the output does not match it[/]", soft_wrap=True)
    return text, event


def cut_short(event) -> bool:
    """A constrained generation that ended before its grammar did (only the grammar's end lets
    EOG through, so any other stop leaves output that does not match)."""
    return event is not None and event.constrained and event.finish_reason != "eog"


def print_stats(event, console):
    console.print(
        f"\n[dim]prompt: {event.n_prompt} tokens ({event.n_reused} cached), "
        f"{event.prompt_tps:.1f} tok/s | generated: {event.n_generated} tokens, "
        f"{event.gen_tps:.1f} tok/s | first token after {event.time_to_first_token:.2f} s | "
        f"KV {event.kv_used}/{event.kv_total} | stop: {event.finish_reason}"
        + (f" | constrained: {event.n_forced} tokens forced, {event.mask_ms:.3f} ms/token"
           if event.constrained else "") + "[/]", soft_wrap=True)


def run(args):
    err = Console(stderr=True)
    if args.chat:
        if args.prompt or args.file:
            raise UsageError("--chat reads messages interactively; drop -p/-f")
    elif args.prompt is not None and args.file:
        raise UsageError("give the prompt with -p or -f, not both")
    elif args.file:
        with open(args.file, encoding="utf-8") as f:
            args.prompt = f.read()
    elif args.prompt is None:
        raise UsageError("give a prompt with -p or -f, or use --chat")
    sampling = sampling_from_args(args)
    spec = constraint_from_args(args)
    if spec is not None:
        sampling["constraint"] = spec
    engine = load_engine(args)
    try:
        if args.keep == -1:
            engine.n_keep = _keep_all(engine, args)
        if not args.chat:
            event = reply(engine, args.prompt, sampling, args.n_predict, err)[1]
            return 1 if cut_short(event) else 0
        return chat(engine, sampling, args.system_prompt, args.n_predict, err)
    finally:
        engine.close()


def _keep_all(engine, args) -> int:
    """--keep -1: the whole prompt, or in a chat the system message (llama-completion's
    conversation mode starts from it; nothing without one)."""
    if not args.chat:
        return len(engine.prompt_tokens(args.prompt))
    if not args.system_prompt:
        return 0
    system = [{"role": "system", "content": args.system_prompt}]
    text = engine.apply_chat_template(system, add_generation_prompt=False)
    return len(engine.tokenize(text, parse_special=True))


def chat(engine, sampling, system_prompt, n_predict, err):
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    err.print("[dim]Chat: type a message, Enter to send; /reset starts over, Ctrl-D quits.[/]")
    while True:
        try:
            line = input("\n> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            continue
        if line.strip() == "/reset":
            messages = messages[:1] if system_prompt else []
            continue
        messages.append({"role": "user", "content": line})
        try:
            answer = reply(engine, messages, sampling, n_predict, err)[0]
        except KeyboardInterrupt:
            engine.cancel()
            messages.pop()
            err.print("\n[dim](stopped)[/]")
            continue
        messages.append({"role": "assistant", "content": answer})
