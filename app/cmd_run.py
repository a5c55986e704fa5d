"""`llamatui run -m MODEL -p PROMPT`: generate text, or chat in the terminal with --chat."""
import sys

from rich.console import Console

from .engine_args import add_chat_template_arguments, add_model_arguments, load_engine


def add_arguments(p):
    add_model_arguments(p)
    add_chat_template_arguments(p)
    p.add_argument("-p", "--prompt", default=None, help="the prompt (raw text, no template)")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    p.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="tokens to generate (-1: until end of generation)")
    p.add_argument("--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--typical", type=float, default=1.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("-r", "--reverse-prompt", action="append", default=[],
                   help="stop string (may be repeated)")
    p.add_argument("--chat", action="store_true",
                   help="interactive chat using the model's chat template")
    p.add_argument("-sys", "--system-prompt", default=None, help="system message for --chat")


def sampling_from_args(args) -> dict:
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                typical_p=args.typical, repeat_penalty=args.repeat_penalty,
                repeat_last_n=args.repeat_last_n, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty, seed=args.seed,
                max_tokens=None if args.n_predict < 0 else args.n_predict,
                stop=tuple(args.reverse_prompt))


def stream(engine, prompt, sampling, out=sys.stdout):
    """Prints a generation as it arrives; returns (text, final event)."""
    parts = []
    for event in engine.generate(prompt, **sampling):
        if event.text:
            out.write(event.text)
            out.flush()
            parts.append(event.text)
        if event.kind == "done":
            return "".join(parts), event
    raise RuntimeError("generation ended without a final event")


def print_stats(event, console):
    console.print(
        f"\n[dim]prompt: {event.n_prompt} tokens ({event.n_reused} cached), "
        f"{event.prompt_tps:.1f} tok/s | generated: {event.n_generated} tokens, "
        f"{event.gen_tps:.1f} tok/s | first token after {event.time_to_first_token:.2f} s | "
        f"KV {event.kv_used}/{event.kv_total} | stop: {event.finish_reason}[/]")


def run(args):
    err = Console(stderr=True)
    if args.chat:
        if args.prompt or args.file:
            raise ValueError("--chat reads messages interactively; drop -p/-f")
    elif args.file:
        with open(args.file, encoding="utf-8") as f:
            args.prompt = f.read()
    elif args.prompt is None:
        raise ValueError("give a prompt with -p or -f, or use --chat")
    sampling = sampling_from_args(args)
    engine = load_engine(args)
    try:
        if not args.chat:
            _, event = stream(engine, args.prompt, sampling)
            print_stats(event, err)
            return 0
        return chat(engine, sampling, args.system_prompt, err)
    finally:
        engine.close()


def chat(engine, sampling, system_prompt, err):
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
            reply, event = stream(engine, messages, sampling)
        except KeyboardInterrupt:
            engine.cancel()
            messages.pop()
            err.print("\n[dim](stopped)[/]")
            continue
        messages.append({"role": "assistant", "content": reply})
        print_stats(event, err)
