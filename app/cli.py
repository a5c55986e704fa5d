"""The `llamatui` command: with no arguments the chat app, otherwise one of the subcommands.

Each subcommand lives in its own module and is imported only when its name is on the command line,
so `llamatui --help` stays instant (the engine pulls in numba, which takes a while to import).
Flag errors are one line, exit status 2, as argparse's (without its usage block).
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name → (module in llamatui.app, help)
COMMANDS = {
    "pull": ("cmd_pull", "download a starter model, or a Hub model (owner/repo[:QUANT])"),
    "ls": ("cmd_ls", "list the models in the store"),
    "rm": ("cmd_rm", "delete a model from the store"),
    "search": ("cmd_search", "search the Hugging Face Hub for GGUF models"),
    "hw": ("cmd_hw", "show this machine's RAM, CPU, GPUs and disk"),
    "inspect": ("cmd_inspect", "show a GGUF file's metadata and tensors"),
    "run": ("cmd_run", "generate text from a prompt, or chat in the terminal (--chat)"),
    "tokenize": ("cmd_tokenize", "print the token ids of a text"),
    "embed": ("cmd_embed", "print the embedding vector of each text, like llama-embedding"),
    "perplexity": ("cmd_perplexity", "measure perplexity on a text file like llama-perplexity"),
    "bench": ("cmd_bench", "measure prompt and generation speed like llama-bench"),
    "quantize": ("cmd_quantize", "quantize a GGUF model like llama-quantize"),
    "imatrix": ("cmd_imatrix", "collect an importance matrix for quantizing, like llama-imatrix"),
    "serve": ("cmd_serve", "serve a model over an OpenAI-compatible HTTP API, like llama-server"),
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
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if commands is None or name in commands:
            _module(module).add_arguments(p)
    return parser


def _module(name: str):
    return importlib.import_module(f"llamatui.app.{name}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A subcommand chosen by argparse is always one of these words of the command line.
    try:
        args = build_parser(set(argv) & COMMANDS.keys()).parse_args(argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        return 2
    if args.command is None:
        from .tui import run_app  # textual is imported only for the app
        return run_app(model=args.model)
    try:
        return _module(COMMANDS[args.command][0]).run(args) or 0
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


if __name__ == "__main__":
    # `python -m llamatui.app.cli`: run the package's module, whose exception classes are the
    # ones the subcommands import, not this __main__ copy's.
    from llamatui.app.cli import main as package_main
    sys.exit(package_main())
