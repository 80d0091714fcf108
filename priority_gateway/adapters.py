"""LoRA adapters loaded on demand: the engine chosen for a request gets its adapter first.

Rules:
- Only adapters a pool names in ``lora_adapters`` are ever loaded or unloaded, and only on that
  pool's engines; adapters an engine was started with are never touched.
- Routing has already weighed where the adapter is (the prefix policy prefers an engine that lists
  it); this only makes sure the chosen engine has it before the request is sent.
- One load per engine and adapter at a time: requests that arrive meanwhile wait for that load.
- An engine keeps at most ``max_loaded_adapters`` of the pool's adapters, whichever replica loaded
  them: those it lists, those this replica loaded, and those another replica has requests in flight
  for there (``fleet``: it may be loading one this instant). Loading one more first unloads the least
  recently used one that no request runs on, on any replica (this one's in flight, the others' as
  they report them, the engine's own running and waiting at its last scrape); when every one of them
  serves a request somewhere, the load waits for one to end, at most ``LOAD_TIMEOUT_S``, then the
  request is refused with 503 ``adapter_slots_busy``.
- vLLM answers 400 for an adapter already loaded (another replica loaded it): that counts as loaded.
  Any other failure is the request's 502, with the engine's answer in the log.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import orjson

from priority_gateway import log
from priority_gateway.core.dispatcher import Dispatch
from priority_gateway.core.engines import EngineState
from priority_gateway.errors import ApiError
from priority_gateway.upstream.h1 import UpstreamError

if TYPE_CHECKING:
    from priority_gateway.config import PoolConfig
    from priority_gateway.http.seams import EngineClients

_JSON = ((b"content-type", b"application/json"),)
LOAD_TIMEOUT_S = 60.0
BUSY_POLL_S = 0.05


class AdapterLoader:
    def __init__(
        self,
        pools: Mapping[str, PoolConfig],
        engine: Callable[[str], EngineState | None],
        clients: EngineClients,
        elsewhere: Callable[[str], set[str]] = lambda _: set(),
    ) -> None:
        self.engine = engine
        self.clients = clients
        self.elsewhere = elsewhere
        """The adapters the other replicas' requests on an engine run on (``Fleet.adapters_in_flight``)."""
        self.paths = {name: dict(pool.lora_adapters) for name, pool in pools.items()}
        self.limits = {name: pool.max_loaded_adapters for name, pool in pools.items()}
        self._loaded: dict[str, OrderedDict[str, None]] = {}
        self._loading: dict[tuple[str, str], asyncio.Task[None]] = {}

    def wanted(self, dispatch: Dispatch) -> bool:
        """The request names an adapter its engine may have to load (the hot path's only cost)."""
        adapter = dispatch.request.adapter
        return adapter is not None and adapter in self.paths.get(dispatch.engine.pool, ())

    async def ensure(self, dispatch: Dispatch) -> None:
        engine = dispatch.engine
        adapter = dispatch.request.adapter
        assert adapter is not None
        loaded = self._loaded.setdefault(engine.id, OrderedDict())
        if engine.models is not None and adapter in engine.models:
            loaded[adapter] = None
            loaded.move_to_end(adapter)
            return
        key = (engine.id, adapter)
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.create_task(self._load(engine.id, engine.pool, adapter))
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        await asyncio.shield(task)

    async def _load(self, engine_id: str, pool: str, adapter: str) -> None:
        loaded = self._loaded.setdefault(engine_id, OrderedDict())
        waited = 0.0
        while len(present := self._present(engine_id, pool)) >= self.limits[pool] and adapter not in present:
            idle = [name for name in present if name not in self._busy(engine_id)]
            if idle:
                await self._unload(engine_id, idle[0])
                loaded.pop(idle[0], None)
                continue
            if waited >= LOAD_TIMEOUT_S:
                message = f"every adapter slot of the engine serves requests; adapter '{adapter}' cannot be loaded now"
                raise ApiError(503, message, "adapter_slots_busy", retry_after_s=1.0)
            await asyncio.sleep(BUSY_POLL_S)
            waited += BUSY_POLL_S
        engine = self.engine(engine_id)
        body = orjson.dumps({"lora_name": adapter, "lora_path": self.paths[pool][adapter]})
        status, answer = await self._post(engine_id, b"/v1/load_lora_adapter", body)
        if status not in (200, 400):
            log.warning("lora_load_failed", engine=engine_id, adapter=adapter, status=status, reason=answer[:200])
            raise ApiError(502, f"the engine could not load adapter '{adapter}' (status {status})", "upstream_error")
        if status == 400 and "already been loaded" not in answer:
            log.warning("lora_load_failed", engine=engine_id, adapter=adapter, status=status, reason=answer[:200])
            raise ApiError(502, f"the engine refused to load adapter '{adapter}'", "upstream_error")
        loaded[adapter] = None
        if engine is not None:
            engine.models = (engine.models or frozenset()) | {adapter}
        log.info("lora_loaded", engine=engine_id, adapter=adapter, loaded=len(loaded))

    def _present(self, engine_id: str, pool: str) -> list[str]:
        """The pool's adapters the engine holds or is about to, least recently used here first."""
        ours = self.paths[pool]
        engine = self.engine(engine_id)
        listed = engine.models if engine is not None and engine.models is not None else frozenset()
        held = [*self._loaded.get(engine_id, ()), *sorted(listed), *sorted(self.elsewhere(engine_id))]
        return list(dict.fromkeys(name for name in held if name in ours))

    def _busy(self, engine_id: str) -> set[str]:
        """Adapters some request runs on, here or on another replica, or the engine runs or queues."""
        engine = self.engine(engine_id)
        here = set(engine.adapters.inflight) | engine.adapters.active if engine is not None else set()
        return here | self.elsewhere(engine_id)

    async def _unload(self, engine_id: str, adapter: str) -> None:
        status, answer = await self._post(engine_id, b"/v1/unload_lora_adapter", orjson.dumps({"lora_name": adapter}))
        if status != 200:
            log.warning("lora_unload_failed", engine=engine_id, adapter=adapter, status=status, reason=answer[:200])
        engine = self.engine(engine_id)
        if engine is not None and engine.models is not None:
            engine.models = engine.models - {adapter}
        log.info("lora_unloaded", engine=engine_id, adapter=adapter, status=status)

    async def _post(self, engine_id: str, path: bytes, body: bytes) -> tuple[int, str]:
        try:
            client = self.clients.client(engine_id)
            async with asyncio.timeout(LOAD_TIMEOUT_S):  # not wait_for, which can lose a cancellation
                response = await client.request(b"POST", path, _JSON, body)
            try:
                return response.status, (await response.read()).decode(errors="replace")
            finally:
                response.close()
        except (UpstreamError, TimeoutError, KeyError) as exc:
            log.warning("lora_admin_failed", engine=engine_id, path=path.decode(), reason=str(exc))
            message = f"the engine could not be reached to load an adapter: {exc}"
            raise ApiError(502, message, "upstream_error") from None
