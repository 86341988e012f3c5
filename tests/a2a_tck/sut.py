"""The A2A TCK's system under test: ``turnkeep gateway --no-auth`` serving the ``tck`` agent of
``turnkeep.yaml`` beside this file (on the embedded dev server, or on ``--address``), and the
fake model API as that agent's model. Run it, then point the TCK at
``http://127.0.0.1:<port>/a2a/tck``; Ctrl-C stops both.

The agent's hook (``tck_hooks.py``) answers each scenario before any model call; the model is
asked only in a task that waits for input, and ``respond`` is that model: it asks the user
(the ``ask`` tool), asks again while the answers are the TCK's history messages, and then
completes the task.

    python tests/a2a_tck/sut.py --listen 127.0.0.1:9999 [--address localhost:7233]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from turnkeep.testing.fake_api import FakeModelApi, Recorded, Reply, Step

HERE = Path(__file__).parent
ANSWER = "Hello from TCK"  # the scenarios' "complete the task with the message"
# The TCK's follow-ups that keep a task waiting for input (its history test's messages).
KEEP_ASKING = "TCK history message"
_calls = itertools.count(1)


def respond(request: Recorded) -> Step | None:
    """The model of a task that waits for input: ask, and ask again while the answer is one
    of the TCK's history messages; then complete."""
    messages = request.body.get("messages", []) if isinstance(request.body, dict) else []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool" and KEEP_ASKING not in json.dumps(last.get("content")):
        return Reply.text(ANSWER)
    call = (f"call_{next(_calls)}", "tck__ask", {"question": "What else?"})
    return Reply.tool_calls(call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:9999")
    parser.add_argument("--address", default=None, help="Temporal frontend (default: embedded)")
    args = parser.parse_args()
    with FakeModelApi(respond=respond) as api:
        env = {
            **os.environ,
            "TCK_MODEL_PORT": str(api.port),
            "TCK_PYTHON": sys.executable,
            "TCK_DIR": str(HERE),
        }
        command = [str(Path(sys.executable).with_name("turnkeep")), "gateway", "--no-auth", "--a2a"]
        command += ["--listen", args.listen, "-c", str(HERE / "turnkeep.yaml")]
        command += ["--worker"] + (["--address", args.address] if args.address else [])
        gateway = subprocess.Popen(command, env=env)
        # A SIGTERM stops the gateway as Ctrl-C does.
        signal.signal(signal.SIGTERM, lambda *_: gateway.terminate())
        try:
            gateway.wait()
        except KeyboardInterrupt:
            gateway.terminate()
            gateway.wait()


if __name__ == "__main__":
    main()
