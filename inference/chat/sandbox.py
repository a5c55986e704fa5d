"""Jinja chat templates compile and render in a worker process, bounded in time and memory.

A chat template is a program: Jinja compiles it to Python and runs it. Jinja's
ImmutableSandboxedEnvironment keeps it away from Python's internals, but not from looping for
hours (nested `range` loops), building gigabytes (`'a' * 10**9`, `lipsum(10**6)`, Jinja's optimizer
even folds such constants while compiling) or nesting deeper than Python compiles. Checks made
inside the app's own process cannot stop one C-level step that runs long or allocates much (a
string repeated, `str.strip` over a huge character set, a quadratic `striptags`), and that step
would hold the GIL the app needs to stop it. So templates run in a child process (this file run as
a script) that the app can kill:

- a request (compile unless cached, then render) that takes longer than TIME_LIMIT_S is stopped:
  the worker is killed, its error raised, and a fresh worker started for the next request;
- during a request the worker's address space may grow by MEMORY_LIMIT_BYTES (plus 4 bytes per
  byte of the request): RLIMIT_AS makes Python raise MemoryError beyond, and the worker is
  replaced after one;
- its CPU time is capped too (RLIMIT_CPU), so a worker whose app died stops on its own;
- a prompt longer than MAX_PROMPT_CHARS is refused.

Requests and replies are JSON in length-prefixed frames, so the render's variables must be JSON
values (what an OpenAI-style request holds), and nothing the worker sends is unpickled.

The environment is transformers' (`ImmutableSandboxedEnvironment`, `trim_blocks`,
`lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block, `raise_exception`,
`strftime_now`, and a `tojson` that neither escapes non-ASCII/HTML nor sorts keys), plus: an
infinite float constant compiles to `float('inf')` (Jinja writes `inf`, a NameError at render
time), and using the undefined value the sandbox returns for an unsafe attribute raises.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import markupsafe
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

TIME_LIMIT_S = 1.0
MEMORY_LIMIT_BYTES = 80 << 20
MAX_PROMPT_CHARS = 4 << 20
STARTUP_LIMIT_S = 30.0  # a worker's Python start and imports, on a loaded machine
_MAX_REPLY_BYTES = 16 * MAX_PROMPT_CHARS  # a prompt as JSON, every character escaped
_CACHED_TEMPLATES = 8


class TemplateFailure(Exception):
    """A template did not render. kind: "syntax" (does not compile), "raised" (the template's
    raise_exception; the message is its own), "security" (blocked by the sandbox), "failed"
    (an error while rendering), "time", "memory" or "size" (a limit above), "worker" (the worker
    could not be started or died)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ------------------------------------------------------------------------------------------------
# the environment (in the worker)


class _Raised(Exception):
    """raise_exception() in a template."""


class _Undefined(jinja2.Undefined):
    """Lenient like Jinja's default (templates test missing keys freely), except for the
    undefined the sandbox returns in place of an unsafe attribute: any use of that one raises."""

    __slots__ = ()

    def _unsafe(self) -> bool:
        return self._undefined_exception is SecurityError

    def __str__(self) -> str:
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__str__()

    def __iter__(self):
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__iter__()

    def __bool__(self) -> bool:
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__bool__()

    def __len__(self) -> int:
        if self._unsafe():
            self._fail_with_undefined_error()
        return super().__len__()


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it);
    for rendering a prompt the body is simply output."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller):
        return caller()


class _CodeGenerator(CodeGenerator):
    def visit_Const(self, node, frame):
        # Jinja writes a float as str(value): for 1e999 (or a folded 1e308 * 10) that is `inf`
        value = node.as_const(frame.eval_ctx)
        if isinstance(value, float) and value in (float("inf"), float("-inf")):
            self.write(f"float({str(value)!r})")
        else:
            super().visit_Const(node, frame)


