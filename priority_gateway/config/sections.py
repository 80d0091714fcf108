"""The configuration's sections: every key, its type, its default and its meaning, written once.

``docs/configuration.md`` is generated from this module (and ``priority_gateway/batch/settings.py``) by
``gateway config reference``; see ``priority_gateway.config.schema`` for how the types are read.
To add a setting: add a field with its default and a docstring to its section here; the
loader, the environment overrides and the reference follow.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields, replace
from typing import Annotated, Any, ClassVar, Literal, get_args

from annotated_types import Ge, Gt, Interval

from priority_gateway.batch.settings import BatchSettings
from priority_gateway.config.limits import ClientLimits
from priority_gateway.config.schema import Check, ConfigError, starts_with
from priority_gateway.core.classes import BATCH, CLASS_RANK, INTERACTIVE, Budget, ClassSpec, ClassTable
from priority_gateway.core.dispatcher import AdmissionSettings
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.prefix import DEFAULT_BLOCK_CHARS
from priority_gateway.core.prefix_policy import PrefixAffinity
from priority_gateway.core.queue import DEFAULT_DECODE_TOKENS
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sessions import SessionSettings
from priority_gateway.sessions import DEFAULT_SOURCES, SessionSource

# The core's own defaults: the configuration refers to them rather than repeating them.
_LIMITS = LimitSettings()
_ADMISSION = AdmissionSettings()
_SESSIONS = SessionSettings()
_AFFINITY: dict[str, Any] = {name: p.default for name, p in inspect.signature(PrefixAffinity).parameters.items()}
_REQUEST: dict[str, Any] = {f.name: f.default for f in fields(RouteRequest)}

Positive = Gt(0)
NotNegative = Ge(0)
Seconds = Annotated[float, Gt(0)]

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
Policy = Literal["prefix", "least_loaded", "round_robin"]
POLICY_NAMES: tuple[str, ...] = get_args(Policy)

HTTP_URL = starts_with("http://", "https://", expected="an http:// or https:// URL")
DNS_TARGET = starts_with("dns://", expected="dns://HOST:PORT")
KV_EVENTS_ENDPOINT = starts_with(
    "tcp://", "ipc://", "engine-port:", expected="tcp://HOST:PORT, ipc://PATH or engine-port:PORT"
)
STORE_URL = Check(
    lambda url: url in ("sqlite", "memory") or url.startswith(("sqlite://", "redis://", "rediss://", "unix://")),
    "sqlite, sqlite://PATH, memory or a redis:// URL",
)


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Where the gateway accepts clients (``--host`` and ``--port`` override it)."""

    host: str = "127.0.0.1"
    """Address to listen on; ``0.0.0.0`` for every interface (containers)."""
    port: Annotated[int, Interval(ge=1, le=65535)] = 8080
    """TCP port to listen on."""
    ssl_certfile: str | None = None
    """Serve HTTPS with this certificate (PEM, the chain after it); needs ``ssl_keyfile``. Default:
    plain HTTP, for a proxy or ingress in front that terminates TLS."""
    ssl_keyfile: str | None = None
    """The private key of ``ssl_certfile`` (PEM)."""
    shutdown_grace_s: Annotated[float, NotNegative] = 10.0
    """On SIGINT or SIGTERM: how long requests in flight may go on before the gateway cuts them and
    stops (every later step of the shutdown is bounded too)."""

    def validated(self) -> ListenConfig:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            missing = "ssl_keyfile" if self.ssl_keyfile is None else "ssl_certfile"
            raise ConfigError("HTTPS needs both ssl_certfile and ssl_keyfile", [missing])
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """Connections from the gateway to the engines."""

    connect_timeout_s: Seconds = 2.0
    """Time to open a connection to an engine; a request whose engine cannot be reached is tried
    once on another, then gets 502."""
    read_timeout_s: Seconds = 300.0
    """Longest silence from an engine while it answers (waiting for its headers, or between two
    chunks) before the request gets 504 (in a stream: a final error event)."""
    first_byte_timeout_s: Seconds = 30.0
    """Streamed requests: until the engine's first response byte. A non-streamed answer comes
    whole at the end, so only the total deadline bounds it."""
    deadline_factor: Annotated[float, Positive] = 4.0
    """Interactive: the total deadline of one engine attempt is this many times (TTFT budget +
    max_tokens x ITL budget) ..."""
    min_deadline_s: Seconds = 10.0
    """... but at least this ..."""
    max_interactive_s: Seconds = 300.0
    """... and at most this (also the deadline of a request without max_tokens). Batch requests
    have their class's ``deadline_s``, counted from arrival."""

    def attempt_s(self, budget: Budget, max_tokens: int | None, arrival: float, now: float) -> float:
        """Seconds an attempt starting ``now`` may take, for a request with ``budget`` that arrived at ``arrival``."""
        if budget.ttft_s is None and budget.itl_s is None:
            if budget.deadline_s is None:
                return self.max_interactive_s
            return max(0.0, arrival + budget.deadline_s - now)
        if max_tokens is None:
            return self.max_interactive_s
        derived = self.deadline_factor * ((budget.ttft_s or 0.0) + max_tokens * (budget.itl_s or 0.0))
        return min(self.max_interactive_s, max(self.min_deadline_s, derived))


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Health probes of every engine (``GET /health``): only healthy engines get requests."""

    interval_s: Seconds = 2.0
    """Time between two probes of one engine."""
    timeout_s: Seconds = 1.0
    """A probe that takes longer has failed, unless the engine answered other requests meanwhile (busy, not gone)."""
    unhealthy_after: Annotated[int, Ge(1)] = 2
    """Failed probes in a row that take an engine out of rotation (a refused connection takes it
    out at once)."""


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """Scrapes of every engine's Prometheus metrics (``GET /metrics``): queue, KV cache usage,
    prefix cache counters and block size feed routing and admission."""

    interval_s: Seconds = 2.0
    """Time between two scrapes of one engine."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """The engine pools, by name (at least one): engines that serve the same model the same way.
    Requests of a class go to its pool (``classes``). Name pools freely; a class finds the pool
    named like it by default."""

    engines: list[Annotated[str, HTTP_URL]] = field(default_factory=list)
    """The engines' base URLs (``http://10.0.0.1:8000``); give these or ``discovery``."""
    discovery: Annotated[str, DNS_TARGET] | None = None
    """``dns://HOST:PORT``: the engines are every address HOST resolves to (a headless Service),
    on PORT; re-resolved every ``discovery_interval_s``."""
    discovery_interval_s: Seconds = 10.0
    """Time between two resolutions of ``discovery``."""
    policy: Policy = "prefix"
    """How an engine is chosen in the pool: ``prefix`` (where the prompt's prefix is likely
    cached, within a load bound; see ``prefix``), ``least_loaded`` or ``round_robin``."""
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """The engines' ``--scheduling-policy``; with ``priority`` the gateway writes vLLM's
    ``priority`` field: each class's ``priority`` (interactive 0 before batch 1 by default)."""
    backfill: bool = True
    """Batch requests may use this pool's spare capacity while no interactive request waits
    (keeping ``admission.backfill_reserve`` free); they are stopped and queued again when an
    interactive request needs the room."""
    accept_overflow: bool = False
    """Interactive requests may overflow into this pool when their own is full; needs
    ``scheduling_policy: priority``, or they would queue behind batch work."""
    kv_events: Annotated[str, KV_EVENTS_ENDPOINT] | None = None
    """Precise prefix mode: ``tcp://HOST:PORT`` to bind one socket engines publish their KV cache
    events to (each with its URL as topic), or ``engine-port:PORT`` to subscribe to every engine's
    own publisher. Needs ``tokenizer`` and ``policy: prefix``."""
    tokenizer: str | None = None
    """How engines tokenize prompts, for precise mode: a model directory, or ``sim``."""
    kv_events_topics: dict[str, str] = field(default_factory=dict)
    """Topics engines publish under that are neither their URL nor ``host:port``: topic -> engine URL."""
    kv_events_replay_port: Annotated[int, Interval(ge=1, le=65535)] | None = None
    """With ``kv_events: engine-port:PORT``: the port of every engine's replay socket (vLLM's
    ``--kv-events-config`` ``replay_endpoint``, e.g. ``tcp://*:5558``). After a gap in an engine's
    events the gateway asks it for the batches it missed and goes on, instead of forgetting what it
    knew of that engine's cache; it forgets only when the engine no longer keeps them."""
    model: str | None = None
    """A model the pool serves, listed by ``GET /v1/models`` even while no engine answers."""
    models: list[str] = field(default_factory=list)
    """Models (and LoRA adapters) the pool serves, besides ``model`` and what its engines list in
    ``/v1/models``: a request goes to a pool of its class that serves its ``model``."""
    lora_adapters: dict[str, str] = field(default_factory=dict)
    """LoRA adapters loaded on demand, name -> path as the engines read it: a request for one that its
    chosen engine lacks loads it there first (``POST /v1/load_lora_adapter``; engines run with
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``)."""
    max_loaded_adapters: Annotated[int, Ge(1)] = 8
    """Adapters of ``lora_adapters`` one engine keeps loaded; one more unloads the least recently used
    that has no request in flight there."""
    max_num_batched_tokens: Annotated[int, Ge(1)] | None = None
    """The engines' ``--max-num-batched-tokens`` (their token budget per step, which chunks prefills):
    given, the ``prefix`` policy predicts the stall each prompt's prefill makes on each engine and keeps
    an interactive request off engines where it would break the ITL budget of the requests decoding
    there (``prefix.policy.prefill_hold_s``); null: no prediction."""
    max_num_seqs: Annotated[int, Ge(1)] | None = None
    """The engines' ``--max-num-seqs`` (the requests each runs at once): given, no engine of the pool gets
    more at once (its learned concurrency limit never grows past it), so the requests beyond wait in the
    gateway's queue, which orders them, sheds them and refuses them by their TTFT budget, instead of in the
    engine, where they wait unbounded for a running request to end, and what an engine holds waiting below
    them counts as waiting for a step's prefill budget; null: learned from the engines' scrapes (requests
    held waiting beside the same number running, which a chunked-prefill engine can show by chance)."""
    shares_hardware_with: str | None = None
    """Another pool whose engines run on the same GPUs as this one's (e.g. a batch pool beside the
    interactive pool on one device): this pool's engines then learn their concurrency limits from that
    pool's inter-token gaps, against that pool's ITL budget, so its steps never stall the other's
    decoding past its budget; null: the pools share nothing."""
    api_key: str | None = None
    """Bearer token the engines require (``vllm serve --api-key``)."""
    ca_file: str | None = None
    """CA bundle that signs the engines' certificates (``https://`` engines, as ``vllm serve
    --ssl-certfile`` serves them); default: the system's trust store."""

    @property
    def takes_priority(self) -> bool:
        return self.scheduling_policy == "priority"

    def validated(self) -> PoolConfig:
        if not self.engines and not self.discovery:
            raise ConfigError("give engines or discovery")
        if self.kv_events is not None:
            if not self.tokenizer:
                raise ConfigError("needs tokenizer (a model directory, or sim)", ["kv_events"])
            if self.policy != "prefix":
                raise ConfigError("needs policy: prefix", ["kv_events"])
        if self.kv_events_replay_port is not None and not (self.kv_events or "").startswith("engine-port:"):
            raise ConfigError("needs kv_events: engine-port:PORT", ["kv_events_replay_port"])
        if self.accept_overflow and not self.takes_priority:
            raise ConfigError(
                "needs scheduling_policy: priority, or interactive requests would queue behind batch work",
                ["accept_overflow"],
            )
        return replace(self, engines=[url.rstrip("/") for url in self.engines])


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """One priority class (``X-Priority``): the pool that serves it and its latency budgets."""

    pool: str | None = None
    """The pool that serves the class; default: the pool named like the class, else the first pool."""
    ttft_p99_ms: Annotated[float, Positive] | None = None
    """Budget for the 99th percentile of time to first token, in ms: a request that cannot start in
    time is refused at once (429 ``slo_budget_exceeded``); null: no budget."""
    itl_p99_ms: Annotated[float, Positive] | None = None
    """Budget for the 99th percentile of inter-token latency, in ms: each engine's concurrency limit
    is steered to keep it; null: no budget."""
    deadline_s: Annotated[float, Positive] | None = None
    """Longest a request of the class may wait in the queue before it starts; null: no deadline."""
    priority: int | None = None
    """vLLM's ``priority`` written for the class on pools with ``scheduling_policy: priority``
    (lower runs first), and the class's rank in the gateway's queues; default: interactive 0,
    batch 1; any other class must give one."""
    kind: Literal["interactive", "batch"] | None = None
    """How the class behaves: ``interactive`` (refused at once when it cannot start within its TTFT
    budget; may overflow and stop backfilled work) or ``batch`` (fills spare capacity, may be stopped
    and restarted, shed first from a full queue); default: ``batch`` for the class named batch,
    else ``interactive``."""

    @property
    def budget(self) -> Budget:
        return Budget(
            None if self.ttft_p99_ms is None else self.ttft_p99_ms / 1000.0,
            None if self.itl_p99_ms is None else self.itl_p99_ms / 1000.0,
            self.deadline_s,
        )


