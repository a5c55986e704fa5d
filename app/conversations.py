"""Saved conversations: a small SQLite database in the user data dir.

    store = ConversationStore.open()            # $LLAMATUI_HOME or platformdirs' data dir
    chat = store.create(model_path, ChatSettings(temperature=0.2))
    store.add_message(chat.id, "user", "Hi")

The database runs in WAL mode (a reader never blocks the writer, a crash never leaves half a
write) and carries its schema version in `PRAGMA user_version`; `MIGRATIONS` brings an older file
up to date when it is opened. Every call commits, so what was saved survives a quit or a crash.

This module knows nothing of the UI (no textual import): the app, the server and tests share it.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace

import platformdirs

from llamatui.inference import CHAT_TEMPLATE_NAMES, SAMPLING_LIMITS, Limit, SamplingParams

DB_NAME = "conversations.sqlite3"


def data_dir() -> pathlib.Path:
    """The app's data folder: `$LLAMATUI_HOME`, else platformdirs' user data dir (the model
    store lives in its `models/` subfolder, see llamatui.models.store)."""
    home = os.environ.get("LLAMATUI_HOME")
    return pathlib.Path(home) if home else pathlib.Path(platformdirs.user_data_dir("llamatui"))


def default_export_dir() -> pathlib.Path:
    return data_dir() / "exports"


# --------------------------------------------------------------------------------------------
# per-chat settings


class OutputFormatError(ValueError):
    """The chat's JSON output setting names a schema file that cannot be used."""


