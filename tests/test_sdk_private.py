"""Every private name of an SDK that turnkeep uses is still where ``turnkeep.support.sdk_private``
reaches for it, and no other module of turnkeep names one.

Each use falls back to the SDK's stock behaviour when its name is gone, so an SDK upgrade that
moves one would cost speed or robustness without a word: the tests here fail instead, and the
upgrade becomes a decision (the design notes' "What is SDK-private, and why")."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from fastmcp import Client as FastMcpClient
from fastmcp import Context, FastMCP
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import CommandType
from temporalio.bridge.proto.activity_result import ActivityResolution, Success
from temporalio.bridge.proto.workflow_activation import (
    DoUpdate,
    ResolveActivity,
    WorkflowActivation,
    WorkflowActivationJob,
)
from temporalio.bridge.worker import decode_activation
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingWorkflowInboundInterceptor
from temporalio.converter import DataConverter
from temporalio.worker import Worker, WorkflowInstance, WorkflowInstanceDetails

from tests.conftest import make_settings
from tests.context_workflow import ContextWorkflow, echo
from turnkeep import build_worker
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.observability.tracing import _TurnWorkflowInbound
from turnkeep.support import sdk_private
from turnkeep.support.sdk_private import (
    IN_SANDBOX_GLOBAL,
    DecodeStage,
    DecodingStages,
    WorkflowTracingHooks,
    decoding_outside_commands,
    mcp_cancel_requested,
    mcp_connection,
    server_info_stamp,
    workflow_evictor,
)
from turnkeep.worker.runner import WORKFLOW_RUNNER, TurnkeepWorkflowRunner

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "turnkeep"
SDK_PRIVATE = PACKAGE / "support" / "sdk_private.py"


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


# -- temporalio: the workflow sandbox's instance ----------------------------------------------


def test_the_sandbox_instance_class_is_built_as_the_runner_builds_it() -> None:
    from temporalio.worker.workflow_sandbox._runner import _Instance

    assert issubclass(_Instance, WorkflowInstance)
    assert parameters(_Instance) == ["instance_details", "runner_class", "restrictions"]
    for question in ("get_serialization_context", "get_external_store_context"):
        assert parameters(getattr(_Instance, question)) == ["self", "command_info"]
    # Else the runner makes stock instances (slower, same answers).
    assert sdk_private.CONTEXTS_WITHOUT_EXEC
    assert WORKFLOW_RUNNER.fast_contexts


_instances: list[WorkflowInstance] = []


class _KeepingRunner(TurnkeepWorkflowRunner):
    """turnkeep's runner, keeping the instances it makes."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = super().create_instance(det)
        _instances.append(instance)
        return instance


async def test_the_sandboxed_instance_is_where_the_runner_asks_it(temporal: ServerInfo) -> None:
    from temporalio.worker.workflow_sandbox._runner import _Instance

    client = await Client.connect(temporal.address, namespace=temporal.namespace)
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    _instances.clear()
    runner = _KeepingRunner(restrictions=WORKFLOW_RUNNER.restrictions)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ContextWorkflow],
        activities=[echo],
        workflow_runner=runner,
    ):
        await client.execute_workflow(
            ContextWorkflow.run, "hi", id=f"ctx-{queue}", task_queue=queue
        )
    # The worker's validation of the workflow at its start, then the run.
    assert [i.get_info().workflow_id for i in _instances][-1] == f"ctx-{queue}"
    for instance in _instances:
        assert isinstance(instance, _Instance)
        # Where the stock instance keeps the sandboxed one (else every answer takes exec).
        inner = instance.globals_and_locals.get(IN_SANDBOX_GLOBAL)
        assert type(inner).__module__ == "temporalio.worker.workflow_sandbox._in_sandbox"
    # The direct answer is the stock (exec) one.
    direct = instance.get_serialization_context(None)
    assert direct is not None and direct == _Instance.get_serialization_context(instance, None)
    store = instance.get_external_store_context(None)
    assert store == _Instance.get_external_store_context(instance, None)


