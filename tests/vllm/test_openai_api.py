"""Both real engines answer the OpenAI calls the gateway relays, in the shapes it expects."""

from __future__ import annotations

import openai
import pytest

from tests.vllm.client import MODEL
from tests.vllm.conftest import VllmEngines

pytestmark = pytest.mark.vllm


@pytest.fixture(params=["interactive", "batch"])
def client(request: pytest.FixtureRequest, vllm_engines: VllmEngines) -> openai.OpenAI:
    engine = getattr(vllm_engines, request.param)
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_name(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]


def test_completion_reports_usage(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="def main():", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.object == "text_completion"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


def test_chat_stream_ends_with_a_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "import os"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "priority": 0},
        )
    )
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    # ChatML: "<|im_start|>user\nimport os<|im_end|>\n<|im_start|>assistant\n" is more than the text.
    assert chunks[-1].usage.prompt_tokens > 4


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_prompt_over_max_model_len_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[5] * 2100, max_tokens=1)
