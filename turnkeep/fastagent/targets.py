"""fast-agent's MCP targets: a server given as a command line or a URL (``mcp.targets`` until
fast-agent 0.9, ``mcp.servers.<name>.target`` from 0.10), parsed and named as fast-agent's
``fast_agent.mcp.connect_targets`` and ``fast_agent.cli.commands.url_parser`` do at
``FAST_AGENT_COMMIT``."""

from __future__ import annotations

import hashlib
import ipaddress
import re
import shlex
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def server_targets(targets: Any) -> dict[str, dict[str, Any]]:
    """fast-agent's ``mcp.targets`` list (until 0.9): each entry a target string, or a mapping
    with ``target``, an optional ``name`` and other server keys. Later ``mcp.servers`` entries
    of the same name win."""
    if not isinstance(targets, list):
        raise ValueError("`mcp.targets` must be a list")
    servers: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(targets):
        where = f"mcp.targets[{index}]"
        if isinstance(entry, str):
            entry = {"target": entry}
        if not isinstance(entry, dict):
            raise ValueError(f"`{where}` must be a string or mapping")
        overrides = {key: value for key, value in entry.items() if key not in ("target", "name")}
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"`{where}.name` must be a non-empty string")
        derived, settings = target_settings(entry.get("target"), f"{where}.target")
        name = name.strip() if isinstance(name, str) else derived
        settings = {**settings, **overrides}
        if name in servers and servers[name] != settings:
            raise ValueError(
                f"`{where}` resolves to duplicate server name {name!r} with different "
                "settings; set an explicit unique `name`"
            )
        servers[name] = settings
    return servers


def target_settings(target: Any, where: str = "target") -> tuple[str, dict[str, Any]]:
    """A target string's server name and settings, as fast-agent derives them: a URL is an
    ``http`` server (``sse`` when its path ends in ``/sse``; ``/mcp`` appended to an http URL
    without a query whose path does not end so), named after its host (and port and path on
    localhost or an IP address); anything else is a command line, named after its ``npx`` /
    ``uvx`` package or its command."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"`{where}` must be a non-empty string")
    try:
        tokens = shlex.split(target.strip())
    except ValueError as err:
        raise ValueError(f"`{where}` is not a valid command line: {err}") from None
    first = tokens[0]
    if first.lower().startswith(("http://", "https://")):
        if len(tokens) != 1:
            raise ValueError(
                f"`{where}` must be a pure URL; move flags to structured server settings "
                "(`headers`, `access_token`)"
            )
        transport, url = _server_url(first, where)
        return _url_name(url), {"transport": transport, "url": url}
    if first.startswith("@"):
        mode, command, args = "npx", "npx", tokens
    elif first.lower() in ("npx", "uvx"):
        mode, command, args = first.lower(), first.lower(), tokens[1:]
        if not args or args[0].strip() in ("", "@"):
            raise ValueError(f"`{where}` names no package after {first}")
    else:
        mode, command, args = "stdio", first, tokens[1:]
    name = _package_name(mode, args) if mode != "stdio" else _slug(re.split(r"[/\\]", first)[-1])
    return name, {"transport": "stdio", "command": command, "args": args}


def _server_url(url: str, where: str) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"`{where}` must be an http(s) URL with a host")
    path = parts.path.rstrip("/")
    if path.endswith("/sse"):
        return "sse", url
    if not parts.query and not path.endswith("/mcp"):
        url = urlunsplit(parts._replace(path=f"{path}/mcp"))
    return "http", url


def _url_name(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    clean = re.sub(r"[^a-zA-Z0-9]", "_", host)
    if len(clean) > 15:
        clean = clean[:9] + clean[-5:]
    if host == "localhost" or _is_ip(host):
        port = f"_{parts.port}" if parts.port is not None else ""
        path = re.sub(r"[^a-zA-Z0-9]", "_", parts.path.strip("/"))
        if path:
            return f"{clean}{port}_{path[:20]}"
        # A name, not a secret: fast-agent's way to tell path-less local servers apart.
        digest = hashlib.md5(url.encode(), usedforsecurity=False).hexdigest()[:8]
        return f"{clean}{port}_{digest}"
    return clean


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _package_name(mode: str, args: list[str]) -> str:
    value_options = {"--package", "-p"} if mode == "npx" else {"--from"}
    package, skip = "", False
    for arg in args:
        if skip:
            skip = False
        elif arg in value_options:
            skip = True
        elif any(arg.startswith(f"{option}=") for option in value_options):
            continue
        elif not arg.startswith("-"):
            package = arg
            break
    package = package or (args[0] if args else mode)
    if package.startswith("@") and package.count("@") > 1:
        package = package.rsplit("@", 1)[0]
    elif not package.startswith("@"):
        package = package.split("@", 1)[0]
    return _slug(package.rsplit("/", 1)[-1])


def _slug(value: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]+", "-", value).strip("-_").lower() or "mcp-server"