# -- temporalio: which command a payload belongs to; the data converter's decoding stages ----

_STAGES = (
    "_decode_reference_payload_sequence",
    "_external_retrieve_payload_sequence",
    "_decode_payload_sequence",
)


def test_the_data_converter_decodes_in_the_stages_turnkeep_overrides() -> None:
    for stage in _STAGES:
        method = getattr(DataConverter, stage)
        assert inspect.iscoroutinefunction(method), stage
        assert parameters(method) == ["self", "payloads"], stage
        assert stage in vars(DecodingStages), stage


def test_the_sdk_names_the_command_a_payload_is_decoded_for() -> None:
    # Without this private context variable of temporalio's (another SDK version), every
    # undecodable payload fails the workflow task again, retried for ever: upgrade with care.
    from temporalio.worker import _command_aware_visitor

    variable = _command_aware_visitor.current_command_info
    assert isinstance(variable, ContextVar)
    assert sdk_private.TELLS_COMMAND_PAYLOADS
    assert decoding_outside_commands()
    with _command_aware_visitor.current_command(CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK, 1):
        assert variable.get() is not None
        assert not decoding_outside_commands()
    assert decoding_outside_commands()


Seen = list[tuple[str, bytes, bool]]


class _Recording(DecodingStages):
    """Records each stage it runs: the stage, each payload, whether it came from a client."""

    seen: Seen  # not a field of the (frozen) dataclass

    def __init__(self, seen: Seen) -> None:
        super().__init__()
        object.__setattr__(self, "seen", seen)

    async def decode_stage(self, stage: DecodeStage, payloads: Sequence[Payload]) -> list[Payload]:
        outside = decoding_outside_commands()
        self.seen.extend((stage.__name__, p.data, outside) for p in payloads)
        return await stage(payloads)


