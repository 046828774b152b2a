"""Errors as OpenAI's API returns them: ``{"error": {"message", "type", "param", "code"}}``
with the status its clients map to their exception classes (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 503 InternalServerError, ...)."""

from __future__ import annotations

from typing import Mapping


def error_type(status: int) -> str:
    """OpenAI's ``type``: "invalid_request_error" for a client's error (4xx, a wrong key and
    an unknown model included, as OpenAI answers them), else "server_error"."""
    return "invalid_request_error" if status < 500 else "server_error"


class APIError(Exception):
    """An error answer: ``status``, a message that says what to fix, the parameter at fault
    (``param``) and a machine-readable ``code``; ``headers`` (e.g. Retry-After)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message,
                          "type": error_type(self.status),
                          "param": self.param, "code": self.code}}


def bad(param: str | None, message: str, code: str | None = None) -> APIError:
    """A 400 naming ``param``."""
    return APIError(400, message, param, code)


def overloaded(message: str, retry_after: int) -> APIError:
    """A 503 with Retry-After: the queue is full or the server is draining."""
    return APIError(503, f"{message}; retry after {retry_after} s", None, "server_overloaded",
                    {"Retry-After": str(retry_after)})
