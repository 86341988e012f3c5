"""The worker's configuration schema (``turnkeep.yaml``).

It accepts fast-agent's keys (``default_model``, ``mcp.servers``, ``anthropic``, ``openai``,
``generic``) and adds ``agents`` and ``function_tools``. Everything a turn may touch — processes,
URLs, files, credentials — is named here and only here; turn input can only pick an agent.
Loading the YAML (``${VAR}`` expansion, secrets file) is ``turnkeep.config.files``'s job.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    model_validator,
)

from turnkeep.contract.activity_io import (
    CLIENT_TOOL_PREFIX,
    DEFAULT_CONTINUE_AS_NEW_BYTES,
    DEFAULT_CONTINUE_AS_NEW_EVENTS,
    HookPoint,
    TeamKind,
)
from turnkeep.contract.session_io import NewMessageMode
from turnkeep.contract.turn_io import (
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_TASK_QUEUE,
    TaskPriority,
    TenantName,
    TurnOverrides,
)
from turnkeep.fastagent.config_keys import accept_fast_agent_keys


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class McpElicitationSettings(_Settings):
    """``mcp.servers.<name>.elicitation``: what the server's ``elicitation/create`` requests
    during a tool call get (fast-agent's key)."""

    # forms: the turn waits for a person's answer (a durable wait, like an approval);
    # auto-cancel: cancelled at once; none: the capability is not advertised, and a request
    # that comes anyway is declined. Each refusal is recorded in the turn's decisions.
    mode: Literal["forms", "auto-cancel", "none"] = "forms"
    # Seconds a request waits for a person; unset: the agent's approval timeout, or a day.
    # Nobody answering in time is MCP's cancel.
    timeout: float | None = Field(default=None, gt=0)


class McpSamplingSettings(_Settings):
    """``mcp.servers.<name>.sampling``: the server's ``sampling/createMessage`` requests during
    a tool call run as a model call of the turn (fast-agent's key; turnkeep answers them only
    for a server with this block)."""

    enabled: bool = True
    # The model that answers (fast-agent's key); unset: the agent's. Either way one the agent
    # may use (its `model` or `models`).
    model: str | None = Field(default=None, min_length=1)
    # Whether each request waits for a person's approval before the model is called.
    approval: bool = False


class McpServerSettings(_Settings):
    """One entry of fast-agent's ``mcp.servers``."""

    # stdio, http or sse (inferred when omitted), or another registered tool-source kind
    # (``turnkeep.tools.source``), which the worker checks when it starts.
    transport: str | None = Field(default=None, min_length=1)
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: Path | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    description: str | None = None
    # Seconds to wait for the server to start and answer `initialize`.
    init_timeout: float = 30.0
    # fast-agent's read timeout: seconds a tool call may wait for its answer before it fails
    # (an error result the model sees). Unset: only the agent's tool_timeouts bound it.
    read_timeout_seconds: float | None = Field(default=None, gt=0)
    # Its tools are listed and called by the workers polling this task queue (a host with a
    # GPU, a private network, a desktop), whatever the agent's `task_queue` says.
    task_queue: str | None = Field(default=None, min_length=1)
    # What the server may ask during a tool call: a person (elicitation), the agent's model
    # (sampling). Unset: neither (the capability is not advertised; a request is declined).
    elicitation: McpElicitationSettings | None = None
    sampling: McpSamplingSettings | None = None
    # fast-agent's key: the MCP protocol era the client speaks. auto: the newest both sides
    # speak, and for a server that may ask (elicitation, sampling) the initialize handshake
    # for its tools that ask with requests of their own (`ctx.elicit`); modern: 2026-07-28
    # only; legacy: the initialize handshake (2025-11-25 and older) only.
    protocol_mode: Literal["auto", "modern", "legacy"] = "auto"

    @model_validator(mode="after")
    def _infer_transport(self) -> McpServerSettings:
        if self.transport is None:
            self.transport = "stdio" if self.command else "http"
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP server needs `command`")
        if self.transport in ("http", "sse") and not self.url:
            raise ValueError(f"an {self.transport} MCP server needs `url`")
        return self


class McpSettings(_Settings):
    servers: dict[str, McpServerSettings] = Field(default_factory=dict)


class ProviderSettings(_Settings):
    """fast-agent's provider blocks (``openai:``, ``generic:``, ``deepseek:``, ``openrouter:``,
    ``groq:``, ``xai:``, ``google:``; ``anthropic:`` and ``azure:`` add their own keys)."""

    # The API key (unset: fast-agent's variable for the provider from the environment,
    # `<PROVIDER>_API_KEY`: ANTHROPIC_API_KEY, DEEPSEEK_API_KEY...). Give it as `${VAR}` or in
    # turnkeep.secrets.yaml.
    api_key: SecretStr | None = None
    # The API's base URL (unset: the provider's own; required for `generic`).
    base_url: str | None = None
    default_headers: dict[str, str] | None = None
    # Tokens, for compaction: the window of this provider's models, over turnkeep's own table.
    # A model turnkeep has no window for (any generic.*, openrouter.* or azure.* one) is not
    # compacted automatically until this, or the agent's compaction.context_window, is set.
    context_window: int | None = Field(default=None, gt=0)
    # Stream this provider's calls when the worker serves live text (`streaming:`); false:
    # every call is made whole, for a server or proxy that does not stream as asked.
    streaming: bool = True


class AnthropicSettings(ProviderSettings):
    """``anthropic:``, with fast-agent's extended thinking keys (until its 0.4.49): thinking
    on for every Claude model that has it, with this budget. A model string's
    ``?reasoning=`` wins over both."""

    # Extended thinking for the Claude models that have it, unless a model string says.
    thinking_enabled: bool = False
    # Its budget in tokens (at least 1,024 is sent; max_tokens is raised past it).
    thinking_budget_tokens: int = Field(default=10_000, gt=0)


class AzureSettings(ProviderSettings):
    """``azure:`` as fast-agent has it: the resource (or a ``base_url``), the deployment
    (``azure.<deployment>`` names one per model string), and the API version."""

    # Calls go to https://<resource_name>.openai.azure.com (or `base_url`).
    resource_name: str | None = None
    # The deployment the model string `azure` alone means.
    azure_deployment: str | None = None
    # Default: 2024-10-21, as fast-agent's.
    api_version: str | None = None


class TimeoutSettings(_Settings):
    start_to_close: float = 600.0
    # Activities beat every third of this, so a dead worker's call is retried, and a
    # cancelled one stops, within about this many seconds rather than after start_to_close.
    heartbeat: float | None = 10.0
    max_attempts: int = 5


class CompactionSettings(_Settings):
    """Mid-turn compaction (docs/concepts/compaction.md): summarise older exchanges before a
    follow-up model call once the estimated context reaches ``threshold`` of the model's window."""

    enabled: bool = True
    threshold: float = Field(default=0.85, gt=0, le=1)
    keep_exchanges: int = Field(default=2, ge=0)
    # The model's context window in tokens; known models have a default
    # (``turnkeep.providers.registry``).
    context_window: int | None = Field(default=None, gt=0)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(value: Any) -> Any:
    """``1d``-style shorthands become seconds; anything else is left to pydantic."""
    if isinstance(value, str) and (match := _DURATION.fullmatch(value.strip().lower())):
        return float(match[1]) * _UNIT_SECONDS[match[2]]
    return value


def _duration_or_off(value: Any) -> Any:
    """``off``/``null`` (YAML reads a bare ``off`` as false) means never; ``7d``-style
    shorthands become seconds; anything else is left to pydantic's timedelta parsing."""
    if value is None or value is False or (isinstance(value, str) and value.lower() == "off"):
        return None
    return _duration(value)


def _positive(value: timedelta | None) -> timedelta | None:
    if value is not None and value <= timedelta(0):
        raise ValueError("must be positive (or off)")
    return value


# A positive duration, or off (None).
DurationOrOff = Annotated[
    timedelta | None, BeforeValidator(_duration_or_off), AfterValidator(_positive)
]


class PayloadStorageSettings(_Settings):
    """Where payloads above ``threshold_bytes`` go instead of the workflow history: Temporal's
    external payload storage (``turnkeep.payloads.storage``). Every client and worker of a
    task queue must use the same storage, or one cannot read what another wrote."""

    # local: files in `path` (client and workers on one machine, or a shared filesystem);
    # s3: `bucket` (needs `pip install "turnkeep[s3]"`); off: payloads stay inline and a
    # turn whose result passes Temporal's 2 MB limit fails with an error saying so.
    driver: Literal["local", "s3", "off"] = "local"
    # Default: <state dir>/payloads, the state dir being $TURNKEEP_STATE_DIR, else
    # $XDG_STATE_HOME/turnkeep, else ~/.local/state/turnkeep. Relative paths: from the file.
    path: Path | None = None
    # Payloads of at least this many bytes are stored externally. Below Temporal's 2 MB limit.
    threshold_bytes: int = Field(default=256 * 1024, ge=0, lt=2 * 1024 * 1024)
    bucket: str | None = None
    # Prepended to every object key. Changing it makes earlier references unreadable.
    prefix: str = ""
    # local: payload files nobody has stored or read for this long, and no running turn
    # references, are deleted by the workers' sweep and `turnkeep gc`. Keep it longer than your
    # longest turn plus the namespace's retention (the dev server keeps closed turns 1 day), so
    # a closed turn stays readable for as long as Temporal keeps it.
    # 7d, 12h, 90m, 3600 (seconds), P7D; off: never delete. S3 is never swept: give the bucket
    # a lifecycle rule instead (docs/concepts/large-payloads.md).
    retention: DurationOrOff = timedelta(days=7)

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> PayloadStorageSettings:
        if self.driver == "s3" and not self.bucket:
            raise ValueError("payload_storage.driver 's3' needs `bucket`")
        return self


class ContinueAsNewSettings(_Settings):
    """When a long turn's run hands over to a fresh run (Temporal continue-as-new), so no run's
    history nears Temporal's limits (50 MB, 51,200 events) and a worker that takes a turn over
    replays only its current run. Checked between steps; the new run carries the conversation
    in its input, so a threshold should stay well above the conversation's own size."""

    history_bytes: int | None = Field(default=DEFAULT_CONTINUE_AS_NEW_BYTES, gt=0)
    history_events: int | None = Field(default=DEFAULT_CONTINUE_AS_NEW_EVENTS, gt=0)
    # Also when the server suggests it (its `limit.history*.suggestContinueAsNew` settings).
    when_suggested: bool = True


class VisibilitySettings(_Settings):
    """What a turn publishes for operators (``turnkeep.workflows.visibility``)."""

    # Mid-turn, search attributes (iterations, tokens) are upserted at most this often, in
    # seconds of workflow time: each upsert is a history event and a write to the server's
    # visibility store. A turn's start (by `start_turn` with the start request, the model
    # excepted) and its end are always published, and the workflow's current details follow
    # every step whatever this says. 0: after every answer. A minute by default: the cost is
    # per running turn (a fleet of 1,000 turns at 10 s was 100 visibility writes a second),
    # while the turn's own page shows its progress live through the current details.
    search_attribute_interval: float = Field(default=60.0, ge=0)


class ApprovalSettings(_Settings):
    """Tool calls that wait for a person's decision (the ``decide`` update) before they run,
    or that an approval policy decides first (allow, deny, or ask a person)."""

    # fnmatch patterns on `server__tool`, e.g. `fs__write_*`, `shell__*`. With `policy`, the
    # calls put to the policy (empty: every call); without, the calls that wait for a person.
    tools: list[str] = Field(default_factory=list)
    # A registered approval policy's name (``turnkeep.activities.approval_policy``).
    policy: str | None = Field(default=None, min_length=1)
    # How long a call waits: seconds or `1d`, `2h`, `30m`...
    timeout: Annotated[float, BeforeValidator(_duration)] = Field(default=86400.0, gt=0)
    # Then it is denied (by "timeout"); the model gets an isError result and can adapt.
    on_timeout: Literal["deny"] = "deny"

    @model_validator(mode="after")
    def _tools_or_policy(self) -> ApprovalSettings:
        if not self.tools and self.policy is None:
            raise ValueError("approval needs `tools` (globs on server__tool), a `policy`, or both")
        return self


class BudgetSettings(_Settings):
    """What a turn (or a session) of the agent may spend, in tokens or US dollars, before its
    next model call waits for a person to raise the budget (``ask``) or the turn stops
    (``stop``). A budget never interrupts a model call halfway."""

    # Every token the model calls process (input, output, cache reads and writes)...
    tokens: int | None = Field(default=None, gt=0)
    # ...or their cost by the price table (`prices`): every model of the agent needs a price.
    usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # `turn`: each turn has the whole budget; `session`: a session's turns share it.
    per: Literal["turn", "session"] = "turn"
    # `ask`: wait for a decision (raise the budget, or stop); `stop`: end the turn at once.
    on_exceeded: Literal["ask", "stop"] = "ask"
    # The most a person may raise the budget to (same unit); unset: no ceiling.
    max_raise: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # How long a turn waits for the decision (seconds or `1d`, `2h`...); then it stops.
    timeout: Annotated[float, BeforeValidator(_duration)] = Field(default=86400.0, gt=0)

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetSettings:
        if (self.tokens is None) == (self.usd is None):
            raise ValueError("a budget is either `tokens` or `usd`, not both nor neither")
        amount = self.tokens if self.tokens is not None else self.usd
        if self.max_raise is not None and amount is not None and self.max_raise < amount:
            raise ValueError("budget.max_raise is below the budget itself")
        return self


class PriceSettings(_Settings):
    """One model's price in US dollars per million tokens (an entry of ``prices``)."""

    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)
    # Unset: as the input price.
    cache_read: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_write: float | None = Field(default=None, ge=0, allow_inf_nan=False)


