"""Keeping an MCP server's secrets out of logs and failures: ``Redactor`` hides one server's
credentials (env and header values, URL userinfo and query values, secret-named arguments) in
any text bound for the worker's log or the workflow history, and the HTTP client's own request
log has its URLs redacted."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx2

from turnkeep.config.settings import McpServerSettings

REDACTED = "***"


# Names of options, variables and query keys whose value is a credential: `--token X`,
# `--api-key=X`, `PASSWORD=X`, `$GITHUB_TOKEN`.
_SECRET_NAME = re.compile(r"token|key|secret|passw|auth|credential|cookie", re.IGNORECASE)


# Shorter values are no secret worth hiding, and replacing them would garble unrelated text.
_MIN_SECRET_CHARS = 4


# Anything URL-like in free text: HTTP libraries quote the URL they failed on.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


@dataclass(frozen=True)
class Redactor:
    """Hides one server's secrets in text bound for the worker's log or a failure: its ``env``
    and ``headers`` values, its URL's userinfo and query values, ``args`` given to a
    secret-named option (``--token X``, ``--api-key=X``), and the values of secret-named
    environment variables its command, args, URL or headers contain (what ``${API_KEY}``
    expanded to). URLs anywhere in the text lose their userinfo and query values too."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: McpServerSettings) -> Redactor:
        found = set((cfg.env or {}).values())
        for value in (cfg.headers or {}).values():
            found.add(value)
            found.update(value.split()[-1:])  # the X of "Bearer X", which a server may echo
        found.update(_url_secrets(cfg.url or ""))
        found.update(_arg_secrets(cfg.args))
        given = [cfg.command or "", *cfg.args, cfg.url or "", *(cfg.headers or {}).values()]
        found.update(
            value
            for name, value in os.environ.items()
            if _SECRET_NAME.search(name) and any(value and value in g for g in given)
        )
        # Longest first, so a secret containing another is hidden whole.
        kept = sorted((s for s in found if len(s) >= _MIN_SECRET_CHARS), key=len, reverse=True)
        return cls(tuple(kept))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return _redact_urls(text)


class _UrlRedactingFilter(logging.Filter):
    """httpx logs every request's URL at INFO (``HTTP Request: POST https://…?api_key=…``):
    a worker logging at INFO would write an HTTP server's secrets. Only its URLs are rewritten."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _redact_urls(record.getMessage())
        record.args = None
        return True


logging.getLogger(httpx2.__name__).addFilter(_UrlRedactingFilter())


def _url_secrets(url: str) -> Iterator[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    yield from (v for v in (parts.username, parts.password, parts.fragment) if v)
    for _, value in parse_qsl(parts.query, keep_blank_values=True):
        yield value


def _arg_secrets(args: Sequence[str]) -> Iterator[str]:
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if eq and _SECRET_NAME.search(name):
            yield value
        elif not eq and arg.startswith("-") and _SECRET_NAME.search(arg) and i + 1 < len(args):
            yield args[i + 1]


def _redact_urls(text: str) -> str:
    return _URL_IN_TEXT.sub(lambda m: _redact_url(m[0]), text)


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return f"{url.partition('://')[0]}://{REDACTED}"
    netloc = f"{REDACTED}@" if "@" in parts.netloc else ""
    netloc += f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port is not None else ""
    query = "&".join(
        f"{key}={REDACTED}" for key, _ in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, REDACTED if parts.fragment else ""))
