"""The app's workflow: a research turn, one of the app's own activities on its answer, then a
summary turn. Each turn is a child workflow (``turnkeep.in_workflow.run_turn``), so the Web UI
shows it under this workflow, with every model and tool call of its own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow

from turnkeep import TurnInput
from turnkeep.in_workflow import run_turn

with workflow.unsafe.imports_passed_through():
    from activities import save_note


@dataclass
class ResearchRequest:
    question: str


@dataclass
class ResearchReport:
    findings: str
    note: str
    summary: str


@workflow.defn
class ResearchWorkflow:
    @workflow.run
    async def run(self, request: ResearchRequest) -> ResearchReport:
        research = await run_turn(TurnInput(agent="researcher", messages=[request.question]))
        findings = research.final.text if research.final else ""
        note = await workflow.execute_activity(
            save_note, findings, start_to_close_timeout=timedelta(seconds=30)
        )
        summary = await run_turn(
            TurnInput(agent="summarizer", messages=[f"Summarise in one sentence:\n{findings}"])
        )
        return ResearchReport(
            findings=findings, note=note, summary=summary.final.text if summary.final else ""
        )
