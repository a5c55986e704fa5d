"""The CLI's flags behave like llama.cpp's: range-checked before anything loads, -n's special
values, help for every flag, and a warning when a prompt is cut to fit the context."""
import argparse
import ast
import re

import pytest

from llamatui.app import cli
from llamatui.app.cli import build_parser, main
from llamatui.app.cli.run import sampling_from_args
from llamatui.app.cli.flags import max_threads
from llamatui.inference import Engine
from llamatui.inference.sampling import SamplingParams

MISSING = "/nonexistent/model.gguf"  # loading it would fail with "no model file"


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_flag_of_every_command_has_help():
    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) == set(cli.COMMANDS)
    missing = [f"{p.prog} {a.option_strings or a.dest}"
               for p in (parser, *commands.values()) for a in p._actions
               if not (a.help or "").strip()]
    assert missing == []


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")
    monkeypatch.setattr(Engine, "load", refuse)


FLAG_ERRORS = [
    # (command line after the model flag, the flag argparse names, words of the error)
    ("run -p hi -n -3", "-n/--n-predict", "must be at least -2 (-1 = until end of generation, "
                                          "-2 = until the context is full), got -3"),
    ("run -p hi -n -5", "-n/--n-predict", "got -5"),
    ("run -p hi --temp nan", "--temp", "temp must be finite, got nan"),
    ("run -p hi --temp inf", "--temp", "temp must be finite"),
    ("run -p hi --top-k -2", "--top-k", "must be at least 0 (0 = disabled), got -2"),
    ("run -p hi --top-p 1.5", "--top-p", "top-p must be between 0.0 and 1.0"),
    ("run -p hi --top-p -0.1", "--top-p", "top-p must be between 0.0 and 1.0"),
    ("run -p hi --min-p 2", "--min-p", "min-p must be between 0.0 and 1.0"),
    ("run -p hi --typical -1", "--typical", "typical must be between 0.0 and 1.0"),
    ("run -p hi --repeat-last-n -2", "--repeat-last-n", "invalid repeat-last-n"),
    ("run -p hi --repeat-penalty 0", "--repeat-penalty",
     "repeat-penalty must be finite and greater than 0, got 0"),
    ("run -p hi --repeat-penalty -1", "--repeat-penalty", "greater than 0"),
    ("run -p hi --presence-penalty inf", "--presence-penalty", "presence-penalty must be finite"),
    ("run -p hi --frequency-penalty nan", "--frequency-penalty",
     "frequency-penalty must be finite"),
    ("run -p hi -s -2", "-s/--seed", "seed must be -1 (random)"),
    ("run -p hi -s 4294967296", "-s/--seed", "seed must be -1 (random)"),
    ("run -p hi -t 0", "-t/--threads", "must be between 1 and"),
    ("run -p hi -c -5", "-c/--ctx-size", "minimum context size is 8 (0 = loaded from model), "
                                         "got -5"),
    ("run -p hi -c 4", "-c/--ctx-size", "minimum context size is 8"),
    ("run -p hi --keep -2", "--keep", "must be at least 0 (-1 = all), got -2"),
    ("run -p hi -n abc", "-n/--n-predict", "invalid int value: 'abc'"),
    ("perplexity -f x.txt -c 0", "-c/--ctx-size", "minimum context size is 8, got 0"),
    ("perplexity -f x.txt -t 0", "-t/--threads", "must be between 1 and"),
    ("perplexity -f x.txt --chunks 0", "--chunks", "must be at least 1 (-1 = all), got 0"),
    ("perplexity -f x.txt --keep -3", "--keep", "must be at least 0"),
    ("imatrix -f x.txt -c 16", "-c/--ctx-size", "minimum context size is 32, got 16"),
    ("imatrix -f x.txt --chunks -5", "--chunks", "must be at least 1 (-1 = all)"),
    ("imatrix -f x.txt -t -1", "-t/--threads", "must be between 1 and"),
    ("bench -t 0", "-t/--threads", "must be between 1 and"),
    ("bench -p -1", "-p/--n-prompt", "cannot be negative, got -1"),
    ("bench -n -1", "-n/--n-gen", "cannot be negative, got -1"),
    ("bench -d -1", "-d/--n-depth", "cannot be negative, got -1"),
    ("bench -r 0", "-r/--repetitions", "must be at least 1, got 0"),
]


@pytest.mark.parametrize("line,flag,words", FLAG_ERRORS)
def test_a_bad_value_is_one_line_exit_2_before_the_model_loads(line, flag, words, capsys,
                                                               no_model_load):
    command, *rest = line.split()
    assert main([command, "-m", MISSING, *rest]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"llamatui {command}: error: argument {flag}")
    assert words in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_threads_above_what_numba_can_start_are_refused(capsys, no_model_load):
    too_many = max_threads() + 1
    assert main(["run", "-m", MISSING, "-p", "hi", "-t", str(too_many)]) == 2
    err = capsys.readouterr().err
    assert f"must be between 1 and {too_many - 1}" in err and f"got {too_many}" in err
    assert main(["run", "-m", MISSING, "-p", "hi", "-t", str(too_many - 1)]) == 1
    assert "no model file" in capsys.readouterr().err  # accepted: the model was looked for