@dataclass(frozen=True, slots=True)
class ClassesConfig:
    """The priority classes (``X-Priority``): ``interactive`` and ``batch`` always exist; add more by
    name beside them (``realtime: {priority: 0, pool: fast, ttft_p99_ms: 200}``), each with its own
    ``priority``. Keys given for a class replace only those keys of its defaults."""

    OPEN_FIELD: ClassVar[str] = "more"

    interactive: ClassConfig = field(default_factory=lambda: ClassConfig(ttft_p99_ms=500.0, itl_p99_ms=50.0))
    """Requests a person waits for: tight TTFT and ITL budgets."""
    batch: ClassConfig = field(default_factory=lambda: ClassConfig(deadline_s=86400.0))
    """Work that can wait (the Batch API's lines, ``X-Priority: batch``): a deadline, no latency budget."""
    more: dict[str, ClassConfig] = field(default_factory=dict)
    """Further classes, by name (lower case), given beside ``interactive`` and ``batch``."""

    def by_name(self) -> dict[str, ClassConfig]:
        return {INTERACTIVE: self.interactive, BATCH: self.batch, **self.more}

    def validated(self) -> ClassesConfig:
        for name, spec in self.more.items():
            if name != name.lower() or not name.replace("-", "").replace("_", "").isalnum():
                raise ConfigError("a class name is lower-case letters, digits, - and _", [name])
            if spec.priority is None:
                raise ConfigError("a class other than interactive and batch needs a priority", [name, "priority"])
        return self

    def table(self) -> ClassTable:
        """The classes as the core sees them: rank (vLLM priority) and kind."""
        return ClassTable(
            ClassSpec(
                name,
                spec.priority if spec.priority is not None else CLASS_RANK.get(name, 0),
                spec.kind or (BATCH if name == BATCH else INTERACTIVE),
            )
            for name, spec in self.by_name().items()
        )


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """SLO admission: every engine gets a concurrency limit found by AIMD on the ITL p99 the gateway
    measures; requests beyond it wait in their pool's queue, and a request with a TTFT budget starts
    on an engine only while the prefill queued there lets its first token come in time."""

    enabled: bool = _ADMISSION.enabled
    """Off: every request goes to an engine at once (routing only, no limits, no queue)."""
    initial_limit: Annotated[float, Positive] = _LIMITS.initial
    """Concurrency limit of an engine with an ITL budget before anything is measured."""
    min_limit: Annotated[float, Positive] = _LIMITS.minimum
    """The limit never shrinks below this."""
    max_limit: Annotated[float, Positive] = _LIMITS.maximum
    """The limit never grows above this."""
    interval_s: Seconds = _LIMITS.interval_s
    """Time between two reconsiderations of each engine's limit."""
    cooldown_s: Annotated[float, NotNegative] = _LIMITS.cooldown_s
    """After a shrink, no further shrink for this long."""
    window_s: Seconds = _LIMITS.window_s
    """Length of the sliding window of ITL samples compared with the budget: only evidence this fresh
    shrinks a limit."""
    min_samples: Annotated[int, Ge(1)] = _LIMITS.min_samples
    """Samples a window needs before its p99 is trusted."""
    growth: Annotated[float, Interval(gt=0, le=4)] = _LIMITS.growth
    """Share of the limit a step up adds while the level's ITL p99 is within 80 % of the budget (one
    step at a time near the budget and up to a level once found over it)."""
    recover_s: Seconds = _LIMITS.recover_s
    """A limit below ``initial_limit`` climbs back one step each time this passes without a shrink and
    without the next level found over budget (an idle engine's limit returns to the probe level)."""
    unbudgeted_limit: Annotated[float, Positive] = _LIMITS.unbudgeted
    """Fixed concurrency limit of engines whose class has no ITL budget."""
    max_queue: Annotated[int, NotNegative] = _ADMISSION.max_queue
    """Requests that may wait in one pool's queue; beyond it the newest batch request is shed,
    or the request is refused (429 ``queue_full``)."""
    backfill_reserve: Annotated[float, Interval(ge=0, lt=1)] = _ADMISSION.backfill_reserve
    """Share of an interactive engine's limit kept free of backfilled batch requests."""

    def validated(self) -> AdmissionConfig:
        if self.min_limit > self.max_limit:
            raise ConfigError(f"must be <= max_limit ({self.max_limit:g}), got {self.min_limit:g}", ["min_limit"])
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ConfigError(
                f"must be between min_limit and max_limit ({self.min_limit:g}..{self.max_limit:g}), "
                f"got {self.initial_limit:g}",
                ["initial_limit"],
            )
        return self


