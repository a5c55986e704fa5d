"""The routes: llama-server's and the OpenAI API's, in one table (`ROUTES`) from which the
router, the API-key check (every route is protected unless its entry says public) and
/openapi.json are all made, so a new route cannot miss any of them.

Handlers never block the event loop: templating, tokenizing and the scheduler's calls run in the
served engine's thread pool; generation events arrive through its `Run`.
"""
from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from llamatui.inference import (POOLINGS, ChatTemplateError, ContextFullError,
                                EmbeddingOnlyError, ReasoningBudget, SamplingParams, ToolPlan,
                                harmony_messages, reasoning_style, reply_stream,
                                tool_call_family)

from . import metrics, openapi, requests as rq
from .errors import APIError, exceed_context, invalid, not_supported
from .schema import check
from .served_engine import Run, choice_params
from .shapes import Choice, Shaper
from .sse import DONE, PING, EventStream, sse, until_disconnect

MAX_BODY = 32 * 1024 * 1024  # bytes; llama-server's httplib payload limit is larger, but a
# prompt this size is already far beyond any context


def _state(request: Request):
    return request.app.state.llamatui


async def read_json(request: Request) -> dict:
    """The body as a JSON object: malformed JSON, a non-object, an oversized body or one that
    does not arrive within --timeout seconds is a 400."""
    timeout = _state(request).config.timeout
    try:
        body = await asyncio.wait_for(request.body(), timeout)
    except asyncio.TimeoutError:
        raise APIError(f"the request body did not arrive within {timeout:g} s "
                       "(--timeout)") from None
    if len(body) > MAX_BODY:
        raise APIError(f"the request body is {len(body)} bytes; at most {MAX_BODY} are read")
    try:  # Python's JSON parser and writer recurse: a hostile body can nest past their limit
        return _json_object(body)
    except RecursionError:
        raise APIError("the request body nests too deeply to be read") from None


