"""Errors as llama-server and the OpenAI API send them: `{"error": {"code", "message", "type"}}`
with llama-server's types and statuses (tools/server/server-common.cpp, `format_error_response`).

A handler raises `APIError`; the app turns it into that body with its HTTP status. A request
field's error names the field in `param` (OpenAI's `error.param`) and in the message.
"""
from __future__ import annotations

# llama-server's error types → HTTP status (format_error_response)
ERROR_TYPES = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}


class APIError(Exception):
    """An error answer: `type` is one of ERROR_TYPES (which gives the status); `param` names the
    request field at fault; `extra` adds fields to the error object (n_prompt_tokens, n_ctx)."""

    def __init__(self, message: str, type: str = "invalid_request_error",
                 param: str | None = None, **extra):
        if type not in ERROR_TYPES:
            raise ValueError(f"unknown error type {type!r}; known: {', '.join(ERROR_TYPES)}")
        super().__init__(message)
        self.message, self.type, self.param, self.extra = message, type, param, extra

    @property
    def status(self) -> int:
        return ERROR_TYPES[self.type]

    def body(self) -> dict:
        error = {"code": self.status, "message": self.message, "type": self.type}
        if self.param is not None:
            error["param"] = self.param
        error.update(self.extra)
        return {"error": error}


def invalid(param: str, message: str) -> APIError:
    """A bad request field: the message starts with the field's name."""
    return APIError(f"{param}: {message}", "invalid_request_error", param=param)


def exceed_context(n_prompt: int, n_ctx: int) -> APIError:
    """llama-server's answer to a prompt longer than a slot's context."""
    return APIError(f"the request exceeds the available context size ({n_prompt} prompt tokens, "
                    f"context of {n_ctx}); try increasing it with -c or shortening the prompt",
                    "exceed_context_size_error", n_prompt_tokens=n_prompt, n_ctx=n_ctx)


def unavailable(message: str) -> APIError:
    return APIError(message, "unavailable_error")


def not_supported(message: str) -> APIError:
    return APIError(message, "not_supported_error")


LOADING = "Loading model"  # llama-server's message while the model loads
INVALID_KEY = "Invalid API Key"
