"""`llamatui serve`'s command line: bad flags are one line and exit 2 before anything loads, a
port in use is a clear error, and the flags reach the server's settings."""
import socket

import pytest

from llamatui.app.cli import build_parser, main
from llamatui.app.cli.serve import server_config
from llamatui.inference import Engine

MISSING = "/nonexistent/model.gguf"


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(Engine, "load", refuse)


@pytest.mark.parametrize("flags, words", [
    (["--port", "70000"], "must be a port between 0 and 65535"),
    (["-np", "0"], "must be at least 1"),
    (["--cors-origin", "*"], "name the origins"),
    (["--cors-origin", "localhost:3000"], "is not an origin"),
    (["--api-key-file", "/nonexistent/keys"], "cannot read --api-key-file"),
    (["--ctx-shift", "--no-ctx-shift"], "contradict"),
    (["--pooling", "max"], "invalid choice"),
    (["--max-queue", "-1"], "must be at least 0"),
    (["--chat-template-kwargs", "{enable_thinking: false}"], "must be a JSON object"),
    (["--chat-template-kwargs", "[1, 2]"], "must be a JSON object"),
    (["--chat-template-kwargs", "[" * 100_000], "must be a JSON object"),
    (["--chat-template-kwargs", '{"enable_thinking": "off"}'], "must be true or false"),
    (["--reasoning", "maybe"], "must be on, off or auto"),
    (["--reasoning-budget", "-2"], "must be -1 (unlimited), 0"),
    (["--reasoning-format", "think"], "invalid choice"),
])
def test_bad_flags_exit_2_before_loading(flags, words, capsys, no_model_load):
    assert main(["serve", "-m", MISSING, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llamatui serve: error: ") and words in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_port_in_use_is_a_clear_error(smollm2_path, capsys, no_model_load):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "-m", str(smollm2_path), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_flags_reach_the_settings(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nk2\n\nk3\n")
    args = build_parser({"serve"}).parse_args(
        ["serve", "-m", "x", "--api-key", "k0,k1", "--api-key-file", str(keys), "--cors-origin",
         "http://a.example,http://b.example", "--metrics", "--no-slots", "--alias", "m",
         "--host", "0.0.0.0", "--port", "0", "-to", "30"])
    config = server_config(args)
    assert config.api_keys == ("k0", "k1", "k2", "k3")
    assert config.cors_origins == ("http://a.example", "http://b.example")
    assert (config.metrics, config.slots, config.alias) == (True, False, "m")
    assert (config.host, config.port, config.timeout) == ("0.0.0.0", 0, 30.0)
    defaults = server_config(build_parser({"serve"}).parse_args(["serve", "-m", "x"]))
    assert (defaults.host, defaults.port, defaults.api_keys, defaults.cors_origins) == \
        ("127.0.0.1", 8080, (), ())
