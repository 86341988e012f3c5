"""The scripts a fake API answers from, and the requests it got: which step answers a request."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnkeep.testing.fake_api.steps import APIS, Api, Failure, Step


@dataclass(frozen=True)
class Recorded:
    api: Api
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or the raw text if it was not JSON
    at: float  # time.monotonic() on arrival

    @property
    def model(self) -> str | None:
        """The model id the request named."""
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) else None


class Scripts:
    """A script per API and per model id, the request fields refused, and every request
    recorded; the test's thread writes them while the server's thread answers from them."""

    def __init__(
        self,
        *,
        default: Step | None = None,
        respond: Callable[[Recorded], Step | None] | None = None,
    ) -> None:
        """``default`` answers once a script runs out (benchmarks); without it such a request
        gets a 400 saying the script is exhausted, which no provider adapter retries.
        ``respond``, if given, answers such a request first, from the request itself (a
        scripted system under test); its None falls through to ``default``."""
        self.default = default
        self.respond = respond
        self._scripts: dict[Api, deque[Step]] = {api: deque() for api in APIS}
        self._model_scripts: dict[str, deque[Step]] = {}
        self._requests: list[Recorded] = []
        self._refused_fields: dict[str, int] = {}
        self._lock = threading.Lock()

    def refuse_field(self, name: str, *, status: int = 400) -> None:
        """Answer every request whose JSON body has the top-level field ``name`` with a
        ``status`` error naming it, as a server that does not know the field does, using up no
        script step (the request is still recorded). ``reset`` forgets it."""
        with self._lock:
            self._refused_fields[name] = status

    def script(self, *steps: Step, api: Api | None = None, model: str | None = None) -> None:
        """Append steps to the script of one API, or of both (each serves its own copy); with
        ``model``, to that model id's own script instead, which answers its requests on
        either API from then on."""
        if model is not None and api is not None:
            raise ValueError("a model's script serves both APIs: give `api` or `model`")
        with self._lock:
            if model is not None:
                self._model_scripts.setdefault(model, deque()).extend(steps)
                return
            for name in (api,) if api else APIS:
                self._scripts[name].extend(steps)

    def pending(self, api: Api | None = None, *, model: str | None = None) -> int:
        """Steps not yet served: of ``api``'s script, or of ``model``'s."""
        with self._lock:
            if model is not None:
                return len(self._model_scripts.get(model, ()))
            if api is None:
                raise ValueError("name the `api` or the `model` whose script to count")
            return len(self._scripts[api])

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, api: Api) -> list[Recorded]:
        return [r for r in self.requests if r.api == api]

    def requests_for_model(self, model: str) -> list[Recorded]:
        return [r for r in self.requests if r.model == model]

    def reset(self) -> None:
        """Forget every script and recorded request (mounts stay)."""
        with self._lock:
            for queue in self._scripts.values():
                queue.clear()
            self._model_scripts.clear()
            self._requests.clear()
            self._refused_fields.clear()

    def take(self, recorded: Recorded, *, authorized: bool = True) -> Step:
        """Record a request and take the step that answers it: a 401 if it is not
        ``authorized``, a 400 if it carries a refused field, else the next step of its model's
        script (if it has one) or of its API's; past the end, ``respond``'s, ``default``, or a
        400 saying the script is exhausted."""
        return self.take_from(recorded, authorized=authorized)[0]

    def take_from(
        self, recorded: Recorded, *, authorized: bool = True
    ) -> tuple[Step, deque[Step] | None]:
        """``take``, and the script the step came from (None: it came from none), for
        ``put_back``."""
        body = recorded.body
        source: deque[Step] | None = None
        with self._lock:
            self._requests.append(recorded)
            own = self._model_scripts.get(recorded.model) if recorded.model else None
            script = own if own is not None else self._scripts[recorded.api]
            unknown = [f for f in self._refused_fields if isinstance(body, dict) and f in body]
            step: Step | None
            if not authorized:
                # Never echoing what was sent: it could be a key.
                step = Failure(401, "Invalid authentication credentials", code="invalid_api_key")
            elif unknown:
                # The wording of OpenAI's own API for a field it does not take.
                status = self._refused_fields[unknown[0]]
                step = Failure(status, f"Unrecognized request argument supplied: {unknown[0]}")
            else:
                step = script.popleft() if script else None
                source = script if step is not None else None
        if step is None and self.respond is not None:
            step = self.respond(recorded)
        step = step if step is not None else self.default
        if step is None:
            whose = f"model {recorded.model!r}" if own is not None else recorded.api
            step = Failure(400, f"fake model API: the {whose} script is exhausted")
        return step, source

    def put_back(self, step: Step, source: deque[Step] | None) -> None:
        """Return a step that did not answer (a rate limit refused its request first) to the
        front of the script it came from, so the request's retry gets it."""
        if source is not None:
            with self._lock:
                source.appendleft(step)