def _payload(data: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


async def test_a_worker_decodes_an_activation_through_the_stages_and_says_whose_payload() -> None:
    activation = WorkflowActivation(
        run_id="run",
        jobs=[
            WorkflowActivationJob(do_update=DoUpdate(id="u", name="u", input=[_payload(b"1")])),
            WorkflowActivationJob(
                resolve_activity=ResolveActivity(
                    seq=7, result=ActivityResolution(completed=Success(result=_payload(b"2")))
                )
            ),
        ],
    )
    seen: Seen = []
    await decode_activation(
        activation, _Recording(seen), decode_headers=False, storage_concurrency_limit=1
    )
    stages = ["_decode_reference_payload_sequence", "_external_retrieve_payload_sequence"]
    expected = [(s, d, d == b"1") for s in [*stages, "codec_decode"] for d in (b"1", b"2")]
    assert seen == expected


async def test_a_client_decodes_through_the_same_stages() -> None:
    seen: Seen = []
    assert await _Recording(seen).decode([_payload(b"3")]) == [3]
    assert [stage for stage, _, _ in seen] == [
        "_decode_reference_payload_sequence",
        "_external_retrieve_payload_sequence",
        "codec_decode",
    ]


# -- temporalio: a worker's cache eviction -----------------------------------------------------


async def test_this_sdk_lets_a_worker_release_a_run_from_its_cache(
    client: Client, tmp_path: Path
) -> None:
    """``CacheRelease`` reaches the worker's Core bridge through a private name of the SDK;
    on another SDK version without it, waiting turns would stay cached."""
    worker = build_worker(client, make_settings(tmp_path), task_queue="never-polled")
    bridge = worker._bridge_worker
    assert parameters(bridge.request_workflow_eviction) == ["run_id"]
    evict = workflow_evictor(worker)
    assert evict is not None and evict == bridge.request_workflow_eviction


# -- temporalio: the OpenTelemetry workflow interceptor ----------------------------------------


def test_the_tracing_interceptor_has_the_methods_turnkeep_overrides_and_calls() -> None:
    sdk = TracingWorkflowInboundInterceptor
    assert parameters(sdk._load_workflow_context_carrier) == ["self"]
    assert parameters(sdk._context_to_headers) == ["self", "headers"]
    assert parameters(sdk._context_carrier_to_headers) == ["self", "carrier", "headers"]
    # The hooks come first, so theirs are the methods the SDK calls.
    mro = _TurnWorkflowInbound.__mro__
    assert mro.index(WorkflowTracingHooks) < mro.index(sdk)
    for name in ("_load_workflow_context_carrier", "_context_to_headers"):
        assert getattr(_TurnWorkflowInbound, name) is vars(WorkflowTracingHooks)[name]


# -- fastmcp: a server's identity stamp ---------------------------------------------------------


def test_fastmcp_lets_a_server_s_identity_stamp_be_read() -> None:
    server = FastMCP("stamped")
    stamp = server._mcp_server.server_info_stamp
    assert isinstance(stamp, dict) and stamp["name"] == "stamped"
    assert server_info_stamp(server) == stamp


async def test_mcp_lets_a_tool_read_its_cancellation_and_its_connection() -> None:
    server = FastMCP("cancellable")

    @server.tool
    def look(ctx: Context) -> str:
        cancel = mcp_cancel_requested(ctx.session)
        connection = mcp_connection(ctx.session)
        assert cancel is not None and not cancel.is_set()
        assert connection is not None and isinstance(connection.state, dict)
        return connection.protocol_version  # type: ignore[no-any-return]

    async with FastMcpClient(server) as mcp:
        result = await mcp.call_tool("look", {})
    assert result.data


# -- what happens without them ------------------------------------------------------------------


def test_without_the_names_each_use_falls_back() -> None:
    nothing = cast(Any, object())
    assert workflow_evictor(nothing) is None
    assert server_info_stamp(nothing) is None
    assert mcp_cancel_requested(nothing) is None and mcp_connection(nothing) is None

    class Bare(WorkflowTracingHooks):
        def workflow_carrier(self, from_headers: dict[str, Any] | None) -> dict[str, Any]:
            assert from_headers is None
            return {"own": "context"}

    assert Bare().loaded_carrier() == {"own": "context"}


# -- no other module names one ------------------------------------------------------------------

# Underscored names that are public API (namedtuple's methods, os._exit).
PUBLIC_UNDERSCORED = {"_asdict", "_exit", "_fields", "_make", "_replace"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once however many checks walk it."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _own_names(paths: Sequence[Path]) -> set[str]:
    """Every name turnkeep defines (functions, classes, attributes, variables)."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return names


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in sys.stdlib_module_names and top not in ("turnkeep", "builtins", "tests")


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _itself(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: what a class reaches for on itself (checked with the
    class's bases, ``_subclassed_privately``)."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "super"
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _named_privately(tree: ast.AST, own: set[str]) -> Iterator[str]:
    """Private names of other packages that ``tree`` names, but for a class's own."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if _third_party(node.module) and any(_private(p) for p in node.module.split(".")):
                yield node.module
            if _third_party(node.module):
                yield from (a.name for a in node.names if _private(a.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _third_party(alias.name) and any(_private(p) for p in alias.name.split(".")):
                    yield alias.name
        elif isinstance(node, ast.Attribute) and _private(node.attr) and not _itself(node.value):
            if node.attr not in own and node.attr not in PUBLIC_UNDERSCORED:
                yield node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1:
                name = _text(node.args[1])
                if name is not None and _private(name) and name not in own:
                    yield name
        elif (text := _text(node)) is not None and text.startswith("__temporal"):
            yield text  # the sandbox's exec globals


def _sdk_privates(cls: type) -> set[str]:
    """The private names a third-party class and its bases define, methods and attributes."""
    names: set[str] = set()
    for base in cls.__mro__:
        if _third_party(base.__module__):
            names |= _defined_privately(base)
    return names


# Many of turnkeep's classes share bases (pydantic's BaseModel above all), and finding a class's
# source parses its whole module: each base is read once.
@functools.cache
def _defined_privately(base: type) -> frozenset[str]:
    """The private names one third-party class itself defines, methods and attributes."""
    names = {name for name in vars(base) if _private(name)}
    try:
        source = inspect.getsource(base)
    except (OSError, TypeError):
        return frozenset(names)
    names |= set(re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=\n]*)?=[^=]", source))
    return frozenset(names)


def _class_names(node: ast.ClassDef) -> set[str]:
    """The private names a class's body defines or reaches for."""
    names = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and _private(inner.name):
            names.add(inner.name)
        elif isinstance(inner, ast.Attribute) and _private(inner.attr):
            names.add(inner.attr)
        elif (text := _text(inner)) is not None and _private(text):
            names.add(text)
    return names


def _subclassed_privately(tree: ast.Module, module: ModuleType | None) -> Iterator[str]:
    """Private names of a third-party base class that a subclass in ``module`` overrides,
    calls or reads."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            cls = getattr(module, node.name, None) if module is not None else None
            if isinstance(cls, type):
                found = _class_names(node) & _sdk_privates(cls)
                yield from (f"{node.name}.{name}" for name in sorted(found))


def private_uses(path: Path, module: ModuleType | None, own: set[str]) -> list[str]:
    tree = _parsed(path)
    return sorted({*_named_privately(tree, own), *_subclassed_privately(tree, module)})


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> ModuleType | None:
    """The module at ``path``, imported; None for a ``__main__`` (importing it runs it)."""
    return None if path.stem == "__main__" else importlib.import_module(_module_name(path))


def test_no_other_module_names_a_private_name_of_an_sdk() -> None:
    paths = sorted(p for p in PACKAGE.rglob("*.py") if p != SDK_PRIVATE)
    own = _own_names(paths)
    found = {
        str(path.relative_to(ROOT)): uses
        for path in paths
        if (uses := private_uses(path, _imported(path), own))
    }
    assert found == {}


def test_the_check_finds_each_way_of_naming_one(tmp_path: Path) -> None:
    """What turnkeep's modules did before ``sdk_private`` held them all, each caught."""
    path = tmp_path / "private_names.py"
    path.write_text(
        "from temporalio.contrib.opentelemetry import TracingWorkflowInboundInterceptor\n"
        "from temporalio.converter import DataConverter\n"
        "from temporalio.worker._command_aware_visitor import current_command_info\n"
        "import temporalio.worker.workflow_sandbox._runner\n"
        "IN_SANDBOX = '__temporal_in_sandbox'\n"
        "def evictor(worker):\n"
        "    return getattr(worker, '_bridge_worker', None)\n"
        "def stamp(server):\n"
        "    return server._mcp_server.server_info_stamp\n"
        "class Converter(DataConverter):\n"
        "    async def _decode_payload_sequence(self, payloads):\n"
        "        return await super()._decode_payload_sequence(payloads)\n"
        "class Inbound(TracingWorkflowInboundInterceptor):\n"
        "    def carrier(self):\n"
        "        return self._workflow_context_carrier or self._load_workflow_context_carrier()\n"
        "    def stamp(self, v):\n"
        "        return v._replace(a=1)\n",
        encoding="utf-8",
    )
    spec = importlib.util.spec_from_file_location("private_names", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    own = _own_names(sorted(p for p in PACKAGE.rglob("*.py") if p != SDK_PRIVATE))
    assert private_uses(path, module, own) == [
        "Converter._decode_payload_sequence",
        "Inbound._load_workflow_context_carrier",
        "Inbound._workflow_context_carrier",
        "__temporal_in_sandbox",
        "_bridge_worker",
        "_mcp_server",
        "temporalio.worker._command_aware_visitor",
        "temporalio.worker.workflow_sandbox._runner",
    ]
