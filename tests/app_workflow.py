"""An application's own workflow and activity, for ``tests.test_plugin``: they run on the same
worker and task queue as turnkeep's turns. Imports nothing but temporalio, like a small app's
workflow module, so the sandbox loads it quickly."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def app_activity(name: str) -> str:
    return f"hello, {name}"


@workflow.defn
class AppWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            app_activity, name, start_to_close_timeout=timedelta(seconds=30)
        )
