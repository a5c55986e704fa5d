"""The llamatui engine. Front-ends use `Engine` (and a server its `Scheduler`, with the request
types below); the rest is for tools and tests.

Names are imported on first use so that light tools (inspect, tokenize) don't load the kernels.
"""
import importlib

_EXPORTS = {
    "Engine": "engine", "ContextFullError": "engine", "GenerationEvent": "engine",
    "ModelInfo": "engine", "GGUFError": "gguf", "GGUFFile": "gguf", "GGUFWriter": "gguf",
    "CHAT_TEMPLATE_NAMES": "chat.builtin_templates", "ChatTemplateError": "chat.template",
    "EngineBusyError": "engine", "EngineClosedError": "engine", "Scheduler": "scheduler",
    "SamplingParams": "sampling", "QueueFullError": "scheduler",
    "NonFiniteLogitsError": "scheduler", "ModelMetadataError": "hparams",
    "InsufficientMemoryError": "memory", "UnsupportedArchitectureError": "catalog",
    "ConstraintSpec": "chat.constraint", "ConstraintError": "chat.constraint",
    "generation_schema": "chat.json_schema",
    "EmbeddingOnlyError": "model", "POOLINGS": "embedding",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