def _json_object(body: bytes) -> dict:
    """The body as a JSON object of text; APIError naming what is wrong with it."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:  # JSON's \ud800 escapes can carry lone UTF-16 surrogates, which are not text
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(f"the request body holds a lone UTF-16 surrogate "
                       f"({e.object[e.start:e.end]!a}), which is not text") from None
    return data


# --------------------------------------------------------------------------- generation

async def chat_completions(request: Request) -> Response:
    state = _state(request)
    return await _generate(request, rq.chat_job(await read_json(request), state.served.limits,
                                                  state.config), "chat")


async def completions(request: Request) -> Response:
    state = _state(request)
    return await _generate(request, rq.completions_job(await read_json(request),
                                                         state.served.limits), "completions")


async def native_completion(request: Request) -> Response:
    state = _state(request)
    return await _generate(request, rq.native_completion_job(await read_json(request),
                                                               state.served.limits), "native")


def _prompt_ids(engine, prompt, chat: bool, plan: ToolPlan | None = None,
                job: rq.Job | None = None) -> tuple[list[int], str]:
    """Token ids of a prompt (llama.cpp's way: BOS per the model, special tokens parsed), and a
    chat's rendered text (its reply reader needs to know whether it opened a thinking block).
    A chat with a tool plan is rendered the way its family asks, with the job's template
    variables (enable_thinking, chat_template_kwargs); gpt-oss gets its history's reasoning as
    `thinking` (common_chat_params_init_gpt_oss)."""
    if isinstance(prompt, list) and not chat:
        return prompt, ""  # already token ids
    if not chat:
        return engine.prompt_tokens(prompt), ""
    text = _render(engine, prompt, plan, job, True)
    return engine.prompt_tokens(text), text


def _render(engine, messages, plan: ToolPlan | None, job: rq.Job | None,
            add_generation_prompt: bool) -> str:
    template_vars = dict(job.template_vars) if job is not None else {}
    if plan is not None:
        messages = plan.messages(messages)
        template_vars.update(plan.template_variables())
    if reasoning_style(engine.template.source, engine.template.builtin is not None).name \
            == "harmony":
        messages = harmony_messages(messages)
    try:
        return engine.apply_chat_template(messages, add_generation_prompt, **template_vars)
    except ChatTemplateError as e:
        raise invalid("messages", f"the chat template failed on these messages: {e}") from None


def _budgets(engine, job: rq.Job, plan: ToolPlan | None, n: int) -> list | None:
    """One ReasoningBudget per choice when the request sets reasoning_budget_tokens (llama-server
    arms its sampler with the template's thinking tags, forcing the message and the first end
    tag, and feeds it the generation prompt: the text `add_generation_prompt` adds)."""
    if not job.chat or job.reasoning_budget < 0:
        return None
    style = reasoning_style(engine.template.source, engine.template.builtin is not None)
    messages = job.prompts[0]
    with_prompt = _render(engine, messages, plan, job, True)
    without = _render(engine, messages, plan, job, False)
    common = 0
    while common < min(len(with_prompt), len(without)) and \
            with_prompt[common] == without[common]:
        common += 1
    tokenizer = engine.tokenizer

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=True) if text else []

    forced = ids(job.reasoning_budget_message) + ids(style.end_tags[0])
    ends = [ids(t) for t in (*style.end_tags, *filter(None, [style.call_ends]))]
    return [ReasoningBudget(ids(style.start), ends, forced,
                            job.reasoning_budget, lambda t: tokenizer.token_to_piece(t, False),
                            ids(with_prompt[common:])) for _ in range(n)]


def _preserved_ids(engine, job: rq.Job) -> list[int]:
    """The ids of the chat format's preserved tokens (shown in the reply although special)."""
    if not job.chat:
        return []
    style = reasoning_style(engine.template.source, engine.template.builtin is not None)
    found = (engine.tokenizer.token_to_id(text) for text in style.preserved)
    return [t for t in found if t is not None]


def _tool_plan(engine, job: rq.Job) -> ToolPlan | None:
    """The tool plan of a chat request: its template's family, the tools, the choice."""
    if not job.chat:
        return None
    template = engine.template
    return ToolPlan(tool_call_family(template.source, template.builtin is not None), job.tools,
                    job.tool_choice, job.parallel_tool_calls)


async def _generate(request: Request, job: rq.Job, kind: str) -> Response:
    state = _state(request)
    served, engine = state.served, state.served.engine
    if engine.info.encoder:
        raise not_supported(str(EmbeddingOnlyError(engine.info.architecture)))
    sampling = dict(job.sampling)
    end_text = engine.end_of_turn_text() if job.chat else None
    if end_text:
        sampling["stop"] = (*sampling.get("stop", ()), end_text)
    try:
        params = choice_params(sampling, job.n)
    except ValueError as e:
        raise APIError(f"invalid sampling options: {e}") from None
    plan = _tool_plan(engine, job)
    prompts = [await served.call(_prompt_ids, engine, p, job.chat, plan, job)
               for p in job.prompts]
    budgets = await served.call(_budgets, engine, job, plan, job.n_choices)
    constraint, param = job.constraint, job.constraint_param
    if plan is not None and plan.active:
        constraint, param = plan.constraint(), "tools"
    run = Run(served)
    await run.start([(ids, params[i]) for ids, _ in prompts for i in range(job.n)],
                    n_probs=max(job.n_probs, 1) if job.logprobs else 0,
                    cache_prompt=job.cache_prompt, constraint=constraint,
                    constraint_param=param, reasoning_budgets=budgets,
                    preserved_tokens=_preserved_ids(engine, job))
    n_top = job.n_probs if job.logprobs else None
    choices = [Choice(i, engine.tokenizer, n_top) for i in range(job.n_choices)]
    shaper = Shaper(kind, state.model_name)
    request.scope["llamatui.choices"] = choices
    style = reasoning_style(engine.template.source, engine.template.builtin is not None)
    replies = [reply_stream(style, plan, job.reasoning_format, prompts[i // job.n][1])
               for i in range(job.n_choices)] if job.chat else None
    if job.stream:
        writers = {"chat": _chat_stream, "completions": _completions_stream,
                   "native": _native_stream}
        chunks = writers[kind](run, job, choices, shaper, _settings(sampling),
                               state.config.ping_interval, replies)
        return EventStream(chunks, run.cancel, state.config.timeout)
    done = await until_disconnect(request, _collect(run, choices))
    if done is None:
        return Response(status_code=499)  # nobody is listening (nginx's "client closed")
    if kind == "chat":
        for reply, c in zip(replies, choices):
            reply.feed(c.text)
            reply.finish()
        return JSONResponse(shaper.chat(choices, job.n, [r.message() for r in replies]))
    if kind == "completions":
        return JSONResponse(shaper.completion(choices, job.n))
    return JSONResponse(shaper.native_final(choices[0], choices[0].text, _settings(sampling)))


async def _collect(run: Run, choices: list[Choice]) -> bool:
    try:
        async for index, event in run.events():
            choices[index].add(event)
    finally:
        await run.cancel()
    _raise_failed(choices)
    return True


def _raise_failed(choices: list[Choice]) -> None:
    for c in choices:
        if c.finish_reason == "error":
            raise APIError(f"generation failed: {c.error}", "server_error")


def _settings(sampling: dict) -> dict:
    """/completion's generation_settings: the sampling parameters in effect."""
    params = SamplingParams(**sampling)
    return {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "typical_p": params.typical_p,
            "repeat_penalty": params.repeat_penalty, "repeat_last_n": params.repeat_last_n,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty, "seed": params.seed,
            "n_predict": params.max_tokens, "stop": list(params.stop)}


async def _chat_stream(run, job, choices, shaper, settings, ping, replies
                       ) -> AsyncIterator[bytes]:
    """llama-server's chat chunks: the role, the content pieces (with their log-probabilities),
    `reasoning_content` pieces, `tool_calls` deltas (a call's index, id, type and name first,
    then its arguments in fragments), the finish reason (`tool_calls` after calls); the usage
    when asked; `[DONE]`."""
    roled = set()
    async for index, event in run.events(ping):
        if event is None:
            yield PING
            continue
        c, reply = choices[index], replies[index]
        entry = c.add(event)
        if event.kind == "prompt":
            continue
        if event.kind == "done" and event.finish_reason == "error":
            raise APIError(f"generation failed: {event.error}", "server_error")
        if index not in roled:
            roled.add(index)
            yield sse(shaper.chat_chunk(index, {"role": "assistant", "content": None}))
        deltas = reply.feed(event.text) if event.text else []
        if event.kind == "done":
            deltas += reply.finish()
        if entry is not None and not deltas:
            deltas = [{}]
        for i, delta in enumerate(deltas):
            if entry is None and delta.keys() == {"content"}:
                yield shaper.content_chunk(index, delta["content"])  # the most common chunk
                continue
            yield sse(shaper.chat_chunk(index, delta, logprobs=[entry] if entry is not None
                                        and i == 0 else None))
        if event.kind == "done":
            finish = "tool_calls" if reply.calls else c.oai_finish_reason
            yield sse(shaper.chat_chunk(index, {}, finish, timings=c.timings()))
    if job.include_usage:
        yield sse(shaper.usage_chunk(choices, job.n, "chat.completion.chunk"))
    yield DONE


async def _completions_stream(run, job, choices, shaper, settings, ping, replies
                              ) -> AsyncIterator[bytes]:
    async for index, event in run.events(ping):
        if event is None:
            yield PING
            continue
        c = choices[index]
        entry = c.add(event)
        if event.kind == "done" and event.finish_reason == "error":
            raise APIError(f"generation failed: {event.error}", "server_error")
        if event.kind == "token" and (event.text or entry is not None):
            yield sse(shaper.completion_chunk(index, event.text,
                                              logprobs=[entry] if entry is not None else None))
        elif event.kind == "done":
            yield sse(shaper.completion_chunk(index, event.text, c.oai_finish_reason,
                                              timings=c.timings()))
    if job.include_usage:
        yield sse(shaper.usage_chunk(choices, job.n, "text_completion"))
    yield DONE


async def _native_stream(run, job, choices, shaper, settings, ping, replies
                         ) -> AsyncIterator[bytes]:
    """/completion's stream: a partial per token, a final object with stop: true, no [DONE]."""
    c = choices[0]
    async for _, event in run.events(ping):
        if event is None:
            yield PING
            continue
        entry = c.add(event)
        if event.kind == "token":
            yield sse(shaper.native_partial(c, event.text, event.token_id, entry))
        elif event.kind == "done":
            if event.finish_reason == "error":
                raise APIError(f"generation failed: {event.error}", "server_error")
            if event.text:
                yield sse(shaper.native_partial(c, event.text, None, None))
            yield sse(shaper.native_final(c, "", settings))


# --------------------------------------------------------------------------- other routes

async def embeddings(request: Request) -> Response:
    """OpenAI's embeddings (llama-server's `handle_embeddings_impl`): one pooled, L2-normalised
    vector per input, as floats or base64 of little-endian float32."""
    state = _state(request)
    body = check(await read_json(request), rq.embeddings_schema(state.served.limits), "")
    if not state.config.embeddings:
        raise not_supported("This server does not support embeddings. Start it with "
                            "`--embeddings`")
    engine = state.served.engine
    items = body["input"]
    if isinstance(items, str) or isinstance(items[0], int):
        items = [items]  # one text, or one list of token ids
    pooling = state.config.pooling or (engine.info.pooling if engine.info.pooling in POOLINGS
                                       else "mean")

    def embed():
        vectors = engine.embed(items, pooling=pooling)
        n_tokens = sum(len(engine.prompt_tokens(i)) if isinstance(i, str) else len(i)
                       for i in items)
        return vectors, n_tokens
    try:
        vectors, n_tokens = await state.served.call(embed)
    except ContextFullError as e:
        raise exceed_context(e.n_prompt, e.n_ctx) from None
    except ValueError as e:  # an empty text, token ids outside the vocabulary
        raise invalid("input", str(e)) from None
    as_base64 = body.get("encoding_format") == "base64"
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64
             else v.tolist()} for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": state.model_name,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


async def models(request: Request) -> Response:
    state = _state(request)
    info = state.served.engine.info
    return JSONResponse({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": int(state.started),
        "owned_by": "llamatui",
        "meta": {"n_vocab": info.n_vocab, "n_ctx": state.served.limits.n_ctx_slot,
                 "n_ctx_train": info.n_ctx_train, "n_embd": info.n_embd,
                 "n_params": info.n_params, "size": info.file_bytes}}]})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})  # the loading gate answers 503 before this


