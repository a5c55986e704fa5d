"""The conversation database (SQLite, WAL, migrations), chat settings, and Markdown export."""
import json
import sqlite3

import pytest

from llamatui.app import conversations as cv
from llamatui.app.conversations import (MIGRATIONS, SCHEMA_VERSION, ChatSettings,
                                        ConversationStore, SettingsError, code_blocks,
                                        export_markdown, export_to_file, title_from)
from llamatui.inference import SAMPLING_LIMITS, SamplingParams


def test_store_lives_in_llamatui_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMATUI_HOME", str(tmp_path))
    assert cv.data_dir() == tmp_path
    store = ConversationStore.open()
    assert store.path == tmp_path / cv.DB_NAME and store.path.exists()
    assert cv.default_export_dir() == tmp_path / "exports"
    store.close()


def test_wal_and_schema_version(tmp_path):
    store = ConversationStore.open(tmp_path)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    store.close()


def test_conversations_and_messages_round_trip(tmp_path):
    store = ConversationStore.open(tmp_path)
    s = ChatSettings(system_prompt="Be brief.", temperature=0.2, seed=7, n_ctx=1024)
    a = store.create("/models/a.gguf", s, "First")
    b = store.create("/models/b.gguf", title="Second")
    u = store.add_message(a.id, "user", "Hi")
    r = store.add_message(a.id, "assistant", "", "generating")
    store.update_message(r.id, "Hello!", "eog", {"n_generated": 3, "gen_tps": 9.5})
    store.add_message(b.id, "user", "Other")
    store.add_message(a.id, "user", "Again")  # a becomes the most recent
    assert [c.id for c in store.list()] == [a.id, b.id]
    store.close()

    store = ConversationStore.open(tmp_path)  # everything committed, nothing cached
    a2 = store.get(a.id)
    assert a2.title == "First" and a2.model_path == "/models/a.gguf" and a2.settings == s
    msgs = store.messages(a.id)
    assert [(m.role, m.content, m.finish_reason) for m in msgs] == [
        ("user", "Hi", None), ("assistant", "Hello!", "eog"), ("user", "Again", None)]
    assert msgs[1].stats == {"n_generated": 3, "gen_tps": 9.5} and msgs[0].id == u.id

    store.delete_messages_from(a.id, r.id)  # regenerate / edit: drop a message and what follows
    assert [m.content for m in store.messages(a.id)] == ["Hi"]
    store.update(a.id, title="Renamed", model_path="/models/c.gguf",
                 settings=ChatSettings(top_k=5))
    a3 = store.get(a.id)
    assert (a3.title, a3.model_path, a3.settings.top_k) == ("Renamed", "/models/c.gguf", 5)

    store.delete(b.id)  # messages go with it
    assert store.get(b.id) is None
    assert store.db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?",
                            (b.id,)).fetchone()[0] == 0
    with pytest.raises(ValueError):
        store.add_message(a.id, "system", "no")
    store.set_state("theme", "nord")
    store.set_state("theme", "gruvbox")
    assert store.get_state("theme") == "gruvbox" and store.get_state("nope", "x") == "x"
    store.close()


def test_version_1_database_is_migrated(tmp_path):
    path = tmp_path / cv.DB_NAME
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO conversations (title, model_path, settings, created_at, updated_at)"
               " VALUES ('Old chat', '/m.gguf', '{\"temperature\": 0.3}', 1, 2)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created_at) "
               "VALUES (1, 'user', 'from v1', 1)")
    db.commit()
    db.close()
    store = ConversationStore(path)
    assert store.schema_version == SCHEMA_VERSION
    (conv,) = store.list()
    assert conv.title == "Old chat" and conv.settings.temperature == 0.3
    (msg,) = store.messages(conv.id)
    assert msg.content == "from v1" and msg.finish_reason is None and msg.stats == {}
    store.set_state("k", "v")  # the table added by v2
    store.close()


def test_newer_database_is_refused(tmp_path):
    path = tmp_path / cv.DB_NAME
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="newer llamatui"):
        ConversationStore(path)


def test_failed_migration_leaves_previous_version(tmp_path, monkeypatch):
    path = tmp_path / cv.DB_NAME
    monkeypatch.setattr(cv, "MIGRATIONS", (MIGRATIONS[0], "CREATE TABLE x (a); BROKEN SQL;"))
    monkeypatch.setattr(cv, "SCHEMA_VERSION", 2)
    with pytest.raises(sqlite3.Error):
        ConversationStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'x'").fetchone() is None
    db.close()


