"""The chat and approvals web page the HTTP gateway serves at ``/``: static files only (an
HTML page, a plain ES module and a stylesheet), no build step, talking to the gateway's own
``/api`` with the user's API key."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent
"""The page's files, served under ``/static/`` (``index.html`` is the page itself)."""

INDEX = STATIC_DIR / "index.html"
"""The page served at ``/``."""

FILES: dict[str, str] = {"app.js": "text/javascript", "web.css": "text/css"}
"""The files served under ``/static/``, by name, with their media types: these alone, so the
package's other files (this module) are never served."""