def test_search_limit_and_context_are_checked(capsys):
    for args, words in ((["-n", "0"], "must be between 1 and 1000"),
                        (["-n", "1001"], "must be between 1 and 1000"),
                        (["-c", "-1"], "minimum context size is 8")):
        assert main(["search", "llama", *args]) == 2
        assert words in capsys.readouterr().err


@pytest.mark.parametrize("line,problem", [
    ("run", "give a prompt with -p or -f, or use --chat"),
    ("run --chat -p hi", "--chat reads messages interactively"),
    ("run -p hi -f x.txt", "not both"),
    ("bench -p 0 -n 0", "no test to run"),
])
def test_flag_combinations_are_usage_errors(line, problem, capsys, no_model_load):
    command, *rest = line.split()
    assert main([command, "-m", MISSING, *rest]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llamatui {command}: error: ") and problem in err


def test_values_llama_cpp_gives_a_meaning_are_accepted_and_reach_the_engine():
    """Negative --temp is greedy, -s -1 a random seed, -1/-2 for -n, -1 for --keep and
    --repeat-last-n; every accepted edge value must be one the engine accepts too."""
    parse = build_parser({"run"}).parse_args
    base = ["run", "-m", MISSING, "-p", "hi"]
    args = parse(base + ["--temp", "-1", "-s", "-1", "-n", "-2", "--keep", "-1",
                         "--repeat-last-n", "-1", "-c", "0", "--top-k", "0"])
    sampling = sampling_from_args(args)
    assert (sampling["temperature"], sampling["seed"], sampling["repeat_last_n"]) == (-1, None, -1)
    assert (args.n_predict, args.keep, args.ctx_size) == (-2, -1, 0)
    SamplingParams(**sampling)
    edges = ["--top-p", "0", "--min-p", "1", "--typical", "0", "--repeat-penalty", "1e-3",
             "-s", str(2**32 - 1), "--presence-penalty", "-2", "--frequency-penalty", "2"]
    SamplingParams(**sampling_from_args(parse(base + edges)))


# ------------------------------------------------------------------ with the model

def _stats(err: str) -> dict:
    m = re.search(r"prompt: (\d+) tokens .*generated: (\d+) tokens.*KV (\d+)/(\d+) \| "
                  r"stop: (\w+)", err)
    assert m, err
    return dict(prompt=int(m[1]), generated=int(m[2]), kv_total=int(m[4]), stop=m[5])


def test_n_0_generates_nothing(smollm2_path, capsys):
    assert main(["run", "-m", str(smollm2_path), "-p", "Hello", "-n", "0", "-t", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "max_tokens" not in captured.err and "error" not in captured.err


def test_n_minus_1_runs_until_end_of_generation(smollm2_path, capsys):
    # No token limit: only the end of generation, or the full context (no shift), stops it.
    assert main(["run", "-m", str(smollm2_path), "-p", "The capital of France is", "-n", "-1",
                 "-c", "48", "--no-context-shift", "--temp", "0", "-t", "1"]) == 0
    captured = capsys.readouterr()
    stats = _stats(captured.err)
    assert stats["stop"] in ("eog", "context_full") and stats["generated"] > 0
    assert captured.out.strip()


def test_n_minus_2_stops_with_the_context_full(smollm2_path, capsys):
    prompt = "one two three four " * 3
    assert main(["run", "-m", str(smollm2_path), "-p", prompt, "-n", "-2", "-c", "32",
                 "--temp", "0", "-t", "1"]) == 0
    err = capsys.readouterr().err
    stats = _stats(err)
    assert stats["prompt"] + stats["generated"] == stats["kv_total"] == 32
    assert stats["stop"] == "length" and "context full and n_predict == -2 => stopping" in err


def test_a_prompt_cut_to_fit_is_warned_about_with_its_numbers(smollm2_path, capsys):
    prompt = "one two three four " * 100
    assert main(["tokenize", "-m", str(smollm2_path), prompt]) == 0
    n_tokens = len(ast.literal_eval(capsys.readouterr().out))  # a list of ids
    assert n_tokens > 64
    assert main(["run", "-m", str(smollm2_path), "-p", prompt, "-n", "-2", "-c", "64",
                 "--temp", "0", "-t", "1"]) == 0
    err = capsys.readouterr().err
    m = re.search(r"warning: input truncated: the prompt is (\d+) tokens but the context holds "
                  r"64 \(-c\); (\d+) tokens after the first --keep were dropped, (\d+) kept", err)
    assert m, err
    given, dropped, kept = map(int, m.groups())
    stats = _stats(err)
    assert given == n_tokens and dropped == given - kept and kept == stats["prompt"] < 64
    assert stats["prompt"] + stats["generated"] == 64  # -n -2 counts the prompt as cut


def test_a_prompt_that_fits_gets_no_warning(smollm2_path, capsys):
    assert main(["run", "-m", str(smollm2_path), "-p", "Hello", "-n", "2", "-c", "64",
                 "-t", "1"]) == 0
    err = capsys.readouterr().err
    assert "truncated" not in err and _stats(err)["generated"] == 2
