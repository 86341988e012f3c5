"""What the benchmarks print: markdown tables (so the output can go into a README as is), and
the targets of issue #7 with whether this run met them."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field


def progress(text: str) -> None:
    """Progress goes to stderr; stdout is only the tables."""
    print(text, file=sys.stderr, flush=True)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        widths = [
            max(len(self.columns[i]), *(len(r[i]) for r in self.rows)) if self.rows else 0
            for i in range(len(self.columns))
        ]

        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

        out = [f"### {self.title}", "", line(self.columns)]
        out.append("| " + " | ".join("-" * w for w in widths) + " |")
        out += [line(r) for r in self.rows]
        if self.notes:
            out += ["", *self.notes]
        return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Target:
    what: str
    measured: str
    met: bool | None  # None: not measured in this run


def targets_table(targets: list[Target], title: str = "Targets (issue #7)") -> Table:
    table = Table(title, ["target", "measured", "met"])
    for t in targets:
        verdict = "not measured" if t.met is None else ("met" if t.met else "NOT MET")
        table.add(t.what, t.measured, verdict)
    return table


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}×" if floor else "n/a"


def median_interval(values: list[float]) -> tuple[float, float]:
    """A ~95% confidence interval of the median of ``values``, from their order statistics
    (distribution-free: a run's spread is skewed by the machine's hiccups, not normal). With
    7 values or fewer it is their whole range."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * math.sqrt(n) / 2
    low, high = math.floor(n / 2 - half), math.ceil(n / 2 + half) - 1
    return ordered[max(low, 0)], ordered[min(high, n - 1)]
