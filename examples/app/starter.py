"""Starts the app's workflow and prints its report. ``python starter.py [QUESTION]``, with
``worker.py`` running."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from codec import DATA_CONVERTER
from temporalio.client import Client
from worker import TASK_QUEUE
from workflows import ResearchRequest, ResearchWorkflow

from turnkeep import TurnkeepClientPlugin

# Offline, the passthrough model runs the tool a `***CALL_TOOL` line names.
OFFLINE_QUESTION = '***CALL_TOOL researcher__city_population {"city": "Paris"}'
QUESTION = "How many people live in Paris?"


async def main() -> None:
    online = os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("OPENAI_API_KEY")
    question = sys.argv[1] if len(sys.argv) > 1 else QUESTION if online else OFFLINE_QUESTION
    # turnkeep's client plugin reads what its workers store outside the history (big results).
    client = await Client.connect(
        os.environ.get("TEMPORAL_ADDRESS", "localhost:7233"),
        data_converter=DATA_CONVERTER,
        plugins=[TurnkeepClientPlugin()],
    )
    handle = await client.start_workflow(
        ResearchWorkflow.run,
        ResearchRequest(question),
        id=f"research-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
    )
    print(f"workflow: {handle.id}", flush=True)
    report = await handle.result()
    print(f"findings: {report.findings}\nnote:     {report.note}\nsummary:  {report.summary}")


if __name__ == "__main__":
    asyncio.run(main())
    # A short-lived client process can abort as the interpreter finalizes, while the Temporal
    # SDK's Rust threads still hold callbacks into Python ("PyGILState_Release ... finalizing",
    # temporalio/sdk-python#300): once the report is out, leave without finalizing.
    sys.stdout.flush()
    os._exit(0)