@dataclass(frozen=True, slots=True)
class TenantsConfig:
    """Tenants share each class by weighted fair queueing. A tenant is an API key, or the ``tenant``
    its key names (several keys, one tenant); its weight and concurrency cap are the key's settings
    (``gateway keys create --tenant --weight --max-concurrency``). Without keys every request is one
    tenant."""

    fair: bool = True
    """Weighted fair queueing inside each class, charged in predicted prompt + decode tokens; off: one
    line per class by deadline, whoever queued it."""
    decode_tokens: Annotated[int, Ge(0)] = DEFAULT_DECODE_TOKENS
    """Decode tokens charged for a request without ``max_tokens`` (in fair queueing, and reserved at
    admission under its key's tokens-per-minute limit)."""
    metrics_limit: Annotated[int, Ge(0)] = 100
    """Tenants that get their own label in ``gateway_tenant_*`` metrics (the first seen); the rest
    are counted under ``tenant="other"``."""


@dataclass(frozen=True, slots=True)
class SessionsConfig:
    """Agent sessions and conversations: a request that names one (a header or body field below) is a
    turn of it. A turn that comes within its session's learned pause (the tool call between two model
    calls) continues it: it is admitted ahead of new sessions' first turns in its tenant's line of its
    class (at most ``first_burst`` in a row while another waits), and while the session pauses its
    context's KV cache counts as held on its engine, so cold prompts go to engines with room rather than
    evict it (the ``prefix`` policy's ``retention_weight``), never more than the engine's free KV cache.
    Replicas on a fleet tell each other what their paused sessions hold. Session ids are bounded (long
    or non-ASCII values are hashed), scoped by tenant, and never a metric label."""

    enabled: bool = _SESSIONS.enabled
    """Recognise sessions (off: no request is a session's turn; ``X-Session-ID`` pins nothing either)."""
    sources: list[SessionSource] = field(default_factory=lambda: list(DEFAULT_SOURCES))
    """Where a request's session id is read, first usable one wins: headers ``x-session-id``,
    ``x-session-affinity``, ``session-id``, ``x-claude-code-session-id``,
    ``x-gateway-inference-fairness-id`` (llm-d); body fields ``prompt_cache_key``, ``conversation``
    (Responses API, a string or an object with ``id``), ``previous_response_id`` (each turn of a chain
    names another response: it groups a turn with its retries, not a chain), ``safety_identifier``,
    ``user`` (an end user: all their sessions become one). Leave a source out to ignore it."""
    max_sessions: Annotated[int, Ge(1)] = _SESSIONS.max_sessions
    """Sessions remembered at once (the least recently active forgotten first, with its hold)."""
    default_hold_s: Annotated[float, Positive] = _SESSIONS.default_hold_s
    """How long a session that has not paused yet is taken to hold its KV cache after a turn."""
    min_hold_s: Annotated[float, NotNegative] = _SESSIONS.min_hold_s
    """Shortest hold, whatever the session's learned pause."""
    max_hold_s: Annotated[float, Positive] = _SESSIONS.max_hold_s
    """Longest hold: a session quiet longer than this is a new one when it comes back."""
    gap_factor: Annotated[float, Positive] = _SESSIONS.gap_factor
    """A hold lasts this many times the session's learned pause (an EWMA of its pauses)."""
    gap_weight: Annotated[float, Interval(gt=0, le=1)] = _SESSIONS.gap_weight
    """Weight of the newest pause in the learned one."""
    first_burst: Annotated[int, Ge(0)] = _SESSIONS.first_burst
    """Continuing turns that may start in a row while another request of the same tenant and class
    waits; then the oldest of those starts (0: continuing turns get no precedence)."""
    wait_for_engine: bool = _SESSIONS.wait_for_engine
    """A continuing turn whose session's engine is full, while another has room, waits for a seat on
    its own engine as long as it has waited less than ``wait_factor`` times its first token would take
    on the other (computing its whole context there), and less than half its time left to start; then
    it moves. Off: it starts wherever there is room at once."""
    wait_factor: Annotated[float, Positive] = _SESSIONS.wait_factor
    """How long such a turn waits, in its predicted first token on the other engine: moving costs more
    than the mover's own first token (its context computed again is prefill the other engine's requests
    wait behind), so it may wait several of them."""

    def validated(self) -> SessionsConfig:
        if self.min_hold_s > self.max_hold_s:
            raise ConfigError(f"must be <= max_hold_s ({self.max_hold_s:g}), got {self.min_hold_s:g}", ["min_hold_s"])
        return self

    def settings(self) -> SessionSettings:
        return SessionSettings(
            self.enabled,
            self.max_sessions,
            self.default_hold_s,
            self.min_hold_s,
            self.max_hold_s,
            self.gap_factor,
            self.gap_weight,
            self.first_burst,
            self.wait_for_engine,
            self.wait_factor,
        )