# A client-side tool's name, as the model sees it after `client__`: what providers take in a
# tool name (letters, digits, `_`, `-`; at most 64 characters with the prefix).
_CLIENT_TOOL_NAME = r"^[A-Za-z0-9_-]{1,56}$"
# The server part of a client tool's name, which no server of the same agent may take.
CLIENT_SERVER = CLIENT_TOOL_PREFIX.removesuffix("__")


class ClientToolSettings(_Settings):
    """A tool a client answers (``client_tools:``): the worker never runs it; the model sees
    it as ``client__<name>`` and a call waits for a client to submit the result. The worker
    has no server to list it from, so its spec is written here."""

    name: str = Field(pattern=_CLIENT_TOOL_NAME)
    description: str | None = None
    # JSON schemas: the arguments the model passes, and (optional) the structured content a
    # submitted result must have.
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _object_schemas(self) -> ClientToolSettings:
        for key in ("input_schema", "output_schema"):
            schema = getattr(self, key)
            if schema is not None and schema.get("type", "object") != "object":
                raise ValueError(f"a client tool's {key} describes a JSON object (type: object)")
        return self


# -- payload encryption (turnkeep.payloads.codec, turnkeep.payloads.codec_server) -------------

AES_256_KEY_BYTES = 32
# Key ids travel in every encrypted payload's metadata (in clear): short, printable, no secrets.
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_MIN_TOKEN_CHARS = 16


