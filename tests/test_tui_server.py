"""The Server screen (F12) driven through Textual's Pilot: it serves the chat's loaded SmolLM2,
a request from the official openai client shows in its request log and slots, the API key it
was given is required, and stopping closes the port."""
import asyncio

import openai
import pytest
from textual.widgets import DataTable, Input

from llamatui.app.tui.server import ServerScreen

from server_helpers import free_port
from tui_helpers import SIZE, engine_ready, make_app, wait_for
from test_tui import set_defaults

CHAT = [{"role": "user", "content": "Say hi."}]


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LLAMATUI_HOME", str(home))
    return home


def _rows(screen, table_id: str) -> list[list[str]]:
    table = screen.query_one(table_id, DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def _start(pilot, port: int, key: str = "") -> ServerScreen:
    await pilot.press("f12")
    screen = pilot.app.screen
    assert isinstance(screen, ServerScreen)
    screen.query_one("#server-port", Input).value = str(port)
    screen.query_one("#server-key", Input).value = key
    await pilot.press("ctrl+s")
    await wait_for(lambda: screen.server is not None, 60, "the server to start")
    return screen


def test_server_screen_serves_logs_and_stops(home, smollm2_path):
    set_defaults(home)
    port = free_port()

    async def go():
        app = make_app(model=str(smollm2_path))
        async with app.run_test(size=SIZE) as pilot:
            await engine_ready(app)
            screen = await _start(pilot, port)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=0, timeout=120)
            reply = await asyncio.to_thread(client.chat.completions.create, model="any",
                                            messages=CHAT, max_tokens=4, temperature=0)
            assert reply.choices[0].message.content
            n_gen = reply.usage.completion_tokens

            def logged():
                return any(r[2] == "POST /v1/chat/completions" and r[3] == "200" and
                           r[5].endswith(f"+{n_gen}") for r in _rows(screen, "#server-log"))
            await wait_for(logged, 10, "the request in the log")
            await wait_for(lambda: any(r[3] == str(n_gen) for r in _rows(screen, "#server-slots")),
                           10, "the slot's generated tokens")
            assert "Serving" in str(screen.query_one("#server-status").render())
            await pilot.press("ctrl+s")
            await wait_for(lambda: screen.server is None and not screen.busy, 30,
                           "the server to stop")
            with pytest.raises(openai.APIConnectionError):
                await asyncio.to_thread(client.models.list)
            assert app.chat.engine is not None  # the chat keeps its model
            await pilot.press("escape")
            assert app.screen is app.chat

    asyncio.run(go())


def test_server_screen_key_is_required(home, smollm2_path):
    set_defaults(home)
    port = free_port()

    async def go():
        app = make_app(model=str(smollm2_path))
        async with app.run_test(size=SIZE) as pilot:
            await engine_ready(app)
            await _start(pilot, port, key="s3cret")
            base = f"http://127.0.0.1:{port}/v1"
            wrong = openai.OpenAI(base_url=base, api_key="nope", max_retries=0, timeout=60)
            with pytest.raises(openai.AuthenticationError):
                await asyncio.to_thread(wrong.chat.completions.create, model="any",
                                        messages=CHAT, max_tokens=2)
            right = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0, timeout=60)
            models = await asyncio.to_thread(right.models.list)
            assert models.data
        # leaving the app stops the server
        with pytest.raises(openai.APIConnectionError):
            await asyncio.to_thread(right.models.list)

    asyncio.run(go())


def test_server_screen_without_a_model_says_so(home, monkeypatch):
    monkeypatch.setattr("llamatui.app.tui.app.store_models", lambda: [])

    async def go():
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            if app.screen is not app.chat:
                app.pop_screen()  # the first-run welcome
                await pilot.pause()
            await pilot.press("f12")
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen.server is None
            assert any("Load a model" in m for _, _, m in app.notifications_log)

    asyncio.run(go())
