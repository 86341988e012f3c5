"""OpenAI Agents SDK + Temporal on the peers' workload: ``temporalio.contrib.openai_agents``'s
plugin (its model calls as activities), an agent whose tool ``blob`` is an activity
(``activity_as_tool``), run by a workflow on a worker in this process, its model the fake server
through the SDK's Chat Completions model.

Run in its own venv (``bench.peers_bench`` makes it): ``python -m bench.peers.openai_agents_peer
--address ... --base-url ... --iterations 20,100``.
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

from agents import Agent, OpenAIProvider, Runner, set_tracing_disabled
from openai import AsyncOpenAI
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.contrib.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.contrib.openai_agents.workflow import activity_as_tool
from temporalio.worker import Worker

from bench.peers import common


@activity.defn
async def blob(i: int) -> str:
    """Returns 5 KB of text."""
    return common.blob_text(i)


@workflow.defn
class OpenAiAgentsTurn:
    @workflow.run
    async def run(self, k: int) -> str:
        agent = Agent(
            name="bench",
            instructions="",
            model="bench",
            tools=[activity_as_tool(blob, start_to_close_timeout=timedelta(seconds=60))],
        )
        result = await Runner.run(agent, common.prompt(k), max_turns=k + 5)
        return str(result.final_output)


@contextlib.asynccontextmanager
async def runner(args: argparse.Namespace) -> AsyncIterator[common.TurnRunner]:
    set_tracing_disabled(True)
    provider = OpenAIProvider(
        openai_client=AsyncOpenAI(base_url=args.base_url, api_key=common.API_KEY),
        use_responses=False,
    )
    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=60)),
        model_provider=provider,
    )
    client = await Client.connect(args.address, plugins=[plugin])
    async with Worker(
        client, task_queue=args.queue, workflows=[OpenAiAgentsTurn], activities=[blob]
    ):

        async def run_turn(k: int) -> object:
            return await client.execute_workflow(
                OpenAiAgentsTurn.run,
                k,
                id=f"openai-agents-{uuid.uuid4().hex[:12]}",
                task_queue=args.queue,
                execution_timeout=timedelta(minutes=30),
            )

        yield run_turn


if __name__ == "__main__":
    common.main("bench.peers.openai_agents_peer")