@dataclass(frozen=True, slots=True)
class PrefixPolicyConfig:
    """Tuning of the ``prefix`` routing policy, for every pool that uses it
    (``priority_gateway/core/prefix_policy.py`` says how it decides)."""

    load_factor: Annotated[float, Ge(1)] = _AFFINITY["load_factor"]
    """Bounded load: an engine is eligible while its load stays under ``load_factor`` times the
    pool's mean; 1 is strict balance, higher lets more requests follow their cached prefix."""
    cache_weight: Annotated[float, NotNegative] = _AFFINITY["cache_weight"]
    """What one cached prompt token saves, in tokens of queued prefill: a hit kept also serves
    the conversation's next turns."""
    queue_weight: Annotated[float, NotNegative] = _AFFINITY["queue_weight"]
    """Weight of the prefill already queued on an engine (``pending_prefill``) in its cost."""
    decode_cost_tokens: Annotated[float, NotNegative] = _AFFINITY["decode_cost_tokens"]
    """Cost, in prompt tokens, of each request in flight on an engine."""
    kv_cost_tokens: Annotated[float, NotNegative] = _AFFINITY["kv_cost_tokens"]
    """Cost, in prompt tokens, of KV cache pressure (grows with usage above 80 %)."""
    tolerance: Annotated[float, NotNegative] = _AFFINITY["tolerance"]
    """Engines within this share of the prompt's size of the cheapest are equally good; among them
    the one holding the most of the prompt wins, then rendezvous hashing."""
    tolerance_tokens: Annotated[float, NotNegative] = _AFFINITY["tolerance_tokens"]
    """Smallest tolerance, in tokens, for short prompts."""
    rendezvous_blocks: Annotated[int, Ge(1)] = _AFFINITY["rendezvous_blocks"]
    """Blocks past the longest cached depth that pick the engine for a prefix nobody holds, so
    every replica sends a new prefix to the same engine."""
    default_capacity_tokens: Annotated[int, Ge(1)] = _AFFINITY["default_capacity_tokens"]
    """Cache capacity assumed for an engine until its ``vllm:cache_config_info`` is scraped."""
    max_sessions: Annotated[int, Ge(1)] = _AFFINITY["max_sessions"]
    """Sessions (``sessions.sources``) pinned to an engine that are remembered (least recent dropped first)."""
    honesty_share: Annotated[float, Positive] = _AFFINITY["honesty_share"]
    """Prompt tokens, as a share of an engine's cache, over which predicted hits are compared with
    the engine's real prefix cache counters before its modelled capacity is corrected."""
    lora_aware: bool = _AFFINITY["lora_aware"]
    """A LoRA adapter's request goes to an engine with a free adapter slot (``max_lora``, from
    ``vllm:lora_requests_info``) while one has room, preferring one that holds the adapter."""
    lora_swap_tokens: Annotated[float, NotNegative] = _AFFINITY["lora_swap_tokens"]
    """Cost, in prompt tokens, of an engine bringing the request's adapter into a GPU slot."""
    prefill_hold_s: Annotated[float, NotNegative] = _AFFINITY["prefill_hold_s"]
    """Pools with ``max_num_batched_tokens``: how long an interactive request that no engine can take
    without its prefill breaking the ITL budget there may wait in the queue for one that can (0: never;
    it goes where it breaks the fewest gaps). A pool that ``accept_overflow``s takes it at once instead
    (measured: 0.02 with a batch pool beside, ``benchmarks/results/prefill_aware``). Needs admission on."""
    retention_weight: Annotated[float, NotNegative] = _AFFINITY["retention_weight"]
    """Paused agent sessions' KV cache counts as held (``sessions``): each held token a request would
    evict on an engine costs this many times ``cache_weight`` there (0: holds are not weighed)."""
    lower_tier_weight: Annotated[float, Interval(ge=0, le=1)] = _AFFINITY["lower_tier_weight"]
    """Precise mode: a prompt token an engine holds only in a lower tier (CPU, vLLM's KV offloading, KV
    events with ``medium``) counts this share of a GPU hit: loading it back costs less than computing it."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Replicas on a Redis ``store`` act as one fleet through a Redis pub/sub channel: every few ms each
    tells the others which engine got each request (with the prompt's block hashes in approximate
    mode), its own in-flight requests, pending prefill, concurrency limit and claim on each engine's
    slots, what its requests' inter-token gaps showed (one replica, the lowest id, learns each engine's
    limit from everyone's), and, with fair queueing, its tenants' requests per pool. So every replica's
    prefix index, view of engine load, admission (no engine ever runs more than its limit, whatever
    replica started what) and tenants' shares cover the whole fleet. Never on a request's path; while
    the channel is down each replica routes on its own knowledge (``gateway_routing_share_up`` 0),
    admits its safe share of every limit and counts only its own requests in tenants' shares. With
    ``store: sqlite`` or ``memory`` there is one replica and nothing to share. (Read from ``prefix.share`` too, the
    older place of this section.)"""

    enabled: bool = True
    """Act as one fleet with the other replicas when the store is Redis."""
    channel: str = "gateway:routing"
    """Redis pub/sub channel; replicas routing to the same engines use the same one."""
    secret: str | None = None
    """Shared secret of the fleet: every batch is signed with it (HMAC-SHA256) and only batches signed
    with it are heard, so nobody who can publish on the channel can lower limits or fill engines. Set
    it from the environment (``GATEWAY__FLEET__SECRET``) or ``secret_file``, the same on every replica;
    null: batches are unsigned (then keep the channel to the gateways: Redis ACLs, network policy)."""
    secret_file: str | None = None
    """With ``secret`` unset: a file holding the fleet's secret (e.g. a mounted Kubernetes Secret)."""
    interval_s: Annotated[float, Interval(gt=0, le=1)] = 0.005
    """How often a replica sends what changed since its last batch."""
    full_s: Annotated[float, Interval(gt=0, le=60)] = 1.0
    """How often a replica sends everything (also its heartbeat); the safe share ends this long after
    the channel works again."""
    silent_s: Annotated[float, Interval(gt=0, le=600)] = 3.0
    """A replica not heard from this long no longer counts (it stopped, or the channel broke)."""
    max_pending: Annotated[int, Ge(1)] = 10_000
    """Facts kept for the next batch at most; older ones are dropped when the channel cannot keep up."""
    replicas_window_s: Annotated[float, Interval(gt=0, le=3600)] = 30.0
    """While the channel is down each replica admits at most ``limit / replicas`` on every engine,
    counting the replicas heard within this window before it broke (``gateway_admission_safe_share``)."""

    def validated(self) -> FleetConfig:
        if not self.channel:
            raise ConfigError("must not be empty", ["channel"])
        if self.silent_s <= self.full_s:
            raise ConfigError(f"must be longer than full_s ({self.full_s:g}), got {self.silent_s:g}", ["silent_s"])
        if self.secret is not None and len(self.secret) < 16:
            raise ConfigError("must be at least 16 characters (e.g. openssl rand -hex 32)", ["secret"])
        return self


