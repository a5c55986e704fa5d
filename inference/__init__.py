"""The llamatui engine's public API: everything a front-end (app/, and models/ and quantizer/
where they can) uses, and nothing else. import-linter holds app/ to these names
(pyproject.toml, tests/test_architecture.py).

    from llamatui.inference import Engine, LoadConfig
    engine = Engine.load("model.gguf", LoadConfig(n_ctx=4096))
    for event in engine.generate([{"role": "user", "content": "Hi"}]): ...

Names are imported on first use, so that light tools (inspect, tokenize, the model manager) do
not load numba and the kernels.
"""
import importlib

# public name -> "module" (the name is the module's own) or "module:attribute"
_EXPORTS = {
    # loading and running a model
    "Engine": "engine", "ModelInfo": "engine", "GenerationEvent": "engine",
    "default_threads": "config",
    "LoadConfig": "config", "OffloadOptions": "config", "OffloadError": "config",
    "parse_n_gpu_layers": "config",
    "Scheduler": "scheduler", "SamplingParams": "sampling",
    "SAMPLING_LIMITS": "sampling", "Limit": "sampling",
    # what can go wrong
    "ContextFullError": "engine", "EngineBusyError": "engine", "EngineClosedError": "engine",
    "QueueFullError": "scheduler", "NonFiniteLogitsError": "scheduler",
    "ModelMetadataError": "hparams", "InsufficientMemoryError": "memory",
    "UnsupportedArchitectureError": "catalog", "EmbeddingOnlyError": "model",
    # chat formatting, structured output, tool calls
    "CHAT_TEMPLATE_NAMES": "chat.builtin_templates", "ChatTemplateError": "chat.template",
    "ConstraintSpec": "chat.constraint", "ConstraintError": "chat.constraint",
    "generation_schema": "chat.json_schema",
    "ToolPlan": "chat.tool_calls", "ReplyStream": "chat.tool_calls",
    "tool_call_family": "chat.tool_calls:family_of",
    "reasoning_style": "chat.reasoning", "ReasoningBudget": "chat.reasoning",
    "REASONING_FORMATS": "chat.reasoning",
    "reply_stream": "chat.replies", "harmony_messages": "chat.harmony",
    # files, tokens, measurements
    "GGUFError": "gguf", "GGUFFile": "gguf", "GGUFWriter": "gguf", "GGUFValueType": "gguf",
    "Tokenizer": "tokenizers.tokenizer", "POOLINGS": "embedding",
    "run_bench": "bench",
    # (not "perplexity": the name is its module's, which wins once anything has imported it)
    "run_perplexity": "perplexity:perplexity", "count_chunks": "perplexity",
    "LogitsFile": "kl_divergence", "LogitsFileWriter": "kl_divergence",
    "LogitsFileError": "kl_divergence", "run_kl_divergence": "kl_divergence:kl_divergence",
    "kld_chunk_line": "kl_divergence:chunk_line", "kld_report": "kl_divergence:report",
    "KLD_CHUNK_HEADER": "kl_divergence:CHUNK_HEADER",
    # the catalog's facts: ggml types, quantization mixes, architectures
    "GGML_TYPES": "catalog", "MIXES": "catalog", "MIXES_BY_NAME": "catalog",
    "MIXES_BY_FILE_TYPE": "catalog", "MIX_ALIASES": "catalog", "ARCHITECTURES": "catalog",
    "mix_name": "catalog",
    # what runs here (the kernels load on the first question)
    "engine_types": "support", "runs_here": "support", "mix_runs_here": "support",
    # GPUs
    "probe_gpus": "cuda.probe:probe", "CUPY_MISSING": "cuda.probe",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")
    value = getattr(importlib.import_module(f".{module}", __name__), attribute or name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(__all__)
