"""From a request's parsed body to what the core routes on: its model, prompt length and prefix.

Rules:
- The model must be one the pools serve (a 404 names them); without ``model``, the only one served.
- The prefix is hashed the way the home pool's engines will see the prompt: token blocks of the
  engines' own size in precise mode (the pool's tokenizer), blocks of token ids for a completions
  prompt given as ids, else ``prefix.block_chars`` characters of the text as rendered.
- Request ids here are the gateway's own: a client's ``x-request-id`` is echoed, but need not be unique.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from gateway.core.classes import Budget
from gateway.core.precise import token_block_hashes
from gateway.core.prefix import (
    TokenPromptError,
    chain_seed,
    estimate_tokens,
    hash_blocks,
    hash_token_blocks,
    prompt_text,
    token_prompt,
)
from gateway.core.request import RouteRequest
from gateway.errors import ApiError
from gateway.http.body import echo, max_tokens_of
from gateway.tokenizers import PromptTokenizer, prompt_token_ids


class PrecisePrompts(Protocol):
    """A pool in precise prefix mode: the engines' tokenizer and KV block size."""

    tokenizer: PromptTokenizer

    def block_size(self) -> int: ...


class Placement:
    def __init__(
        self,
        home: Callable[[str], str],
        models: Callable[[], Collection[str]],
        precise: Mapping[str, PrecisePrompts],
        block_chars: int,
        block_tokens: int,
    ) -> None:
        self.home = home
        self.models = models
        self.precise = precise
        self.block_chars = block_chars
        self.block_tokens = block_tokens
        self._ids = (f"r{n}" for n in itertools.count())

    def route_request(
        self,
        parsed: Mapping[str, Any],
        hashes_prompt: bool,
        cls: str,
        budget: Budget,
        session: str | None,
        arrival: float,
    ) -> RouteRequest:
        model = self._model(parsed)
        req = RouteRequest(
            next(self._ids),
            cls,
            model,
            arrival,
            budget=budget,
            session=session,
            restartable=parsed.get("stream") is not True,
        )
        req.max_tokens = max_tokens_of(parsed)
        if hashes_prompt:
            self._hash_prompt(req, parsed)
        return req

    def _hash_prompt(self, req: RouteRequest, parsed: Mapping[str, Any]) -> None:
        try:
            precise = self.precise.get(self.home(req.cls))
            if precise is not None:
                token_ids = prompt_token_ids(precise.tokenizer, parsed)
                req.prompt_tokens = len(token_ids)
                req.block_tokens = precise.block_size()
                req.prefix = token_block_hashes(token_ids, req.block_tokens)
                return
            seed = chain_seed(req.model, parsed.get("cache_salt"))
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

    def _model(self, parsed: Mapping[str, Any]) -> str:
        model = parsed.get("model")
        known = self.models()
        if model is None:
            if len(known) == 1:
                return next(iter(known))
            raise ApiError(400, "'model' is required", "missing_required_parameter", "model")
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string", "invalid_value", "model")
        if known and model not in known:
            raise ApiError(
                404,
                f"The model '{echo(model)}' does not exist; served: {', '.join(sorted(known))}",
                "model_not_found",
                "model",
            )
        return model
