"""The codec server's own pages: ``/login``, where a browser signs in with the token, and what it
shows once signed in (how to point the Web UI at this server)."""

from __future__ import annotations

import html
from collections.abc import Iterable
from datetime import timedelta

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from turnkeep.payloads.codec_server.cors import own_origin
from turnkeep.support.durations import describe_duration

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:44rem;margin:3rem auto;padding:0 1rem;"
    "line-height:1.5}input{font:inherit;padding:.3rem;width:24rem}button{font:inherit}"
    "code{background:#eee;padding:0 .2rem}.error{color:#b00}"
)


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_STYLE}</style></head>"
        f"<body><h1>{title}</h1>{body}</body></html>",
        status_code=status,
        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"},
    )


def _ui_steps(request: Request, allowed: Iterable[str]) -> str:
    endpoint = html.escape(own_origin(request))
    uis = ", ".join(f'<a href="{html.escape(o)}">{html.escape(o)}</a>' for o in sorted(allowed))
    return (
        "<p>In the Temporal Web UI"
        + (f" ({uis})" if uis else "")
        + ", open the codec server settings (the <em>Codec Server</em> button in the top bar) "
        "and choose <em>Use my browser setting and ignore Cluster-level setting</em>; set the "
        f"endpoint to <code>{endpoint}</code>, tick <em>Include cross-origin credentials</em> "
        "and apply. The browser then sends this sign-in with the UI's decode requests. Open the "
        "UI on the same host name as this page (127.0.0.1 and localhost are different sites, "
        "and the sign-in only travels within a site).</p>"
    )


def login_page(request: Request, allowed: Iterable[str], error: str | None = None) -> Response:
    message = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return _page(
        "turnkeep codec server",
        message + "<p>Paste the codec server's token (<code>encryption.codec_server.token</code> "
        "in turnkeep.yaml) to let this browser's Temporal Web UI decrypt turn payloads.</p>"
        '<form method="post" action="/login"><input type="password" name="token" '
        'autocomplete="off" autofocus required> <button type="submit">Sign in</button></form>'
        + _ui_steps(request, allowed),
        status=401 if error else 200,
    )


def signed_in_page(request: Request, allowed: Iterable[str], lifetime: timedelta) -> HTMLResponse:
    return _page(
        "Signed in",
        f"<p>This browser may now use the codec server for {describe_duration(lifetime)} (until "
        "you sign out with a POST to <code>/logout</code>, or the server restarts).</p>"
        + _ui_steps(request, allowed),
    )