def _raise_exception(message="") -> None:
    raise _Raised(str(message))


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"strftime_now() needs a format string, got {type(fmt).__name__}")
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers replaces Jinja's tojson, which HTML-escapes and sorts keys
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=_Undefined,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.code_generator_class = _CodeGenerator
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _compile(env, source: str):
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateFailure("syntax", f"chat template does not compile: {e.message} "
                                        f"(line {e.lineno})") from None
    except (SyntaxError, RecursionError) as e:
        # CPython refuses >20 nested loops ("too many statically nested blocks"), >100 levels
        # of indentation, and expressions nested past its recursion limit
        detail = e.msg if isinstance(e, SyntaxError) else "RecursionError"
        raise TemplateFailure("syntax", "chat template does not compile: it nests blocks or "
                                        f"expressions too deeply for Python ({detail})") from None


def _render(env, cache: dict, source: str, context: dict) -> str:
    template = cache.pop(source, None) or _compile(env, source)
    cache[source] = template  # most recently used last
    while len(cache) > _CACHED_TEMPLATES:
        del cache[next(iter(cache))]
    text = template.render(context)
    if len(text) > MAX_PROMPT_CHARS:
        raise TemplateFailure("size", f"chat template produced a prompt of {len(text):,} "
                                      f"characters; at most {MAX_PROMPT_CHARS:,}")
    return text


def _failure(e: BaseException) -> TemplateFailure:
    if isinstance(e, TemplateFailure):
        return e
    if isinstance(e, _Raised):
        return TemplateFailure("raised", str(e))
    if isinstance(e, SecurityError):
        return TemplateFailure("security", f"chat template blocked by the sandbox: {e}")
    if isinstance(e, MemoryError):
        return TemplateFailure("memory", "chat template needed more than "
                                         f"{MEMORY_LIMIT_BYTES >> 20} MiB of memory")
    if isinstance(e, RecursionError):
        return TemplateFailure("failed", "chat template failed: it recursed too deeply")
    if isinstance(e, jinja2.TemplateError):
        return TemplateFailure("failed", f"chat template failed: {e}")
    return TemplateFailure("failed", f"chat template failed: {type(e).__name__}: {e}")


# ------------------------------------------------------------------------------------------------
# frames (both sides)


def _encode_frame(obj) -> bytes:
    data = json.dumps(obj).encode("ascii")
    return len(data).to_bytes(4, "big") + data


def _read_frame(stream, max_bytes: int | None = None) -> bytes | None:
    """The next frame's JSON text, or None at the end of the stream (or past max_bytes)."""
    header = stream.read(4)
    if len(header) < 4:
        return None
    size = int.from_bytes(header, "big")
    if max_bytes is not None and size > max_bytes:
        return None
    data = stream.read(size)
    return data if len(data) == size else None


# ------------------------------------------------------------------------------------------------
# the worker's side


def _address_space_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _limit_resources(request_bytes: int) -> None:
    """RLIMIT_AS and RLIMIT_CPU for one request (where the system has them)."""
    try:
        import resource
    except ImportError:
        return
    now = _address_space_bytes()
    if now is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = now + MEMORY_LIMIT_BYTES + 4 * request_bytes
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        except (ValueError, OSError):
            pass
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_soft = int(used.ru_utime + used.ru_stime + TIME_LIMIT_S) + 5
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    if cpu_hard == resource.RLIM_INFINITY or cpu_soft <= cpu_hard:
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_soft, cpu_hard))
        except (ValueError, OSError):
            pass


def _lift_memory_limit() -> None:
    try:
        import resource
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _serve(stdin, stdout) -> None:
    """The worker's loop: a frame {"source", "context"} in, {"text"} or {"error", "message"}
    out, until the app closes the pipe. Exits after running out of memory (the app starts a
    fresh worker)."""
    env = _make_environment()
    cache: dict = {}
    stdout.write(_encode_frame({"ready": True}))
    stdout.flush()
    while (data := _read_frame(stdin)) is not None:
        _limit_resources(len(data))
        try:
            request = json.loads(data)
            reply = {"text": _render(env, cache, request["source"], request["context"])}
        except BaseException as e:  # noqa: BLE001 — every failure goes back to the app
            failure = _failure(e)
            reply = {"error": failure.kind, "message": str(failure)}
        finally:
            _lift_memory_limit()
        stdout.write(_encode_frame(reply))
        stdout.flush()
        if reply.get("error") == "memory":
            return


# ------------------------------------------------------------------------------------------------
# the app's side


