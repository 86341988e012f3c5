"""A workflow whose every run comes to rest at the same history length, for
``tests.test_query_retry``: it waits for ``go``, then continues as new with its number + 1. It
imports only temporalio, so the sandbox loads it quickly."""

from __future__ import annotations

from temporalio import workflow


@workflow.defn
class RerunWorkflow:
    def __init__(self) -> None:
        self._go = False
        self._number = 0

    @workflow.run
    async def run(self, number: int) -> None:
        self._number = number
        await workflow.wait_condition(lambda: self._go)
        workflow.continue_as_new(number + 1)

    @workflow.signal
    def go(self) -> None:
        self._go = True

    @workflow.query
    def number(self) -> int:
        return self._number