@dataclass(frozen=True, slots=True)
class PrefixConfig:
    """How prompts are cut into blocks for prefix affinity, and the ``prefix`` policy's tuning."""

    block_chars: Annotated[int, Positive] = DEFAULT_BLOCK_CHARS
    """Characters per hashed block of the prompt text (guess mode)."""
    block_tokens: Annotated[int, Positive] = _REQUEST["block_tokens"]
    """Tokens one block stands for when predicting cached tokens in guess mode (vLLM's KV block
    size; precise mode reads the engines' own)."""
    policy: PrefixPolicyConfig = field(default_factory=PrefixPolicyConfig)


@dataclass(frozen=True, slots=True)
class AliasTarget:
    """One served name of a weighted split, and its share."""

    model: str = ""
    """The served name (a model or LoRA adapter an engine lists)."""
    weight: Annotated[int, NotNegative] = 1
    """Relative share of the public name's requests."""

    def validated(self) -> AliasTarget:
        if not self.model:
            raise ConfigError("is required", ["model"])
        return self


@dataclass(frozen=True, slots=True)
class ModelsConfig:
    """Public model names: what clients may ask for besides the names the engines serve."""

    aliases: dict[str, str | list[AliasTarget]] = field(default_factory=dict)
    """Public name -> served name (``chat: llama-3.1-8b``), or a weighted split
    (``chat: [{model: a, weight: 90}, {model: b, weight: 10}]``, smooth weighted round robin). The
    engine receives the served name in ``model``; the client gets the public name back. Every
    served name must be declared by a pool (``pools.<name>.model``, ``models`` or ``lora_adapters``);
    a request for one that no engine lists gets 404 ``model_not_found`` at once."""
    engine_header: bool = True
    """Answer with ``x-gateway-engine``: an opaque id of the engine that served the request (a hash
    of its URL), so operators and tests see placement without reading ``/metrics``."""

    def validated(self) -> ModelsConfig:
        for public, target in self.aliases.items():
            if isinstance(target, list):
                if not target:
                    raise ConfigError("a split needs at least one target", ["aliases", public])
                if sum(t.weight for t in target) <= 0:
                    raise ConfigError("the weights of a split must not all be 0", ["aliases", public])
        return self


