"""The A2A TCK's system under test: the fake model API answering as the TCK's scripted agent,
and ``turnkeep gateway --no-auth`` serving the ``tck`` agent of ``turnkeep.yaml`` beside this
file (on the embedded dev server, or on ``--address``). Run it, then point the TCK at
``http://127.0.0.1:<port>/a2a/tck``; Ctrl-C stops both.

    python tests/a2a_tck/sut.py --listen 127.0.0.1:9999 [--address localhost:7233]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from turnkeep.testing.fake_api import FakeModelApi, Recorded, Reply, Step

HERE = Path(__file__).parent
ANSWER = "Hello from TCK"  # the scenarios' "complete the task with the message"


def respond(request: Recorded) -> Step | None:
    """Every model call of the agent is answered with the TCK's completing message."""
    del request
    return Reply.text(ANSWER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:9999")
    parser.add_argument("--address", default=None, help="Temporal frontend (default: embedded)")
    args = parser.parse_args()
    with FakeModelApi(respond=respond) as api:
        env = {**os.environ, "TCK_MODEL_PORT": str(api.port)}
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