async def metrics_route(request: Request) -> Response:
    state = _state(request)
    if not state.config.metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with "
                            "`--metrics`")
    sched = state.served.scheduler

    def collect():
        return (dict(sched.stats), sched.slots_info(), sched.n_queued(),
                state.served.engine.kv_usage())
    stats, slots, n_queued, kv = await state.served.call(collect)
    text = await state.served.call(metrics.render, stats, slots, n_queued, kv, state.lag)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def slots(request: Request) -> Response:
    """llama-server's /slots, without prompt text (only counts)."""
    state = _state(request)
    if not state.config.slots:
        raise not_supported("This server does not support slots endpoint. Start it without "
                            "`--no-slots`")
    infos = await state.served.call(state.served.scheduler.slots_info)
    return JSONResponse([{
        "id": s["id"], "id_task": s["request_id"] if s["request_id"] is not None else -1,
        "n_ctx": s["n_ctx"], "is_processing": s["request_id"] is not None,
        "state": s["state"], "n_prompt_tokens": s["n_prompt"], "n_cached": s["n_cached"],
        "n_reused": s["n_reused"], "n_decoded": s["n_generated"],
        "prompt_per_second": s["prompt_tps"], "predicted_per_second": s["gen_tps"]}
        for s in infos])


async def tokenize(request: Request) -> Response:
    state = _state(request)
    body = check(await read_json(request), rq.tokenize_schema(state.served.limits), "")
    engine = state.served.engine
    ids = await state.served.call(engine.tokenize, body["content"],
                                   add_special=body.get("add_special", False),
                                   parse_special=body.get("parse_special", True))
    if not body.get("with_pieces"):
        return JSONResponse({"tokens": ids})
    pieces = []
    for t in ids:
        raw = engine.tokenizer.token_to_piece(t)
        try:
            piece = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)  # llama-server: bytes when the piece is not valid UTF-8
        pieces.append({"id": t, "piece": piece})
    return JSONResponse({"tokens": pieces})