class _Worker:
    """The worker process: started on demand, replaced when it is stopped or dies. One request
    at a time (renders take milliseconds; a hostile one at most TIME_LIMIT_S)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._replies: queue.Queue | None = None
        self._ready = False

    def request(self, frame: bytes) -> dict:
        """Sends one request frame and returns the reply; raises TemplateFailure when the worker
        runs out of time or dies."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._spawn()
            if not self._ready:
                self._await_ready()
            try:
                self._proc.stdin.write(frame)
                self._proc.stdin.flush()
                reply = self._replies.get(timeout=TIME_LIMIT_S)
            except OSError:
                reply = None
            except queue.Empty:
                self._replace()
                raise TemplateFailure("time", f"chat template ran for more than "
                                              f"{TIME_LIMIT_S:g} s (an endless loop?) and was "
                                              "stopped") from None
            except BaseException:  # interrupted mid-request (Ctrl+C, an exception raised in this
                self._stop()  # thread): the worker may still be busy with it, so it goes
                raise
            if reply is None:
                code = self._replace()
                raise TemplateFailure("worker", "the chat template process ended unexpectedly "
                                                f"(exit status {code})")
            if reply.get("error") == "memory":
                self._replace()  # it exits after a MemoryError
            return reply

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _spawn(self) -> None:
        if not sys.executable:
            raise TemplateFailure("worker", "cannot start the chat template process: "
                                            "no Python executable (sys.executable is empty)")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _worker_boot()], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                start_new_session=True)  # Ctrl+C in the terminal is the app's, not the worker's
        except OSError as e:
            raise TemplateFailure("worker", f"cannot start the chat template process: {e}") \
                from None
        replies: queue.Queue = queue.Queue()
        threading.Thread(target=_forward_frames, args=(proc.stdout, replies), daemon=True,
                         name="chat-template-replies").start()
        self._proc, self._replies, self._ready = proc, replies, False

    def _await_ready(self) -> None:
        try:
            hello = self._replies.get(timeout=STARTUP_LIMIT_S)
        except queue.Empty:
            hello = None
        if not (isinstance(hello, dict) and hello.get("ready")):
            code = self._stop()
            raise TemplateFailure("worker", "the chat template process did not start "
                                            f"(exit status {code})")
        self._ready = True

    def _replace(self) -> int | None:
        """Stops the worker and starts the next one in the background; its exit status."""
        code = self._stop()
        try:
            self._spawn()
        except TemplateFailure:
            pass  # the next request tries again and reports why
        return code

    def _stop(self) -> int | None:
        proc, self._proc, self._ready = self._proc, None, False
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        return proc.wait()


def _worker_boot() -> str:
    """The worker's command: this file as a script, in isolated mode (-I: neither the script's
    folder, the current one nor PYTHONPATH on sys.path, so no file there can stand in for a
    module it imports), with only Jinja's and MarkupSafe's install folders added."""
    roots = sorted({os.path.dirname(os.path.dirname(os.path.abspath(m.__file__)))
                    for m in (jinja2, markupsafe)})
    return (f"import runpy, sys; sys.path[:0] = {roots!r}; "
            f"runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')")


def _forward_frames(stream, replies: queue.Queue) -> None:
    """The reader thread: the worker's frames into `replies`, then None when it ends."""
    try:
        while (data := _read_frame(stream, _MAX_REPLY_BYTES)) is not None:
            replies.put(json.loads(data))
    except (OSError, ValueError):
        pass
    replies.put(None)


_WORKER = _Worker()
atexit.register(_WORKER.close)


def render(source: str, context: dict) -> str:
    """`source` compiled (cached in the worker) and rendered with `context`, whose values must
    be JSON values. Raises TemplateFailure."""
    try:
        frame = _encode_frame({"source": source, "context": context})
    except (TypeError, ValueError) as e:
        raise TemplateFailure("failed", f"chat template variables must be JSON values: {e}") \
            from None
    reply = _WORKER.request(frame)
    if "error" in reply:
        raise TemplateFailure(reply["error"], reply["message"])
    return reply["text"]


def shutdown() -> None:
    """Stops the worker (a later render starts a new one)."""
    _WORKER.close()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
