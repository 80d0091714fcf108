"""LoRA adapters loaded on demand: the engine chosen for a request gets its adapter first.

Rules:
- Only adapters a pool names in ``lora_adapters`` are ever loaded or unloaded, and only on that
  pool's engines; adapters an engine was started with are never touched.
- Routing has already weighed where the adapter is (the prefix policy prefers an engine that lists
  it); this only makes sure the chosen engine has it before the request is sent.
- One load per engine and adapter at a time: requests that arrive meanwhile wait for that load.
- An engine keeps at most ``max_loaded_adapters`` of the pool's adapters; loading one more first
  unloads the least recently used one with no request of this replica in flight there.
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


class AdapterLoader:
    def __init__(
        self,
        pools: Mapping[str, PoolConfig],
        engine: Callable[[str], EngineState | None],
        clients: EngineClients,
    ) -> None:
        self.engine = engine
        self.clients = clients
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
        engine = self.engine(engine_id)
        while len(loaded) >= self.limits[pool]:
            idle = [name for name in loaded if engine is None or name not in engine.adapters.inflight]
            if not idle:
                break
            await self._unload(engine_id, idle[0])
            loaded.pop(idle[0], None)
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
            response = await asyncio.wait_for(client.request(b"POST", path, _JSON, body), LOAD_TIMEOUT_S)
            try:
                return response.status, (await response.read()).decode(errors="replace")
            finally:
                response.close()
        except (UpstreamError, TimeoutError, KeyError) as exc:
            log.warning("lora_admin_failed", engine=engine_id, path=path.decode(), reason=str(exc))
            message = f"the engine could not be reached to load an adapter: {exc}"
            raise ApiError(502, message, "upstream_error") from None