class SettingsError(ValueError):
    """Invalid chat settings; `errors` maps each bad field to what is wrong with it."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


# The engine's sampling defaults (SamplingParams: llama.cpp's), which a new chat starts from.
_ENGINE_DEFAULTS = SamplingParams()

# The values each numeric setting takes: the engine's limits for sampling (SAMPLING_LIMITS),
# narrowed where a chat has no use for the rest (a negative temperature or top-k means what 0
# means; a temperature of 80 is a typo), and the context size, which is the app's to bound.
SETTING_LIMITS = {
    "temperature": SAMPLING_LIMITS["temperature"].narrowed(low=0.0, high=10.0),
    "top_k": SAMPLING_LIMITS["top_k"].narrowed(low=0),
    "top_p": SAMPLING_LIMITS["top_p"],
    "min_p": SAMPLING_LIMITS["min_p"],
    "repeat_penalty": SAMPLING_LIMITS["repeat_penalty"].narrowed(high=10.0),
    "max_tokens": SAMPLING_LIMITS["max_tokens"].narrowed(high=1 << 20),
    "seed": SAMPLING_LIMITS["seed"].narrowed(high=2**63 - 1),
    "n_ctx": Limit(64, 1 << 20, integer=True),
}
OPTIONAL_SETTINGS = {"max_tokens", "seed"}  # None: until the model stops, a random seed


@dataclass(frozen=True)
class ChatSettings:
    """A chat's system prompt, sampling options and context size. Sampling starts from the
    engine's defaults; max_tokens None = until the model ends its turn; seed None = random."""

    system_prompt: str = ""
    temperature: float = _ENGINE_DEFAULTS.temperature
    top_k: int = _ENGINE_DEFAULTS.top_k
    top_p: float = _ENGINE_DEFAULTS.top_p
    min_p: float = _ENGINE_DEFAULTS.min_p
    repeat_penalty: float = _ENGINE_DEFAULTS.repeat_penalty
    max_tokens: int | None = _ENGINE_DEFAULTS.max_tokens
    seed: int | None = _ENGINE_DEFAULTS.seed
    n_ctx: int = 4096
    chat_template: str = ""  # a built-in template's name; "" = the model's own
    # the reply's format: "" = free text, "json" = any JSON object, else a JSON schema file
    json_output: str = ""

    # (field, label, help) in the order the settings form shows them
    FORM = (
        ("temperature", "Temperature", "0 = greedy; higher is more random"),
        ("top_k", "Top-k", "keep the k most likely tokens (0 = off)"),
        ("top_p", "Top-p", "keep tokens up to this probability mass (1 = off)"),
        ("min_p", "Min-p", "drop tokens under min-p × the best one's probability"),
        ("repeat_penalty", "Repeat penalty", "1 = off; above 1 discourages repeats"),
        ("max_tokens", "Max tokens", "per reply; empty = until the model stops"),
        ("seed", "Seed", "empty = random each time"),
        ("n_ctx", "Context size", "tokens the model sees (reloads the model)"),
        ("chat_template", "Chat template", "empty = the model's own; or a built-in: chatml, "
                                           "llama3, gemma, phi3, mistral-v7, deepseek, …"),
        ("json_output", "JSON output", "empty = free text; json = any JSON object; or the path "
                                       "of a JSON schema file (.json)"),
    )

    def __post_init__(self):
        errors = self.problems()
        if errors:
            raise SettingsError(errors)

    def problems(self) -> dict[str, str]:
        """{field: what is wrong with it} for every invalid field; {} when all are valid."""
        e: dict[str, str] = {}
        if not isinstance(self.system_prompt, str):
            e["system_prompt"] = "must be text"
        for name, limit in SETTING_LIMITS.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL_SETTINGS:
                continue
            problem = limit.problem(value)
            if problem is not None:
                e[name] = problem
        if not isinstance(self.chat_template, str):
            e["chat_template"] = "must be text"
        elif self.chat_template and self.chat_template not in CHAT_TEMPLATE_NAMES:
            e["chat_template"] = "not a built-in template (chatml, llama3, gemma, phi3, …)"
        if not isinstance(self.json_output, str):
            e["json_output"] = "must be text"
        elif self.json_output not in ("", "json") and not self.json_output.endswith(".json"):
            e["json_output"] = "empty, json, or a JSON schema file's path ending in .json"
        return e

    @classmethod
    def from_form(cls, values: Mapping[str, str], system_prompt: str = "") -> "ChatSettings":
        """Settings from the text a user typed (empty = None for the optional fields);
        raises SettingsError naming every bad field."""
        kinds = {"temperature": float, "top_p": float, "min_p": float, "repeat_penalty": float,
                 "top_k": int, "max_tokens": int, "seed": int, "n_ctx": int, "chat_template": str,
                 "json_output": str}
        optional = {"max_tokens", "seed", "chat_template", "json_output"}
        defaults = cls()
        parsed: dict = {"system_prompt": system_prompt}
        errors: dict[str, str] = {}
        for name, kind in kinds.items():
            raw = str(values.get(name, "")).strip()
            parsed[name] = getattr(defaults, name)  # stands in while another field is checked
            if not raw:
                if name in optional:
                    parsed[name] = "" if kind is str else None
                else:
                    errors[name] = "required"
                continue
            try:
                parsed[name] = raw if kind is str else int(raw) if kind is int else float(raw)
            except ValueError:
                errors[name] = "must be a whole number" if kind is int else "must be a number"
        try:
            settings = cls(**parsed)
        except SettingsError as err:
            errors = {**err.errors, **errors}
        if errors:
            raise SettingsError({n: errors[n] for n, _, _ in cls.FORM if n in errors})
        return settings

    def form_values(self) -> dict[str, str]:
        out = {}
        for name, _, _ in self.FORM:
            v = getattr(self, name)
            out[name] = "" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))
        return out

    def sampling(self) -> dict:
        """Keyword arguments for Engine.generate."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                    max_tokens=self.max_tokens, seed=self.seed)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> "ChatSettings":
        """Tolerant of settings saved by other versions: unknown keys are dropped, invalid
        values fall back to the defaults."""
        try:
            raw = json.loads(text) if text else {}
        except ValueError:
            raw = {}
        known = {f.name for f in fields(cls)}
        settings = cls()
        for k, v in (raw.items() if isinstance(raw, dict) else ()):
            if k in known:
                try:
                    settings = replace(settings, **{k: v})
                except SettingsError:
                    pass
        return settings

    def describe(self) -> str:
        parts = [f"temperature {self.temperature:g}", f"top-k {self.top_k}",
                 f"top-p {self.top_p:g}", f"min-p {self.min_p:g}",
                 f"repeat penalty {self.repeat_penalty:g}",
                 f"max tokens {self.max_tokens if self.max_tokens else 'unlimited'}",
                 f"seed {self.seed if self.seed is not None else 'random'}",
                 f"context {self.n_ctx}"]
        if self.chat_template:
            parts.append(f"chat template {self.chat_template}")
        if self.json_output:
            parts.append(f"JSON output {self.json_output}")
        return ", ".join(parts)

    def output_constraint(self) -> dict:
        """Engine.generate's keyword for the reply's format: {} (free text),
        `constraint=` any JSON object, or `json_schema=` the schema file's (read now: call it
        off the UI thread). OutputFormatError names a file that is missing or not a schema."""
        if not self.json_output:
            return {}
        if self.json_output == "json":
            from llamatui.inference import ConstraintSpec
            return {"constraint": ConstraintSpec("json_object")}
        path = pathlib.Path(self.json_output).expanduser()
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise OutputFormatError(f"the JSON schema file {path} cannot be read: "
                                    f"{e.strerror or e}") from None
        except ValueError as e:
            raise OutputFormatError(f"the JSON schema file {path} is not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise OutputFormatError(f"the JSON schema file {path} holds a "
                                    f"{type(schema).__name__}, not a JSON object")
        return {"json_schema": schema}


# --------------------------------------------------------------------------------------------
# records


@dataclass
class Conversation:
    id: int
    title: str
    model_path: str
    settings: ChatSettings
    created_at: float
    updated_at: float


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str  # "user" | "assistant"
    content: str
    created_at: float
    finish_reason: str | None = None  # assistant: "eog", "length", "stop", "cancelled", ...
    stats: dict = field(default_factory=dict)  # assistant: n_generated, gen_tps, ...


# --------------------------------------------------------------------------------------------
# schema


_V1 = """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        model_path TEXT NOT NULL DEFAULT '',
        settings TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a late save can't hit a newer row
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
"""

# v2: how each reply ended and its numbers (so a reopened chat shows them); app-wide state.
_V2 = """
    ALTER TABLE messages ADD COLUMN finish_reason TEXT;
    ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
    CREATE INDEX conversations_by_update ON conversations(updated_at DESC);
    CREATE TABLE app_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