async def detokenize(request: Request) -> Response:
    state = _state(request)
    body = check(await read_json(request), rq.detokenize_schema(state.served.limits), "")
    text = await state.served.call(state.served.engine.detokenize, body["tokens"])
    return JSONResponse({"content": text})


async def apply_template(request: Request) -> Response:
    state = _state(request)
    body = check(await read_json(request), rq.apply_template_schema(state.served.limits), "")
    messages = [rq._flat_message(m) for m in body["messages"]]
    job = rq.Job(prompts=[messages], chat=True, sampling={})
    # enable_thinking, chat_template_kwargs over the server's
    job.template_vars = rq.reasoning_options(body, state.config)[0]
    prompt = await state.served.call(_render, state.served.engine, messages, None, job, True)
    return JSONResponse({"prompt": prompt})


async def props(request: Request) -> Response:
    state = _state(request)
    engine, limits = state.served.engine, state.served.limits
    defaults = SamplingParams()
    tok = engine.tokenizer
    return JSONResponse({
        "default_generation_settings": {"n_ctx": limits.n_ctx_slot, "params": {
            "temperature": defaults.temperature, "top_k": defaults.top_k,
            "top_p": defaults.top_p, "min_p": defaults.min_p,
            "repeat_penalty": defaults.repeat_penalty, "n_predict": -1}},
        "total_slots": limits.n_slots, "model_alias": state.model_name,
        "model_path": engine.info.path,
        "modalities": {"vision": False, "audio": False, "video": False},
        "endpoint_slots": state.config.slots, "endpoint_props": False,
        "endpoint_metrics": state.config.metrics,
        "chat_template": engine.template.source or "",
        "bos_token": tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
        "eos_token": tok.token_text(tok.eos_id) if tok.eos_id is not None else "",
        "build_info": "llamatui", "is_sleeping": False})


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.document(ROUTES, _state(request).served.limits))