@dataclass(frozen=True, slots=True)
class KeysConfig:
    """API keys (``gateway keys``): where they are kept and when they are required."""

    file: str | None = None
    """With ``store: memory`` or ``sqlite``: a JSON file that keeps the keys instead of the store (one
    replica only)."""
    admin: str | None = None
    """Bearer secret of the ``/admin/keys`` API; null: the admin API is off (unless ``admin_file`` is
    set). Set it from the environment (``GATEWAY__KEYS__ADMIN``), not in a file."""
    admin_file: str | None = None
    """With ``admin`` unset: a file that holds the admin key. If it does not exist, the gateway
    generates a random key at start, writes it there (mode 0600) and logs the file's path, never the
    key; replicas sharing the file share the key."""
    required: bool | Literal["auto"] = "auto"
    """Whether ``/v1/*`` needs a key: ``auto`` as soon as one active key exists, or always
    (``true``), or never (``false``)."""
    cache_s: Annotated[float, NotNegative] = 5.0
    """How long a looked-up key is trusted: a revoked key stops working within this time on
    every replica."""
    refresh_s: Seconds = 2.0
    """With ``required: auto``: how often a replica checks whether any key exists."""


@dataclass(frozen=True, slots=True)
class Config:
    """The gateway's configuration: one YAML file, then ``GATEWAY__*`` environment variables, then
    command-line options; every key below has a default except ``pools``."""

    listen: ListenConfig = field(default_factory=ListenConfig)
    store: Annotated[str, STORE_URL] = "sqlite"
    """State (batch jobs and their lines, files, keys, rate windows): ``sqlite`` (one node, kept in
    ``data_dir``/gateway.db across restarts; ``sqlite://PATH`` for another file), ``memory`` (one
    replica, lost at exit: for tests) or ``redis://HOST:PORT/DB`` (``rediss://``, ``unix://``), shared
    by every replica; a Redis URL's query may size the replica's connection pool:
    ``?max_connections=128&timeout=5`` (the defaults: a call waits this many seconds for a free
    connection, then gets 503 ``store_busy``)."""
    data_dir: str | None = None
    """Where ``store: sqlite`` keeps its file: default ``$XDG_STATE_HOME/priority-gateway``, else
    ``~/.local/state/priority-gateway`` (the container image: ``/var/lib/gateway``)."""
    max_body_bytes: Annotated[int, Positive] | None = None
    """The older spelling of ``limits.max_body_bytes``, read when that is not set."""
    log_level: LogLevel = "info"
    """Level of the gateway's structured log on stderr (``--log-level`` overrides it)."""
    access_log: bool = True
    """One ``event=access`` line per inference request and batch line, at info level: request id,
    key, class, pool, engine, status, admission, queue wait, TTFT, tokens, duration, bytes sent."""
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    pools: dict[str, PoolConfig] = field(default_factory=dict)
    classes: ClassesConfig = field(default_factory=ClassesConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    tenants: TenantsConfig = field(default_factory=TenantsConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    batch: BatchSettings = field(default_factory=BatchSettings)
    keys: KeysConfig = field(default_factory=KeysConfig)
    limits: ClientLimits = field(default_factory=ClientLimits)

    def validated(self) -> Config:
        """Each class's pool resolved (its own name, else the first pool) and checked."""
        resolved = {}
        for name, spec in self.classes.by_name().items():
            pool = spec.pool
            if pool is None and self.pools:
                pool = name if name in self.pools else next(iter(self.pools))
            if pool is not None and pool not in self.pools:
                known = ", ".join(self.pools) or "none"
                raise ConfigError(f"no pool named {pool!r} (pools: {known})", ["classes", name, "pool"])
            resolved[name] = replace(spec, pool=pool)
        for name, spec_of_pool in self.pools.items():
            other = spec_of_pool.shares_hardware_with
            if other is not None and (other not in self.pools or other == name):
                known = ", ".join(p for p in self.pools if p != name) or "none"
                raise ConfigError(
                    f"no other pool named {other!r} (pools: {known})", ["pools", name, "shares_hardware_with"]
                )
        limits = self.limits
        if self.max_body_bytes is not None and limits.max_body_bytes == ClientLimits().max_body_bytes:
            limits = replace(limits, max_body_bytes=self.max_body_bytes)
        self._check_alias_targets()
        interactive, batch = resolved.pop(INTERACTIVE), resolved.pop(BATCH)
        return replace(self, classes=ClassesConfig(interactive, batch, resolved), limits=limits)

    def _check_alias_targets(self) -> None:
        """Every alias names a model some pool declares: the gateway knows where it goes before any
        engine answers, and a request for it never waits for a pool that does not serve it."""
        declared: set[str] = set()
        for pool in self.pools.values():
            declared.update([pool.model] if pool.model else [])
            declared.update(pool.models)
            declared.update(pool.lora_adapters)
        for public, target in self.models.aliases.items():
            for name in [target] if isinstance(target, str) else [t.model for t in target]:
                if name not in declared:
                    raise ConfigError(
                        f"{name!r} is declared by no pool: add it to the models of the pool that serves it "
                        f"(pools.<name>.models)",
                        ["models", "aliases", public],
                    )

    def home_pools(self) -> dict[str, str]:
        """Each class's pool (once there are pools)."""
        return {name: spec.pool for name, spec in self.classes.by_name().items() if spec.pool is not None}