MIGRATIONS = (_V1, _V2)  # MIGRATIONS[i] takes the schema from version i to i + 1
SCHEMA_VERSION = len(MIGRATIONS)


class ConversationStore:
    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Used from the UI thread only; check_same_thread off so the app may close it from
        # whichever thread shuts it down.
        self.db = sqlite3.connect(str(self.path), timeout=10, isolation_level=None,
                                  check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    @classmethod
    def open(cls, directory: str | os.PathLike | None = None) -> "ConversationStore":
        return cls(pathlib.Path(directory or data_dir()) / DB_NAME)

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"{self.path} was written by a newer llamatui (schema "
                               f"{version}, this version knows {SCHEMA_VERSION})")
        for step in range(version, SCHEMA_VERSION):
            # One transaction per step (executescript runs the BEGIN itself): a failed step
            # leaves the file at the previous version.
            try:
                self.db.executescript(f"BEGIN IMMEDIATE; {MIGRATIONS[step]}\n"
                                      f"PRAGMA user_version = {step + 1}; COMMIT;")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self.db.close()

    # ---------------------------------------------------------------- conversations

    def create(self, model_path: str | os.PathLike, settings: ChatSettings | None = None,
               title: str = "") -> Conversation:
        now = time.time()
        settings = settings or ChatSettings()
        cur = self.db.execute(
            "INSERT INTO conversations (title, model_path, settings, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?)", (title, str(model_path), settings.to_json(), now, now))
        return Conversation(cur.lastrowid, title, str(model_path), settings, now, now)

    def _conversation(self, row) -> Conversation:
        return Conversation(row["id"], row["title"], row["model_path"],
                            ChatSettings.from_json(row["settings"]), row["created_at"],
                            row["updated_at"])

    def get(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?",
                              (conversation_id,)).fetchone()
        return self._conversation(row) if row else None

    def list(self) -> list[Conversation]:
        """Most recently used first."""
        rows = self.db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC")
        return [self._conversation(r) for r in rows]

    def update(self, conversation_id: int, *, title: str | None = None,
               model_path: str | os.PathLike | None = None,
               settings: ChatSettings | None = None) -> None:
        sets, args = ["updated_at = ?"], [time.time()]
        if title is not None:
            sets.append("title = ?")
            args.append(title)
        if model_path is not None:
            sets.append("model_path = ?")
            args.append(str(model_path))
        if settings is not None:
            sets.append("settings = ?")
            args.append(settings.to_json())
        self.db.execute(f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?",
                        (*args, conversation_id))

    def delete(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ---------------------------------------------------------------- messages

    def _message(self, row) -> Message:
        try:
            stats = json.loads(row["stats"] or "{}")
        except ValueError:
            stats = {}
        return Message(row["id"], row["conversation_id"], row["role"], row["content"],
                       row["created_at"], row["finish_reason"], stats)

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                               (conversation_id,))
        return [self._message(r) for r in rows]

    def add_message(self, conversation_id: int, role: str, content: str,
                    finish_reason: str | None = None, stats: dict | None = None) -> Message:
        if role not in ("user", "assistant"):
            raise ValueError(f"role must be 'user' or 'assistant', not {role!r}")
        now = time.time()
        self.db.execute("BEGIN")
        cur = self.db.execute(
            "INSERT INTO messages (conversation_id, role, content, created_at, finish_reason, "
            "stats) VALUES (?, ?, ?, ?, ?, ?)",
            (conversation_id, role, content, now, finish_reason, json.dumps(stats or {})))
        self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?",
                        (now, conversation_id))
        self.db.execute("COMMIT")
        return Message(cur.lastrowid, conversation_id, role, content, now, finish_reason,
                       dict(stats or {}))

    def update_message(self, message_id: int, content: str, finish_reason: str | None = None,
                       stats: dict | None = None) -> None:
        self.db.execute("UPDATE messages SET content = ?, finish_reason = ?, stats = ? "
                        "WHERE id = ?",
                        (content, finish_reason, json.dumps(stats or {}), message_id))

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Deletes a message and every later one of its conversation."""
        self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                        (conversation_id, message_id))

    # ---------------------------------------------------------------- app-wide state

    def get_state(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM app_state WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_state(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO app_state (key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))


# --------------------------------------------------------------------------------------------
# helpers


def title_from(text: str, limit: int = 40) -> str:
    """A conversation title from its first message: the first line, shortened at a word."""
    line = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"\s+", " ", line)
    if len(line) <= limit:
        return line or "New chat"
    cut = line[:limit].rsplit(" ", 1)[0]
    return (cut if len(cut) > limit // 2 else line[:limit]).rstrip(" ,.;:") + "…"


FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n"
                   r"(?P<code>.*?)(?:^(?P=indent)(?P=fence)[`~]*[ \t]*$|\Z)",
                   re.MULTILINE | re.DOTALL)


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a Markdown text, as (language, code); an unclosed fence (a
    reply cut short) runs to the end."""
    out = []
    for m in FENCE.finditer(markdown):
        code = m.group("code")
        if code.endswith("\n"):
            code = code[:-1]
        out.append((m.group("info").strip().split(" ")[0], code))
    return out


