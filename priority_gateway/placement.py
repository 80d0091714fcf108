"""From a request's parsed body to what the core routes on: its model, prompt length and prefix.

Rules:
- The model must be one the pools serve or an alias (a 404 names the first ``LISTED_IN_ERROR`` of
  them); without ``model``, the only one served. An alias resolves here, once per request: the
  core routes on the served name, and ``RouteRequest.alias`` keeps the public one.
- The prefix is hashed the way the model's pool's engines will see the prompt: token blocks of the
  engines' own size in precise mode (the pool's tokenizer), blocks of token ids for a completions
  prompt given as ids, else ``prefix.block_chars`` characters of the text as rendered. The chain
  is seeded with the base model and the LoRA adapter (``Catalog.resolve``); precise mode seeds
  with the adapter's name, as the engines' KV events carry it.
- The request's agent session is recognised here, from the headers the request path collected and
  the body's fields (``priority_gateway.sessions``): the core sees only its bounded key.
- Request ids here are the gateway's own: a client's ``x-request-id`` is echoed, but need not be unique.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from priority_gateway.core.classes import Budget
from priority_gateway.core.precise import token_block_hashes
from priority_gateway.core.prefix import (
    TokenPromptError,
    chain_seed,
    estimate_tokens,
    hash_blocks,
    hash_token_blocks,
    prompt_text,
    token_prompt,
)
from priority_gateway.core.request import RouteRequest
from priority_gateway.errors import ApiError
from priority_gateway.http.body import echo, max_tokens_of
from priority_gateway.models import Catalog, Resolved
from priority_gateway.sessions import SessionRecognition
from priority_gateway.tokenizers import PromptTokenizer, prompt_token_ids


class PrecisePrompts(Protocol):
    """A pool in precise prefix mode: the engines' tokenizer and KV block size."""

    tokenizer: PromptTokenizer

    def block_size(self) -> int: ...


class Placement:
    def __init__(
        self,
        home: Callable[[str, str], str],
        catalog: Catalog,
        precise: Mapping[str, PrecisePrompts],
        block_chars: int,
        block_tokens: int,
        sessions: SessionRecognition | None = None,
    ) -> None:
        self.home = home
        self.catalog = catalog
        self.precise = precise
        self.block_chars = block_chars
        self.block_tokens = block_tokens
        self.sessions = sessions or SessionRecognition()
        self._ids = (f"r{n}" for n in itertools.count())

    def route_request(
        self,
        parsed: Mapping[str, Any],
        hashes_prompt: bool,
        cls: str,
        budget: Budget,
        session_headers: Mapping[bytes, bytes] | None,
        arrival: float,
    ) -> RouteRequest:
        resolved = self._model(parsed)
        req = RouteRequest(
            next(self._ids),
            cls,
            resolved.served,
            arrival,
            budget=budget,
            session=self.sessions.key(session_headers, parsed),
            restartable=parsed.get("stream") is not True,
            adapter=resolved.adapter,
            alias=resolved.public if resolved.public != resolved.served else None,
        )
        req.max_tokens = max_tokens_of(parsed)
        if hashes_prompt:
            self._hash_prompt(req, parsed, resolved.seed)
        return req

    def _hash_prompt(self, req: RouteRequest, parsed: Mapping[str, Any], seed_key: str) -> None:
        try:
            precise = self.precise.get(self.home(req.cls, req.model))
            if precise is not None:
                token_ids = prompt_token_ids(precise.tokenizer, parsed)
                req.prompt_tokens = len(token_ids)
                req.block_tokens = precise.block_size()
                req.prefix = token_block_hashes(token_ids, req.block_tokens, lora_name=req.adapter)
                return
            seed = chain_seed(seed_key, parsed.get("cache_salt"))
            req.block_tokens = self.block_tokens
            given = token_prompt(parsed)
            if given is not None:
                # Token ids: exact length, blocks of the engine's own size; no text estimate.
                req.prompt_tokens = len(given)
                req.prefix = hash_token_blocks(given, seed, req.block_tokens)
                return
        except TokenPromptError as exc:
            raise ApiError(400, str(exc), "invalid_value", "prompt") from None
        text = prompt_text(parsed)
        req.prompt_tokens = estimate_tokens(text)
        req.prefix = hash_blocks(text, seed, self.block_chars)

    def _model(self, parsed: Mapping[str, Any]) -> Resolved:
        catalog = self.catalog
        model = parsed.get("model")
        known = catalog.known()
        if model is None:
            if len(known) == 1:
                return catalog.resolve(next(iter(known)))
            raise ApiError(400, "'model' is required", "missing_required_parameter", "model")
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string", "invalid_value", "model")
        if known and model not in known:
            raise ApiError(404, catalog.unknown_message(echo(model)), "model_not_found", "model")
        return catalog.resolve(model)
