"""A small workflow for ``tests.test_workflow_runner``: it imports nothing but temporalio,
so the sandbox loads it quickly, and it schedules what carries serialization contexts (two
activities and a local activity, with arguments and results)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def echo(text: str) -> str:
    return text


@workflow.defn
class ContextWorkflow:
    @workflow.run
    async def run(self, text: str) -> list[str]:
        out = []
        for i in range(2):
            out.append(
                await workflow.execute_activity(
                    echo, f"{text} {i}", start_to_close_timeout=timedelta(seconds=30)
                )
            )
        out.append(
            await workflow.execute_local_activity(
                echo, f"{text} local", start_to_close_timeout=timedelta(seconds=30)
            )
        )
        return out
