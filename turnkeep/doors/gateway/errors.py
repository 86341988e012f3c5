"""The gateway's one error shape: a status and one line naming the problem."""

from __future__ import annotations

from collections.abc import Mapping


class ApiError(Exception):
    """Answered as ``{"error": message}`` with ``status``."""

    def __init__(
        self, status: int, message: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())  # one line, whatever it quotes
        self.headers = dict(headers or {})
