"""The `llamatui` command: with no arguments the chat app, otherwise one of the subcommands.

Each subcommand lives in its own module and is imported only when its name is on the command line,
so `llamatui --help` stays instant (the engine pulls in numba, which takes a while to import).
Flag errors are one line, exit status 2, as argparse's (without its usage block).
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name → help; each command is the module llamatui.app.cli.<name>, with add_arguments(p) and run(args)
COMMANDS = {
    "pull": "download a starter model, or a Hub model (owner/repo[:QUANT])",
    "ls": "list the models in the store",
    "rm": "delete a model from the store",
    "search": "search the Hugging Face Hub for GGUF models",
    "hw": "show this machine's RAM, CPU, GPUs and disk",
    "inspect": "show a GGUF file's metadata and tensors",
    "run": "generate text from a prompt, or chat in the terminal (--chat)",
    "tokenize": "print the token ids of a text",
    "embed": "print the embedding vector of each text, like llama-embedding",
    "perplexity": "measure perplexity on a text file like llama-perplexity",
    "bench": "measure prompt and generation speed like llama-bench",
    "quantize": "quantize a GGUF model like llama-quantize",
    "imatrix": "collect an importance matrix for quantizing, like llama-imatrix",
    "serve": "serve a model over an OpenAI-compatible HTTP API, like llama-server",
}


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1, no traceback."""


class UsageError(Exception):
    """A bad command line: printed as one line, exit status 2 (argparse's)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse reporting a bad command line as one line ("llamatui run: error: argument
    -t/--threads: ...") by raising UsageError, which main() prints."""

    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message}")


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The whole command line; `commands` limits which subcommands get their flags (and so are
    imported): main() passes the names on the command line, None means all."""
    parser = OneLineParser(
        prog="llamatui",
        description="Local LLMs in your terminal: GGUF models run by a Python engine.")
    parser.add_argument("-m", "--model", help="open the chat app with this GGUF file")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="run `llamatui COMMAND --help` for its flags")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if commands is None or name in commands:
            _module(name).add_arguments(p)
    return parser


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A subcommand chosen by argparse is always one of these words of the command line.
    try:
        args = build_parser(set(argv) & COMMANDS.keys()).parse_args(argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        return 2
    if args.command is None:
        from ..tui.app import run_app  # textual is imported only for the app
        return run_app(model=args.model)
    try:
        return _module(args.command).run(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UsageError as e:  # a combination of flags that argparse cannot check
        print(f"llamatui {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (CommandError, OSError, ValueError, RuntimeError) as e:
        # Errors from our layers carry specific messages (GGUFError, StoreError, ...).
        print(f"llamatui {args.command}: error: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:  # numpy's names the allocation: "Unable to allocate 358. GiB ..."
        print(f"llamatui {args.command}: error: not enough memory: {e}", file=sys.stderr)
        return 1