def test_settings_validation_names_every_bad_field():
    values = ChatSettings().form_values()
    values.update(temperature="hot", top_p="1.5", top_k="-1", n_ctx="10", seed="1.5",
                  max_tokens="0", repeat_penalty="0")
    with pytest.raises(SettingsError) as e:
        ChatSettings.from_form(values)
    assert set(e.value.errors) == {"temperature", "top_p", "top_k", "n_ctx", "seed",
                                   "max_tokens", "repeat_penalty"}
    assert e.value.errors["temperature"] == "must be a number"
    values = ChatSettings().form_values()
    values.update(max_tokens="", seed="", temperature="0", min_p="0.1")
    s = ChatSettings.from_form(values, system_prompt="Pirate.")
    assert (s.max_tokens, s.seed, s.temperature, s.min_p, s.system_prompt) == \
        (None, None, 0.0, 0.1, "Pirate.")
    with pytest.raises(SettingsError):
        ChatSettings(temperature=float("nan"))


def test_settings_start_from_the_engine_defaults_and_narrow_its_limits():
    """A new chat samples as the engine does by default, and every value the form accepts is
    one the engine accepts (the form refuses some the engine takes: a temperature of 80)."""
    engine, chat = SamplingParams(), ChatSettings()
    sampling = chat.sampling()
    assert sampling == {name: getattr(engine, name) for name in sampling}
    for name, limit in cv.SETTING_LIMITS.items():
        if name not in SAMPLING_LIMITS:
            continue
        for bound in (limit.low, limit.high):
            if bound is not None and not (limit.low_open and bound == limit.low):
                ChatSettings(**{name: bound})
                SamplingParams(**{name: bound})
    SamplingParams(temperature=80.0)
    with pytest.raises(SettingsError) as e:
        ChatSettings(temperature=80.0)
    assert e.value.errors == {"temperature": "must be at most 10.0"}


def test_chat_template_setting_names_a_built_in_template():
    values = ChatSettings().form_values()
    assert values["chat_template"] == ""  # the model's own
    values.update(chat_template="gemma")
    assert ChatSettings.from_form(values).chat_template == "gemma"
    values.update(chat_template="{{ messages }}")
    with pytest.raises(SettingsError) as e:
        ChatSettings.from_form(values)
    assert set(e.value.errors) == {"chat_template"}
    assert "chat template gemma" in ChatSettings(chat_template="gemma").describe()


def test_settings_json_and_sampling():
    s = ChatSettings(system_prompt="x", temperature=0.1, top_k=3, seed=5, max_tokens=9)
    assert ChatSettings.from_json(s.to_json()) == s
    # Unknown keys and invalid values from another version fall back to the defaults.
    loaded = ChatSettings.from_json(json.dumps({"temperature": -4, "top_k": 7, "future": 1}))
    assert loaded.temperature == ChatSettings().temperature and loaded.top_k == 7
    assert ChatSettings.from_json("not json") == ChatSettings()
    SamplingParams(**s.sampling())  # the engine accepts every option the app sends
    assert ChatSettings.from_form(s.form_values(), "x") == s


def test_titles_and_code_blocks():
    assert title_from("  \n  Hello   there \nsecond line") == "Hello there"
    long = title_from("How do I write a function that reverses a linked list in place?")
    assert long.endswith("…") and len(long) <= 41
    assert title_from("") == "New chat"
    md = ("Intro\n```python\nprint(1)\n```\ntext\n~~~\nplain\n~~~\n"
          "````md\n```inner```\n````\n```sh\nunclosed\n")
    assert code_blocks(md) == [("python", "print(1)"), ("", "plain"), ("md", "```inner```"),
                               ("sh", "unclosed")]
    assert code_blocks("no code") == []


def test_export(tmp_path):
    store = ConversationStore.open(tmp_path)
    conv = store.create("/models/SmolLM2.gguf", ChatSettings(system_prompt="Be nice."),
                        "Sort / words?")
    store.add_message(conv.id, "user", "How?")
    store.add_message(conv.id, "assistant", "Like `this`.", "cancelled")
    msgs = store.messages(conv.id)
    text = export_markdown(conv, msgs, "SmolLM2")
    assert text.startswith("# Sort / words?\n")
    assert "- Model: SmolLM2" in text and "## System\n\nBe nice." in text
    assert "## You\n\nHow?" in text and "## Assistant (stopped)\n\nLike `this`." in text
    first = export_to_file(tmp_path / "out", conv, msgs)
    second = export_to_file(tmp_path / "out", conv, msgs)  # never overwrites
    assert first.name == f"sort-words-{conv.id}.md" and second.name == f"sort-words-{conv.id}-2.md"
    assert first.read_text() == second.read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([first.name,
                                                                           second.name])
    store.close()
