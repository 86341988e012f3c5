"""Pydantic AI + Temporal on the peers' workload: an agent made durable by pydantic-ai's
``TemporalDurability`` capability (the successor of ``TemporalAgent``), run by a workflow, its
model requests and its tool call as activities, on a worker in this process.

Run in its own venv (``bench.peers_bench`` makes it): ``python -m bench.peers.pydantic_ai_peer
--address ... --base-url ... --iterations 20,100``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalDurability
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.peers import common


def build_agent(base_url: str) -> Agent[None, str]:
    model = OpenAIChatModel(
        "bench", provider=OpenAIProvider(base_url=base_url, api_key=common.API_KEY)
    )
    agent = Agent(model, name="bench", capabilities=[TemporalDurability()])

    @agent.tool_plain
    def blob(i: int) -> str:
        """Returns 5 KB of text."""
        return common.blob_text(i)

    return agent


# Built on import, in the workflow sandbox's import of this module too.
AGENT = build_agent(os.environ.get(common.BASE_URL_VARIABLE, "http://127.0.0.1:9/v1"))


@workflow.defn
class PydanticAiTurn:
    @workflow.run
    async def run(self, k: int) -> str:
        result = await AGENT.run(
            common.prompt(k), usage_limits=UsageLimits(request_limit=k + 5, tool_calls_limit=k + 5)
        )
        return result.output


@contextlib.asynccontextmanager
async def runner(args: argparse.Namespace) -> AsyncIterator[common.TurnRunner]:
    client = await Client.connect(args.address, plugins=[PydanticAIPlugin()])
    async with Worker(
        client,
        task_queue=args.queue,
        workflows=[PydanticAiTurn],
        plugins=[AgentPlugin(AGENT)],
        max_concurrent_activities=10,
    ):

        async def run_turn(k: int) -> object:
            return await client.execute_workflow(
                PydanticAiTurn.run,
                k,
                id=f"pydantic-ai-{uuid.uuid4().hex[:12]}",
                task_queue=args.queue,
                execution_timeout=timedelta(minutes=30),
            )

        yield run_turn


if __name__ == "__main__":
    common.main("bench.peers.pydantic_ai_peer")