def export_markdown(conversation: Conversation, messages: list[Message],
                    model_name: str | None = None) -> str:
    s = conversation.settings
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conversation.created_at))
    lines = [f"# {conversation.title or 'Chat'}", "",
             f"- Model: {model_name or os.path.basename(conversation.model_path) or '?'}",
             f"- Started: {when}",
             f"- Settings: {s.describe()}", ""]
    if s.system_prompt:
        lines += ["## System", "", s.system_prompt.strip(), ""]
    for m in messages:
        heading = "You" if m.role == "user" else "Assistant"
        if m.role == "assistant" and m.finish_reason == "cancelled":
            heading += " (stopped)"
        lines += [f"## {heading}", "", m.content.strip() or "*(empty)*", ""]
    return "\n".join(lines)


def export_to_file(directory: str | os.PathLike, conversation: Conversation,
                   messages: list[Message], model_name: str | None = None) -> pathlib.Path:
    """Writes the chat as Markdown into `directory` (created if needed), never overwriting an
    earlier export; returns the file's path."""
    directory = pathlib.Path(directory).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", (conversation.title or "chat").lower()).strip("-")[:40]
    base = f"{slug or 'chat'}-{conversation.id}"
    path = directory / f"{base}.md"
    n = 2
    while path.exists():
        path = directory / f"{base}-{n}.md"
        n += 1
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(export_markdown(conversation, messages, model_name), encoding="utf-8")
    os.replace(tmp, path)
    return path
