"""The floor the loop is measured against: a bare workflow awaiting N no-op activities one
after another. In its own module because the workflow sandbox re-imports the module that
defines a workflow, and this one must import nothing but temporalio."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="noop")
async def noop() -> None:
    return None


@workflow.defn(name="Floor")
class Floor:
    @workflow.run
    async def run(self, activities: int) -> None:
        for _ in range(activities):
            await workflow.execute_activity("noop", start_to_close_timeout=timedelta(seconds=30))
