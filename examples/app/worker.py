"""The app's worker: its own workflow and activity, and turnkeep's turns beside them on the same
task queue, through ``TurnkeepPlugin``. ``python worker.py`` (TEMPORAL_ADDRESS, default
localhost:7233)."""

from __future__ import annotations

import asyncio
import os

from activities import city_population, save_note
from codec import DATA_CONVERTER
from temporalio.client import Client
from temporalio.worker import Worker
from workflows import ResearchWorkflow

from turnkeep import Agent, TurnkeepPlugin

TASK_QUEUE = "research-app"

# No `model`: a real model when ANTHROPIC_API_KEY or OPENAI_API_KEY is set, else the offline
# passthrough model (it calls the tools that a `***CALL_TOOL` line of the prompt names).
AGENTS = [
    Agent(
        name="researcher",
        instruction="Answer with facts from your tools, citing their source.",
        tools=[city_population],  # the model sees it as researcher__city_population
        max_iterations=5,
    ),
    Agent(name="summarizer", instruction="Summarise what you are given in one sentence."),
]


async def main() -> None:
    client = await Client.connect(
        os.environ.get("TEMPORAL_ADDRESS", "localhost:7233"), data_converter=DATA_CONVERTER
    )
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[ResearchWorkflow],
        activities=[save_note],
        plugins=[TurnkeepPlugin(agents=AGENTS)],
    )
    print(f"worker polling {TASK_QUEUE!r}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
