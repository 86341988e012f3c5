"""``shared``: one object per distinct plan or tool across the turns of a worker process."""

from __future__ import annotations

import weakref
from typing import TypeVar, cast

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


class SharedValues:
    """One object per distinct value across the turns of a worker process: the plan and the
    tools of every turn of an agent are the same (an instruction, tool descriptions and JSON
    schemas: often tens of KB), and a worker may cache thousands of turns that wait for a
    person, each of which would otherwise hold its own copy. Sound only for values never
    changed in place (turnkeep replaces a plan or a tool, it never edits one), and equal by
    their JSON: the shared one is then the same on replay as the one it stands for. Held
    weakly: a value goes once no turn holds it (a one-off override's plan, a tool no longer
    listed).

    ``turnkeep.workflows`` passes through the sandbox (``turnkeep.worker.runner``),
    so this is one table per process. Workflow tasks run on several threads: a race costs at
    most one value not shared."""

    def __init__(self) -> None:
        self._by_json: weakref.WeakValueDictionary[tuple[type[BaseModel], str], BaseModel] = (
            weakref.WeakValueDictionary()
        )

    def __call__(self, value: M) -> M:
        # Keyed by the class too: what comes back is of ``value``'s class.
        return cast(M, self._by_json.setdefault((type(value), value.model_dump_json()), value))

    def __len__(self) -> int:
        return len(self._by_json)


shared = SharedValues()
