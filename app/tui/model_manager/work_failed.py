"""The message a model manager worker posts when its Hub, disk or store call fails."""
from __future__ import annotations

from textual.message import Message


class WorkFailed(Message):
    """`what` failed with `error`; `req`: the request it answered, for a tab that drops the
    answers to requests nobody asks any more."""

    def __init__(self, what: str, error: BaseException, req: int | None = None):
        super().__init__()
        self.what, self.error, self.req = what, error, req
