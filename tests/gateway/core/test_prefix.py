from gateway.core.prefix import chain_seed, hash_blocks, prompt_text, render_messages


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
