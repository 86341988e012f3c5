"""The app's own activity, and the function tool its researcher agent calls: plain Python,
nothing of turnkeep's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from temporalio import activity

# Where save_note keeps the research notes; the working directory by default.
NOTES = Path(os.environ.get("RESEARCH_NOTES", "research-notes.md"))

POPULATIONS = {"paris": 2_102_650, "lyon": 522_250, "marseille": 877_215}


@activity.defn
async def save_note(findings: str) -> str:
    """Append the findings to the notes file; returns where they went."""
    await asyncio.to_thread(_append, f"- {findings}\n")
    return f"saved {len(findings.split())} words to {NOTES}"


def _append(line: str) -> None:
    with NOTES.open("a", encoding="utf-8") as notes:
        notes.write(line)


def city_population(city: str) -> str:
    """The population of a French city (Paris, Lyon or Marseille)."""
    count = POPULATIONS.get(city.strip().lower())
    if count is None:
        return f"No figure for {city}; I know {', '.join(sorted(POPULATIONS))}."
    return f"{city.title()} has {count:,} inhabitants (INSEE, 2023)."
