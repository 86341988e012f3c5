"""The HTTP gateway (``turnkeep gateway``): turns, sessions, approvals and their events over
HTTP with server-sent events, for callers that hold no Temporal client. ``gateway_app``
builds it as a Starlette app."""

from turnkeep.doors.gateway.app import gateway_app
from turnkeep.doors.gateway.auth import ApiKey, KeyRing

__all__ = ["ApiKey", "KeyRing", "gateway_app"]