def decode_key(key_id: str, value: SecretStr) -> bytes:
    """The 32 bytes of one ``encryption.keys`` entry (standard or URL-safe base64). Errors name
    the key's id, never the key."""
    text = value.get_secret_value().strip().replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            f"encryption.keys[{key_id!r}] is not base64; make a key with `openssl rand -base64 32`"
        ) from None
    if len(raw) != AES_256_KEY_BYTES:
        raise ValueError(
            f"encryption.keys[{key_id!r}] decodes to {len(raw)} bytes, but an AES-256 key is "
            f"{AES_256_KEY_BYTES} bytes; make one with `openssl rand -base64 32`"
        )
    return raw


def _origin(value: str) -> str:
    """``scheme://host[:port]`` as a browser sends it in ``Origin`` (lower case, no slash)."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise ValueError(
            f"{value!r} is not a web origin; write scheme://host:port, e.g. http://127.0.0.1:8233"
        )
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"{value!r} is not a web origin (no query, fragment or user)")
    return f"{parts.scheme}://{parts.netloc}".lower()


Origin = Annotated[str, AfterValidator(_origin)]

_HOST = re.compile(r"^(\*|\[[0-9a-f:.]+\]|[a-z0-9*._-]+)(:(\d{1,5}|\*))?$")


def _allowed_host(value: str) -> str:
    """A name a ``Host`` header may give: ``name`` (any port) or ``name:port``, ``*`` wildcards."""
    value = value.strip().lower()
    if not _HOST.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a host; write a name or name:port, e.g. gw.example.com:8080"
        )
    return value


def _allowed_origin(value: str) -> str:
    return "*" if value.strip() == "*" else _origin(value)


# What an HTTP door answers for besides loopback (``turnkeep.doors.hosts``).
AllowedHost = Annotated[str, AfterValidator(_allowed_host)]
AllowedOrigin = Annotated[str, AfterValidator(_allowed_origin)]


class _SecretSettings(_Settings):
    # A validation error normally quotes the offending input: here that could be a key or token.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class CodecServerSettings(_SecretSettings):
    """``turnkeep codec-server``: Temporal's remote codec protocol over HTTP, so the Web UI (and
    ``temporal workflow show --codec-endpoint``) can show decrypted payloads."""

    host: str = "127.0.0.1"
    port: int = Field(default=8234, ge=0, le=65535)  # 0: any free port
    # Every request must present it: `Authorization: Bearer <token>`, or the cookie the server's
    # /login page sets for a browser. Required to start the server.
    token: SecretStr | None = None
    # Web UI origins (scheme://host:port) whose pages may call the server. When turnkeep starts
    # the embedded Web UI together with the codec server, the UI's own origin is added.
    origins: list[Origin] = Field(default_factory=list)
    # How long a browser's /login sign-in lasts (`12h`, `90m`, seconds...); /logout ends it sooner.
    session_lifetime: Annotated[
        timedelta, BeforeValidator(_duration_or_off), AfterValidator(_positive)
    ] = timedelta(hours=12)

    @model_validator(mode="after")
    def _long_enough_token(self) -> CodecServerSettings:
        if self.token is not None and len(self.token.get_secret_value()) < _MIN_TOKEN_CHARS:
            raise ValueError(
                f"encryption.codec_server.token must be at least {_MIN_TOKEN_CHARS} characters; "
                "make one with `openssl rand -base64 32`"
            )
        return self


class EncryptionSettings(_SecretSettings):
    """Every payload AES-256-GCM encrypted before it leaves the process
    (``turnkeep.payloads.codec``): histories, query results and stored large payloads hold
    ciphertext. Each payload names its key's id, so keys rotate: new payloads use
    ``current_key``, and any key still listed in ``keys`` decrypts. Remove a key only once no
    kept history or stored payload uses it."""

    current_key: str
    # key id -> base64 of 32 random bytes; give them as ${VAR} or in turnkeep.secrets.yaml.
    keys: dict[str, SecretStr]
    # zlib before encryption, kept only when it makes the payload smaller.
    compress: bool = True
    # Accept unencrypted payloads (from clients without the keys, or written before encryption
    # was on). Off by default: a plain client's prompt would stay in clear in the history.
    allow_plaintext: bool = False
    codec_server: CodecServerSettings = Field(default_factory=CodecServerSettings)

    @model_validator(mode="after")
    def _usable_keys(self) -> EncryptionSettings:
        for key_id, value in self.keys.items():
            if not _KEY_ID.fullmatch(key_id):
                raise ValueError(
                    f"encryption key id {key_id!r} must be 1-64 letters, digits, '.', '_', ':' "
                    "or '-' (it is stored, unencrypted, in every payload)"
                )
            decode_key(key_id, value)
        if self.current_key not in self.keys:
            raise ValueError(
                f"encryption.current_key {self.current_key!r} is not in encryption.keys "
                f"(ids: {sorted(self.keys)})"
            )
        return self

    def key_bytes(self) -> dict[str, bytes]:
        return {key_id: decode_key(key_id, value) for key_id, value in self.keys.items()}


ALL_OVERRIDES = frozenset(TurnOverrides.model_fields) - {"model"}
# What only a replay may set (``turnkeep.replay_turn``), where the agent lists it: a turn
# always takes the agent's instruction.
REPLAY_OVERRIDES = frozenset({"instruction"})
# What a turn may set whatever its agent lists: none of it lets a turn reach a model, server,
# tool or hook the agent does not, or spend more (fast-agent sets them per call, `structured()`
# and `RequestParams`).
FREE_OVERRIDES = frozenset({"use_history", "structured_output", "temperature"})
# Bounds the agent sets: a turn may always stay within them (lower a limit, turn parallel tool
# calls off), and go past them only for those the agent lists in `overrides`.
BOUNDED_OVERRIDES = frozenset({"max_iterations", "max_tokens", "parallel_tool_calls"})


class AgentOptions(_Settings):
    """What a YAML ``agents:`` entry (``AgentSettings``) and a Python ``turnkeep.Agent`` share:
    all but how they name tools and hooks."""

    # Falls back to default_model. A list is a fallback chain: `[primary, fallback, ...]`.
    model: str | None = None
    # The models that answer, in order, when a call of `model` fails for good (a final
    # provider error, or rate limits past `fallback_after_attempts`); a turn may use them too.
    fallback_models: list[str] = Field(default_factory=list)
    # Attempts a model of the chain gets before the next one answers (the last one gets all of
    # `llm_timeouts.max_attempts`).
    fallback_after_attempts: int = Field(default=2, ge=1)
    # What a turn (or a session) may spend before it asks or stops; none when absent.
    budget: BudgetSettings | None = None
    instruction: str | None = None
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    use_history: bool = True
    parallel_tool_calls: bool = True
    temperature: float | None = None
    max_tokens: int | None = None
    # Which of the agent's bounds a turn may go past: max_iterations and max_tokens (raised),
    # parallel_tool_calls (turned on when the agent has it off). Unlisted, a turn may still lower
    # a limit or turn parallel calls off, and set use_history, structured_output and
    # temperature, which widen nothing. `model` is governed by `models` instead.
    overrides: list[str] = Field(default_factory=list)
    # Model strings a turn may ask for instead of `model`.
    models: list[str] = Field(default_factory=list)
    # Whether a replay of a recorded turn (`turnkeep replay --live-tools`) may run for real the
    # tool calls that no recorded call matches; off, such a call gets an error result.
    replay_live_tools: bool = False
    # Scripted assistant messages for the `playback` model (a JSON file).
    playback: Path | None = None
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    llm_timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    tool_timeouts: TimeoutSettings = Field(
        default_factory=lambda: TimeoutSettings(start_to_close=300.0, max_attempts=3)
    )
    # The task queue its tools are listed and called on (a server's own `task_queue` wins);
    # unset: the turn's own, where its model calls run.
    task_queue: str | None = Field(default=None, min_length=1)
    # Tool calls that wait for a person's approval; none when absent.
    approval: ApprovalSettings | None = None
    # Tools a client answers (`client__<name>`): a call waits for a client's result, up to
    # `client_timeout` (seconds or `1d`, `2h`, `30m`...), then is denied. It needs no approval:
    # the client that answers decides.
    client_tools: list[ClientToolSettings] = Field(default_factory=list)
    client_timeout: Annotated[float, BeforeValidator(_duration)] = Field(default=86400.0, gt=0)
    # In a session, what a message sent while a turn runs does (`queue`: answered by the next
    # turn; `interrupt`: cancels the running one first). `open_session` passes it in.
    on_new_message: NewMessageMode = "queue"
    # How soon its turns' work is served when workers are busy: `interactive` before `normal`
    # before `batch` (Temporal's task priority). A turn, a gateway key or a calling agent may
    # lower it, never raise it; the agents it calls run at most at its turn's.
    priority: TaskPriority = "normal"
    # fast-agent's agents as tools: each of these agents is offered to the model as a tool named
    # `agent__<name>`, and a call runs that agent's turn as a child workflow.
    agents: list[str] = Field(default_factory=list)
    # At most this many of those calls run at once (fast-agent's `max_parallel`); None: no bound.
    max_parallel: int | None = Field(default=None, gt=0)
    # How another agent's call of this one runs. `child`: as a child workflow, with a history,
    # cancellation, queue and live text of its own. `inline`: its loop runs inside the calling
    # turn's workflow (its model and tool calls are the caller's activities), for a light,
    # short agent: a worker refuses one with a workflow `type`, hooks, approval, client tools,
    # agents, a budget, fallback models, servers that ask, or max_iterations above the
    # default; an evaluator's step (structured output) still runs as a child.
    call: Literal["child", "inline"] = "child"
    # What the agent does, as another agent's tool sees it; unset: its instruction.
    description: str | None = None
    # fast-agent's workflow agents: `agent` (the default) talks to a model; `chain` runs the
    # agents of `sequence` one after another, each given the previous one's answer (with
    # `cumulative`, every earlier answer); `parallel` runs those of `fan_out` at once on the
    # turn's message and gives their answers to `fan_in` (absent: the answers are the
    # result); `router` asks its model which of its `agents` should answer, and that one does;
    # `evaluator_optimizer` has `generator` answer and `evaluator` rate the answer, refining
    # until the rating reaches `min_rating` or `max_refinements` are made; `maker` samples
    # `worker` until one answer has `k` votes more than any other (at most `max_samples`, then
    # the most voted); `orchestrator` and `iterative_planner` (one and the same, as in
    # fast-agent) ask their model for the next step of a plan, tasks for their `agents`, until
    # it says the objective is met or `plan_iterations` steps have run (0 or less: no bound),
    # then answer from the results. Each step is a child turn of the agent's own.
    type: Literal["agent", TeamKind] = "agent"
    sequence: list[str] = Field(default_factory=list)
    cumulative: bool = False
    fan_out: list[str] = Field(default_factory=list)
    fan_in: str | None = None
    include_request: bool = True
    generator: str | None = None
    evaluator: str | None = None
    min_rating: Literal["POOR", "FAIR", "GOOD", "EXCELLENT"] = "GOOD"
    max_refinements: int = Field(default=3, ge=0)
    refinement_instruction: str | None = None
    worker: str | None = None
    k: int = Field(default=3, ge=1)
    max_samples: int = Field(default=50, ge=1)
    # How answers are compared: as written, with case and spacing ignored, or as parsed JSON.
    match_strategy: Literal["exact", "normalized", "structured"] = "exact"
    # Answers longer than this are discarded before the vote (MAKER's red flag).
    red_flag_max_length: int | None = Field(default=None, gt=0)
    plan_iterations: int = 5
    # fast-agent's orchestrator takes `full` or `iterative` and plans one step at a time
    # either way; so does turnkeep's.
    plan_type: Literal["full", "iterative"] = "full"

    @model_validator(mode="before")
    @classmethod
    def _split_chain(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), list):
            chain = list(data["model"])
            if not chain or not all(isinstance(m, str) and m for m in chain):
                raise ValueError("`model` as a list is a fallback chain of model strings")
            return {**data, "model": chain[0], "fallback_models": chain[1:]}
        return data

    @model_validator(mode="after")
    def _workflow_agent(self) -> AgentOptions:
        if self.type == "chain" and not self.sequence:
            raise ValueError("a chain agent needs a `sequence` of at least one agent")
        if self.type == "parallel" and not self.fan_out:
            raise ValueError("a parallel agent needs `fan_out`: at least one agent")
        if self.type == "evaluator_optimizer" and not (self.generator and self.evaluator):
            raise ValueError("an evaluator_optimizer agent needs a `generator` and an `evaluator`")
        if self.type == "maker" and not self.worker:
            raise ValueError("a maker agent needs a `worker` to sample")
        if self.type == "maker" and self.max_samples < self.k:
            raise ValueError("a maker agent's max_samples must be at least k")
        if self.type == "router" and not self.agents:
            raise ValueError("a router agent needs `agents` to route to: at least one")
        if self.type in ("orchestrator", "iterative_planner") and not self.agents:
            raise ValueError(f"an {self.type} agent needs `agents` to plan for: at least one")
        return self

    @model_validator(mode="after")
    def _client_tools(self) -> AgentOptions:
        # A Python agent's may be functions, named by `__name__` (``turnkeep.Agent``).
        names = [getattr(tool, "name", getattr(tool, "__name__", "")) for tool in self.client_tools]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"client tool(s) {twice} declared twice")
        if self.client_tools and self.type != "agent":
            raise ValueError(f"a {self.type} agent runs other agents: it has no client tools")
        return self

    @model_validator(mode="after")
    def _known_overrides(self) -> AgentOptions:
        known = ALL_OVERRIDES | REPLAY_OVERRIDES
        unknown = set(self.overrides) - known
        if unknown:
            raise ValueError(f"unknown override(s) {sorted(unknown)}; choose from {sorted(known)}")
        return self


class AgentSettings(AgentOptions):
    """One entry of ``agents:``."""

    servers: list[str] = Field(default_factory=list)
    # fast-agent's tool filter: server -> tool names (fnmatch patterns) the agent may see.
    tools: dict[str, list[str]] | None = None
    # Hook names (from the top-level `hooks`) to run at each of fast-agent's hook points.
    hooks: dict[HookPoint, list[str]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _client_server(self) -> AgentSettings:
        if self.client_tools and CLIENT_SERVER in self.servers:
            raise ValueError(
                f"an agent with client_tools cannot also use a server named {CLIENT_SERVER!r}: "
                f"client tools are named {CLIENT_SERVER}__<name>"
            )
        return self


class WorkerSettings(_Settings):
    """How ``turnkeep worker`` runs as a service (docs/operations/worker.md); its command-line
    flags override these."""

    # On SIGTERM or SIGINT the worker stops polling and gives running activities this long to
    # finish (`30s`, `2m`, seconds) before it cancels them. Keep the orchestrator's own grace
    # period (Kubernetes' terminationGracePeriodSeconds) a little longer.
    graceful_shutdown: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(seconds=30)
    # HOST:PORT serving GET /healthz and /readyz (e.g. `0.0.0.0:8080`); none when unset.
    health: str | None = Field(default=None, pattern=r"^\S*:\d{1,5}$")
    # Workflows (turns, sessions) kept in memory between their workflow tasks: past this, the
    # least recently used is evicted and replayed from its history when it next has work.
    # Keep it above the workflows with work in flight at once, or they are evicted and
    # replayed over and over. None: the SDK's default (1,000).
    max_cached_workflows: int | None = Field(default=None, ge=1)
    # How long a session with no message to answer stays in the worker's workflow cache
    # (`30s`, `5m`; `off`: until the cache needs its place). Past it, the session costs the
    # worker no memory, and its next message replays it from its history. A turn waiting only
    # for people leaves the cache at once. Any worker with TurnkeepPlugin follows it.
    idle_session_cache: DurationOrOff = timedelta(minutes=5)


class StreamingSettings(_Settings):
    """The worker's live-stream server (``turnkeep.worker.live_server``): the text of its
    in-flight model calls, as the provider streams it, for ``TurnHandle.stream()`` and the CLI."""

    # HOST:PORT it listens on; port 0 picks a free one. Plain HTTP: keep it on loopback or a
    # private network (each stream needs its attempt's secret token; with encryption on the
    # text is encrypted).
    listen: str = Field(default="127.0.0.1:0", pattern=r"^\S*:\d{1,5}$")
    # The URL clients on other machines reach it at (a proxy, the pod's address); by default
    # http://<listen address>.
    advertise: str | None = None


class ServeSettings(_Settings):
    """``turnkeep serve --transport http``: the names and web pages it answers
    (docs/security.md)."""

    # Host names it answers for besides loopback ones (`name` or `name:port`, `*` wildcards):
    # those it is reached by when it listens on another address. `--allowed-hosts` adds more.
    allowed_hosts: list[AllowedHost] = Field(default_factory=list)
    # Web origins (scheme://host:port) whose pages may call it, besides its own and, on
    # loopback, loopback ones. `--allowed-origins` adds more.
    allowed_origins: list[AllowedOrigin] = Field(default_factory=list)


class ObservabilitySettings(_Settings):
    """Metrics and traces (docs/operations/observability.md)."""

    # HOST:PORT where `turnkeep worker` serves Prometheus metrics (GET /metrics), e.g.
    # `127.0.0.1:9464`; none when unset. `--metrics` overrides it.
    metrics: str | None = Field(default=None, pattern=r"^\S*:\d{1,5}$")
    # OpenTelemetry spans for each turn, model call and tool call (needs the `otel` extra);
    # `turnkeep worker` exports them over OTLP as the standard OTEL_* variables say.
    tracing: bool = False
    # Put message content (model input and output, tool arguments and results) on spans.
    # Off by default: conversations often hold what a tracing backend must not.
    trace_content: bool = False


_KEY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class GatewayKeySettings(_SecretSettings):
    """One bearer API key of the HTTP gateway (``turnkeep gateway``) and what it may do."""

    # The key itself: give it as ${VAR} or in turnkeep.secrets.yaml (or in `keys_file`).
    key: SecretStr
    # The agents it may start turns and sessions of, and see and cancel those of; `*`: every
    # agent of the config.
    agents: list[str] = Field(min_length=1)
    # Whether it may approve or deny tool calls waiting for a person.
    decide: bool = False
    # Lowers the priority of the turns and sessions it starts (never raises it): `batch` for a
    # key that runs evaluations or bulk jobs. Unset: the agent's, or what a request asks.
    priority: TaskPriority | None = None
    # Whose turns its turns and sessions are: busy workers share themselves fairly among
    # tenants (Temporal's fairness key). Unset: the key's name. Whatever a request says.
    tenant: TenantName | None = None

    @model_validator(mode="after")
    def _long_enough_key(self) -> GatewayKeySettings:
        if len(self.key.get_secret_value()) < _MIN_TOKEN_CHARS:
            raise ValueError(
                f"a gateway key must be at least {_MIN_TOKEN_CHARS} characters; make one with "
                "`openssl rand -base64 32`"
            )
        return self


class RateLimitSettings(_Settings):
    """Requests each key (and each client address whose key is refused) may make."""

    # Requests per second, sustained...
    per_second: float = Field(default=20.0, gt=0)
    # ...and at once, after a quiet spell.
    burst: int = Field(default=100, ge=1)


class GatewaySettings(_SecretSettings):
    """``turnkeep gateway``: the agents over HTTP, with server-sent events
    (docs/serving/http.md)."""

    # HOST:PORT it listens on; `--listen` overrides it.
    listen: str = Field(default="127.0.0.1:8080", pattern=r"^\S*:\d{1,5}$")
    # key name -> the key and its scope. The name, never the key, is what logs and the
    # decisions' `by` show.
    keys: dict[str, GatewayKeySettings] = Field(default_factory=dict)
    # A YAML or JSON file of more keys, in the same shape as `keys` (relative to the config).
    keys_file: Path | None = None
    # Web origins (scheme://host:port) whose pages may call the API from a browser.
    cors_origins: list[Origin] = Field(default_factory=list)
    # Host names it answers for besides loopback ones (`name` or `name:port`, `*` wildcards):
    # those it is reached by when it listens on another address. `--allowed-hosts` adds more.
    allowed_hosts: list[AllowedHost] = Field(default_factory=list)
    # Web origins whose pages may send it requests, besides its own, `cors_origins` and, on
    # loopback, loopback ones. `--allowed-origins` adds more.
    allowed_origins: list[AllowedOrigin] = Field(default_factory=list)
    # The largest request body accepted, in bytes.
    max_body_bytes: int = Field(default=256 * 1024, gt=0)
    # Requests per key, and per client address for requests without a valid key.
    rate_limit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    # How many event streams the process serves at once, over all turns and sessions.
    max_watchers: int = Field(default=10_000, ge=1)
    # How many events a watcher may have waiting to be sent: one that falls further behind
    # is disconnected and resumes from its last message (`Last-Event-ID`).
    watcher_buffer: int = Field(default=1024, ge=16)
    # The Temporal Web UI's base URL, for the `web_ui` link of each started turn.
    web_ui: str | None = None
    # What an agent's tool call is at /mcp, as `turnkeep serve --instance-scope` says, with
    # the sessions kept per key: `shared` (one session per agent and key), `connection` (per
    # MCP connection) or `request` (a turn of its own, no history).
    mcp_scope: Literal["shared", "connection", "request"] = "shared"

    @model_validator(mode="after")
    def _key_names(self) -> GatewaySettings:
        for name in self.keys:
            if not _KEY_NAME.fullmatch(name):
                raise ValueError(
                    f"gateway key name {name!r} must be 1-64 letters, digits, '.', '_' or '-'"
                )
        return self


class LimitSettings(_Settings):
    """One entry of ``limits:``: what a model (or every model of a provider) may use, across
    every worker of the namespace (docs/operations/limits.md)."""

    # Model calls granted in any 60 s, spread over the minute (a small burst at most).
    requests_per_minute: int | None = Field(default=None, gt=0)
    # Input and output tokens in any 60 s: each call counted at an estimate until it ends,
    # then at the provider's reported usage.
    tokens_per_minute: int | None = Field(default=None, gt=0)
    # Model calls in flight at once.
    concurrency: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _something_limited(self) -> LimitSettings:
        if (self.requests_per_minute, self.tokens_per_minute, self.concurrency) == (None,) * 3:
            raise ValueError(
                "a limit needs at least one of requests_per_minute, tokens_per_minute, concurrency"
            )
        return self


# A limit's name is part of its limiter's workflow id, and shown in metrics and details.
_LIMIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")


# Errors don't quote input: a bad value anywhere in the file could be a key or token.
class Settings(_SecretSettings):
    default_model: str | None = None
    # The worker polls this queue, and for each of its agents the agent's own queue
    # (`<task_queue>.<agent>`), where turnkeep's clients start that agent's turns.
    task_queue: str = Field(default=DEFAULT_TASK_QUEUE, min_length=1)
    mcp: McpSettings = Field(default_factory=McpSettings)
    # server name -> "package.module:function" import paths, served by an in-process FastMCP
    # server under that name.
    function_tools: dict[str, list[str]] = Field(default_factory=dict)
    # hook name -> "package.module:function"; agents enable hooks by name per hook point.
    hooks: dict[str, str] = Field(default_factory=dict)
    # approval policy name -> "package.module:function"; agents name one in `approval.policy`.
    approval_policies: dict[str, str] = Field(default_factory=dict)
    # "package.module:function" import paths an evaluation may name as its judge
    # (`turnkeep replay --query ... --judge`): a client names one, never imports one.
    judges: list[str] = Field(default_factory=list)
    agents: dict[str, AgentSettings] = Field(default_factory=dict)
    # model string -> its price (USD per million tokens), over the list prices (genai-prices):
    # what a model call's `cost_usd` is worked out with. A model priced nowhere costs "unknown".
    prices: dict[str, PriceSettings] = Field(default_factory=dict)
    # model string or provider name -> the requests, tokens and calls in flight it may use,
    # shared by every worker of the namespace; a model's own entry governs it, else its
    # provider's.
    limits: dict[str, LimitSettings] = Field(default_factory=dict)
    # How deep agents may call agents as tools (a turn a client starts is at depth 0): a call
    # that would go deeper is answered with an error instead of starting a turn. Workers of
    # different configs could otherwise call each other's agents round in a circle.
    max_agent_depth: int = Field(default=5, ge=0)
    # Tool results above this many bytes are truncated with a visible note. Unset (the default):
    # with payload_storage on, never (a large result is stored whole and the model gets all of
    # it); with it off, at 256 KiB, so one huge result cannot push a workflow payload past
    # Temporal's 2 MB limit. Set it to cap what a model is shown even with storage on.
    max_tool_result_bytes: int | None = Field(default=None, gt=0)
    # Large payloads (tool results, the turn's result) in external storage, not in history.
    payload_storage: PayloadStorageSettings = Field(default_factory=PayloadStorageSettings)
    # Long turns continue as new past these history sizes.
    continue_as_new: ContinueAsNewSettings = Field(default_factory=ContinueAsNewSettings)
    visibility: VisibilitySettings = Field(default_factory=VisibilitySettings)
    # `turnkeep worker`'s shutdown grace period and health endpoint.
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    # The live-stream server of model calls' text; off (message-level streaming) when absent.
    streaming: StreamingSettings | None = None
    # Prometheus metrics and OpenTelemetry traces.
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    # The HTTP gateway (`turnkeep gateway`): its keys, CORS and limits.
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    # `turnkeep serve --transport http`: the host names and web origins it answers.
    serve: ServeSettings = Field(default_factory=ServeSettings)
    # Payload encryption (AES-256-GCM) with rotating keys; off when absent.
    encryption: EncryptionSettings | None = None
    anthropic: AnthropicSettings | None = None
    openai: ProviderSettings | None = None
    generic: ProviderSettings | None = None
    deepseek: ProviderSettings | None = None  # DeepSeek: `deepseek.<model>`, `deepseek-chat`
    openrouter: ProviderSettings | None = None  # OpenRouter: `openrouter.<vendor>/<model>`
    groq: ProviderSettings | None = None  # Groq: `groq.<model>`
    xai: ProviderSettings | None = None  # xAI: `xai.<model>`, `grok`
    # Google's OpenAI-compatible endpoint: `google.<model>`, `gemini25`...
    google: ProviderSettings | None = None
    azure: AzureSettings | None = None  # Azure OpenAI: `azure.<deployment>`
    # Where relative paths in the file (cwd, playback) are resolved from.
    base_dir: Path = Field(default_factory=Path.cwd, exclude=True)
    # The file these settings came from (the worker says so when it starts), and the
    # fast-agent keys in it that turnkeep accepts but does nothing with
    # (``turnkeep.fastagent.config_keys``), named once when a worker starts.
    config_file: Path | None = Field(default=None, exclude=True)
    ignored_keys: list[str] = Field(default_factory=list, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _fast_agent_keys(cls, data: Any) -> Any:
        return accept_fast_agent_keys(data, cls.model_fields)

    @model_validator(mode="after")
    def _limit_names(self) -> Settings:
        for name in self.limits:
            if not _LIMIT_NAME.fullmatch(name):
                raise ValueError(
                    f"limits: {name[:60]!r} is no model string or provider name (1-200 "
                    "letters, digits and . _ : / @ + -, starting with a letter or digit)"
                )
        return self

    def path(self, p: Path) -> Path:
        return p if p.is_absolute() else self.base_dir / p
