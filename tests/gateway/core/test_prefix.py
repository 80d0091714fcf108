import pytest

from priority_gateway.core.prefix import (
    TokenPromptError,
    chain_seed,
    hash_blocks,
    hash_token_blocks,
    prompt_text,
    render_messages,
    token_prompt,
)


def test_shared_leading_text_gives_shared_leading_hashes():
    seed = chain_seed("m")
    a = hash_blocks("S" * 640 + "user one asks something long enough" * 4, seed)
    b = hash_blocks("S" * 640 + "user two asks something else entirely" * 4, seed)
    assert a[:10] == b[:10]
    assert a[10] != b[10]


def test_chain_means_equal_hash_implies_equal_prefix():
    seed = chain_seed("m")
    a = hash_blocks("x" * 64 + "y" * 64, seed)
    b = hash_blocks("z" * 64 + "y" * 64, seed)
    assert a[1] != b[1]


def test_model_and_salt_separate_caches():
    text = "t" * 256
    assert hash_blocks(text, chain_seed("m")) != hash_blocks(text, chain_seed("other"))
    assert hash_blocks(text, chain_seed("m", "tenant-a")) != hash_blocks(text, chain_seed("m", "tenant-b"))


def test_only_full_blocks_and_a_cap():
    seed = chain_seed("m")
    assert hash_blocks("a" * 63, seed) == []
    assert len(hash_blocks("a" * 130, seed)) == 2
    assert len(hash_blocks("a" * 64 * 1000, seed, max_blocks=256)) == 256


def test_chat_rendering_is_canonical():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    assert render_messages(messages) == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert prompt_text({"messages": messages}) == render_messages(messages)
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["first", "second"]}) == "first"


def test_token_prompts_hash_by_token_blocks_not_as_text():
    seed = chain_seed("m")
    shared = list(range(100, 100 + 64))
    a = token_prompt({"prompt": shared + [7] * 16})
    b = token_prompt({"prompt": [shared + [9] * 16, [1, 2]]})  # a batch routes on its first prompt
    assert a is not None and b is not None
    ha, hb = hash_token_blocks(a, seed, 16), hash_token_blocks(b, seed, 16)
    assert len(ha) == len(hb) == 5  # 80 ids: five full blocks of 16, nothing estimated from characters
    assert ha[:4] == hb[:4]
    assert ha[4] != hb[4]
    assert hash_token_blocks(a, chain_seed("m", "tenant"), 16) != ha
    assert hash_token_blocks(a[:15], seed, 16) == []
    assert len(hash_token_blocks(list(range(16 * 300)), seed, 16, max_blocks=256)) == 256


def test_token_blocks_do_not_collide_with_the_text_of_the_ids():
    seed = chain_seed("m")
    ids = list(range(1000, 1064))
    assert hash_token_blocks(ids, seed, 16)[0] not in hash_blocks(" ".join(map(str, ids)), seed)


def test_text_and_chat_prompts_are_not_token_prompts():
    assert token_prompt({"prompt": "abc"}) is None
    assert token_prompt({"prompt": ["abc", "def"]}) is None
    assert token_prompt({"messages": [{"role": "user", "content": "x"}], "prompt": [1, 2]}) is None
    assert token_prompt({"prompt": []}) is None
    assert token_prompt({"prompt": [5]}) == [5]


@pytest.mark.parametrize("prompt", [[1, -1], [1, 2**32], [1, "2"], [True, 2], [[1, 2.5]], [1, None]])
def test_invalid_token_ids_are_refused(prompt):
    with pytest.raises(TokenPromptError):
        token_prompt({"prompt": prompt})


def test_a_responses_conversation_shares_blocks_turn_after_turn_and_with_chat():
    seed = chain_seed("m")
    question = "Tell me about the tides and the moon, at length please. " * 3
    first = {"instructions": "Be brief.", "input": question}
    second = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": question}]},
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "They pull."}]},
            {"type": "function_call", "name": "lookup", "arguments": '{"q": "sun"}'},
            {"type": "function_call_output", "output": "hot"},
            {"role": "user", "content": "And the sun?"},
        ],
    }
    one, two = hash_blocks(prompt_text(first), seed), hash_blocks(prompt_text(second), seed)
    assert one and two[: len(one)] == one
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": question},
        {"role": "assistant", "content": "They pull."},
        {"role": "assistant", "content": 'lookup({"q": "sun"})'},
        {"role": "tool", "content": "hot"},
        {"role": "user", "content": "And the sun?"},
    ]
    assert prompt_text(second) == prompt_text({"messages": chat})
