"""The documentation's links and generated references (no server needed), and the examples of
"Testing your agents" (docs/testing.md), run as a user would run them (they start servers).

Every relative link in the READMEs, the changelog and the documentation must resolve to a file of
this repository (or a page the site's build hooks generate), an ``#anchor`` to a heading of its
target, and an absolute link must be a public http(s) URL: nothing may point outside the
repository, as a link to a design document elsewhere once did. ``mkdocs build --strict`` (in ``make
lint``) checks the site's own links again, as MkDocs resolves them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from docs import hooks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "bench" / "README.md",
        *(ROOT / "deploy").rglob("*.md"),
        *DOCS.rglob("*.md"),
    }
)
GENERATED = {DOCS / uri: render for uri, render in hooks.GENERATED.items()}

_FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
_HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _without_fences(text: str) -> str:
    """``text`` with its fenced code blocks blanked (a fence closes on a bare marker of its own
    kind, at least as long as the one that opened it)."""
    kept, fence = [], ""
    for line in text.splitlines():
        match = _FENCE_LINE.match(line)
        if not fence and match:
            fence = match[1]
        elif fence and match and match[1].startswith(fence) and not match[2].strip():
            fence = ""
        elif not fence:
            kept.append(line)
            continue
        kept.append("")
    return "\n".join(kept)


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _without_fences(text))


def links(text: str) -> list[str]:
    prose = _prose(text)
    return [
        m[1] for pattern in (_INLINE_LINK, _REFERENCE, _HTML_LINK) for m in pattern.finditer(prose)
    ]


@cache
def source(path: Path) -> str:
    if path in GENERATED:
        return GENERATED[path]()
    return path.read_text(encoding="utf-8")


def _slugs(heading: str) -> set[str]:
    """The anchors a heading gets: GitHub's and Python-Markdown's (MkDocs) spelling."""
    text = re.sub(r"<[^>]+>", "", heading).replace("`", "").strip().lower()
    github = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
    mkdocs = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip())
    return {github, mkdocs}


@cache
def anchors(path: Path) -> frozenset[str]:
    found: set[str] = set()
    for heading in _HEADING.findall(_without_fences(source(path))):
        found |= _slugs(heading)
    return frozenset(found)


def _public_host(host: str) -> bool:
    if host in ("localhost", "") or host.endswith((".local", ".internal", ".localhost")):
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." in host  # a name that resolves publicly, not a bare intranet host
    return address.is_global


def problems(page: Path) -> list[str]:
    found = []
    for target in links(source(page)):
        parts = urlsplit(target)
        if parts.scheme or target.startswith("//"):
            if parts.scheme not in ("http", "https") or not _public_host(parts.hostname or ""):
                found.append(f"{target}: absolute links must be public http(s) URLs")
            continue
        if target.startswith("/"):
            found.append(f"{target}: a path from the filesystem root, not from this file")
            continue
        path_part = unquote(parts.path)
        resolved = (page.parent / path_part).resolve() if path_part else page
        if "shared" in Path(path_part).parts:
            found.append(f"{target}: points at a shared folder outside the repository")
            continue
        if not resolved.is_relative_to(ROOT):
            found.append(f"{target}: outside the repository")
            continue
        if not (resolved.exists() or resolved in GENERATED):
            found.append(f"{target}: no such file")
            continue
        if parts.fragment and resolved.suffix == ".md" and parts.fragment not in anchors(resolved):
            found.append(f"{target}: no heading #{parts.fragment} in {resolved.name}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    assert problems(page) == []


def test_the_checker_catches_bad_links() -> None:
    # The checker itself: each kind of bad link is reported, good ones are not.
    page = DOCS / "concepts" / "_probe.md"
    text = "\n".join(
        [
            "# Probe",
            "[ok](../index.md) [ok](turn-loop.md#turninput) [ok](https://temporal.io)",
            "[gone](missing.md) [out](../../../SPEC.md) [shared](../../../shared/SPEC.md)",
            "[root](/etc/passwd) [local](http://127.0.0.1:8233) [anchor](../library.md#nope)",
            "`[code](not-a-link.md)`",
            "```",
            "[fenced](not-a-link.md)",
            "```",
        ]
    )
    GENERATED[page] = lambda: text
    try:
        reported = [p.split(":")[0] for p in problems(page)]
    finally:
        del GENERATED[page]
        source.cache_clear()
    assert reported == [
        "missing.md",
        "../../../SPEC.md",
        "../../../shared/SPEC.md",
        "/etc/passwd",
        "http",
        "../library.md#nope",
    ]


def test_the_configuration_reference_names_every_setting() -> None:
    from turnkeep.config.settings import Settings

    reference = hooks.configuration_reference()
    keys = [name for name, field in Settings.model_fields.items() if not field.exclude]
    assert keys and [key for key in keys if f"| `{key}` |" not in reference] == []
    # Nested keys too, with their defaults (an agent's tool timeouts differ from its model's).
    assert "| `agents.<name>.tool_timeouts.start_to_close` | number | `300.0` |" in reference
    assert "| `agents.<name>.llm_timeouts.start_to_close` | number | `600.0` |" in reference
    assert "| `payload_storage.retention` | duration \\| null | `7d` |" in reference


def test_the_cli_reference_names_every_command() -> None:
    import typer.core
    import typer.main

    from turnkeep.cli.main import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    commands = group.list_commands(group.context_class(group, info_name="turnkeep"))
    reference = hooks.cli_reference()
    assert "run" in commands
    assert [c for c in commands if f"## `turnkeep {c}`" not in reference] == []
    assert "`--max-iterations <int>`" in reference


def test_the_python_reference_names_every_public_name() -> None:
    import turnkeep

    reference = hooks.python_reference()
    assert [name for name in turnkeep.__all__ if f"## `{name}`" not in reference] == []


# A fenced block that names its file (```python title="test_x.py"): what the page asks a reader
# to write, and so what its test writes and runs.
_TITLED_BLOCK = re.compile(
    r'^```(\w+)[^\n]*?title="([^"]+)"[^\n]*\n(.*?)^```\s*$', re.MULTILINE | re.DOTALL
)


def titled_blocks(page: Path) -> dict[str, str]:
    return {m[2]: m[3] for m in _TITLED_BLOCK.finditer(page.read_text(encoding="utf-8"))}


@pytest.mark.server
def test_the_testing_pages_examples_run(tmp_path: Path) -> None:
    page = DOCS / "testing.md"
    files = titled_blocks(page)
    # Every Python example on the page is one of these files, so none goes untested.
    python_blocks = re.findall(r"^```python", page.read_text(encoding="utf-8"), re.MULTILINE)
    assert len(python_blocks) == len(files)
    assert sorted(files) == [
        "conftest.py",
        "example.py",
        "test_offline.py",
        "test_replay.py",
        "test_researcher.py",
        "test_scripts.py",
        "test_support_regressions.py",
    ]
    for name, code in files.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    # The page's replay check reads downloaded histories: a recorded turn's.
    (tmp_path / "histories").mkdir()
    shutil.copy(ROOT / "tests" / "histories" / "plain.json", tmp_path / "histories" / "turn.json")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # its own rootdir
    # As a user's own run: none of this run's pytest settings (an xdist worker's, say).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # Side by side: each starts a dev server of its own.
    with (
        start("-m", "pytest", "-q", "-p", "no:cacheprovider") as tests,
        start("example.py") as example,
    ):
        tests_out, tests_err = tests.communicate(timeout=240)
        example_out, example_err = example.communicate(timeout=240)
    assert tests.returncode == 0, tests_out + tests_err
    assert "6 passed" in tests_out, tests_out
    assert example.returncode == 0, example_err
    assert example_out == "Hello!\n"


@pytest.mark.parametrize("uri", sorted(hooks.REFERENCES))
def test_the_committed_references_are_current(uri: str) -> None:
    """The references are committed so their links work on a code host too; the site renders
    them afresh. A stale copy: `python -m docs.hooks` writes them anew."""
    committed = (DOCS / uri).read_text(encoding="utf-8")
    assert committed == hooks.REFERENCES[uri]() + "\n", f"{uri} is stale: run python -m docs.hooks"


def test_the_readmes_python_runs_when_pasted_into_a_file() -> None:
    """Each Python block of the README is a whole module: no `await` outside a function."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(blocks) >= 2
    for block in blocks:
        compile(block, "README.md", "exec")  # a top-level await is a SyntaxError here