# --------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Route:
    """paths: the route and its aliases; public: answers without the API key (only /health and
    /v1/models); body: the request schema (a function of the model's limits); response: the
    name of the 200 answer's schema in openapi.RESPONSES; stream: may answer SSE."""
    paths: tuple[str, ...]
    method: str
    handler: Callable
    summary: str
    response: str
    body: Callable | None = None
    public: bool = False
    stream: bool = False


ROUTES: list[Route] = [
    Route(("/health", "/v1/health"), "GET", health, "Liveness: 503 while the model loads",
          "Health", public=True),
    Route(("/v1/models", "/models"), "GET", models, "The served model", "ModelList",
          public=True),
    Route(("/v1/chat/completions", "/chat/completions"), "POST", chat_completions,
          "OpenAI chat completion", "ChatCompletion", rq.chat_schema, stream=True),
    Route(("/v1/completions", "/completions"), "POST", completions,
          "OpenAI text completion", "Completion", rq.completions_schema, stream=True),
    Route(("/completion",), "POST", native_completion, "llama.cpp's native completion",
          "NativeCompletion", rq.native_completion_schema, stream=True),
    Route(("/v1/embeddings", "/embeddings"), "POST", embeddings, "OpenAI embeddings",
          "Embeddings", rq.embeddings_schema),
    Route(("/tokenize",), "POST", tokenize, "Text to token ids", "Tokens",
          rq.tokenize_schema),
    Route(("/detokenize",), "POST", detokenize, "Token ids to text", "Content",
          rq.detokenize_schema),
    Route(("/apply-template",), "POST", apply_template, "The chat template's prompt",
          "Prompt", rq.apply_template_schema),
    Route(("/props",), "GET", props, "Server and model properties", "Props"),
    Route(("/slots",), "GET", slots, "The slots (no prompt text)", "Slots"),
    Route(("/metrics",), "GET", metrics_route, "Prometheus metrics", "Metrics"),
    Route(("/openapi.json",), "GET", openapi_json, "This document", "OpenAPI"),
]

PUBLIC_PATHS = frozenset(p for r in ROUTES if r.public for p in r.paths)
