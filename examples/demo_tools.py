"""Offline tools for turnkeep's demo agent, as an MCP server over stdio.

Run it as ``python examples/demo_tools.py``; nothing here touches the network or the disk.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fastmcp import FastMCP

mcp = FastMCP(
    "demo-tools",
    instructions="Arithmetic, unit conversion, text statistics and the current time.",
)

# --- calculate -------------------------------------------------------------------------------

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "log": math.log,
    "log10": math.log10,
    "exp": math.exp,
    "floor": math.floor,
    "ceil": math.ceil,
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
# Keeps `9**9**9` from pinning a CPU: no exponent or result this large is a real question.
_MAX_EXPONENT = 10_000
_MAX_MAGNITUDE = 10**100


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and abs(result) > _MAX_MAGNITUDE:
            raise ValueError("result is too large")
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_evaluate(arg) for arg in node.args))
    raise ValueError(f"unsupported expression: {ast.unparse(node)!r}")


@mcp.tool
def calculate(expression: str) -> float | int:
    """Evaluate an arithmetic expression exactly as written, e.g. "(3 + 4) * 2 ** 10 / 7".

    Supports + - * / // % **, parentheses, the constants pi, e and tau, and the functions
    sqrt, abs, round, min, max, sin, cos, tan, log, log10, exp, floor and ceil."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from err
    try:
        return _evaluate(tree)
    except ZeroDivisionError as err:
        raise ValueError("division by zero") from err


# --- convert_units ---------------------------------------------------------------------------

# Factor to the base unit of each dimension (metre, kilogram).
_LENGTH = {
    "mm": 0.001,
    "cm": 0.01,
    "m": 1.0,
    "km": 1000.0,
    "in": 0.0254,
    "ft": 0.3048,
    "yd": 0.9144,
    "mi": 1609.344,
    "nmi": 1852.0,
}
_MASS = {
    "mg": 1e-6,
    "g": 0.001,
    "kg": 1.0,
    "t": 1000.0,
    "oz": 0.028349523125,
    "lb": 0.45359237,
    "st": 6.35029318,
}
_ALIASES = {
    "millimeter": "mm",
    "centimeter": "cm",
    "meter": "m",
    "metre": "m",
    "kilometer": "km",
    "inch": "in",
    "foot": "ft",
    "feet": "ft",
    "yard": "yd",
    "mile": "mi",
    "milligram": "mg",
    "gram": "g",
    "kilogram": "kg",
    "tonne": "t",
    "ounce": "oz",
    "pound": "lb",
    "lbs": "lb",
    "stone": "st",
    "celsius": "c",
    "°c": "c",
    "fahrenheit": "f",
    "°f": "f",
    "kelvin": "k",
}
_TEMPERATURE = ("c", "f", "k")


def _unit(name: str) -> str:
    unit = name.strip().lower()
    # Plurals: "miles", "inches", "metres".
    for candidate in (unit, unit.removesuffix("s"), unit.removesuffix("es")):
        if candidate in _ALIASES:
            return _ALIASES[candidate]
    return unit


def _to_kelvin(value: float, unit: str) -> float:
    return {"c": value + 273.15, "f": (value - 32) * 5 / 9 + 273.15, "k": value}[unit]


def _from_kelvin(value: float, unit: str) -> float:
    return {"c": value - 273.15, "f": (value - 273.15) * 9 / 5 + 32, "k": value}[unit]


@mcp.tool
def convert_units(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a length, mass or temperature between units.

    Length: mm, cm, m, km, in, ft, yd, mi, nmi. Mass: mg, g, kg, t, oz, lb, st.
    Temperature: C, F, K. Full names (e.g. "miles", "pounds", "celsius") work too."""
    src, dst = _unit(from_unit), _unit(to_unit)
    if src in _TEMPERATURE and dst in _TEMPERATURE:
        return round(_from_kelvin(_to_kelvin(value, src), dst), 10)
    for table in (_LENGTH, _MASS):
        if src in table and dst in table:
            return round(value * table[src] / table[dst], 10)
    known = ", ".join([*_LENGTH, *_MASS, "C", "F", "K"])
    raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}; known units: {known}")


# --- word_stats ------------------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
_SENTENCE_END = re.compile(r"[.!?…]+(?=\s|$)")


@mcp.tool
def word_stats(text: str, top: int = 5) -> dict[str, Any]:
    """Count the words, characters and sentences of a text and list its most frequent words
    (case-insensitive, `top` of them)."""
    words = _WORD.findall(text)
    # A trailing sentence without its full stop still counts.
    sentences = sum(1 for part in _SENTENCE_END.split(text) if _WORD.search(part))
    counts = Counter(word.lower() for word in words)
    return {
        "words": len(words),
        "unique_words": len(counts),
        "characters": len(text),
        "characters_without_spaces": sum(1 for ch in text if not ch.isspace()),
        "sentences": sentences,
        "top_words": [{"word": w, "count": n} for w, n in counts.most_common(max(top, 0))],
    }


# --- now -------------------------------------------------------------------------------------


@mcp.tool
def now(timezone: str = "UTC") -> dict[str, str]:
    """The current date and time in an IANA time zone such as "Europe/Paris" (default UTC)."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"unknown time zone {timezone!r}; use an IANA name") from err
    moment = datetime.now(zone)
    return {
        "timezone": timezone,
        "iso": moment.isoformat(timespec="seconds"),
        "date": moment.strftime("%Y-%m-%d"),
        "time": moment.strftime("%H:%M:%S"),
        "weekday": moment.strftime("%A"),
        "utc_offset": moment.strftime("%z"),
    }


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
