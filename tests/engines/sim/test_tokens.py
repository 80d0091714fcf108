from priority_gateway.engines.sim import tokens


def test_a_token_is_four_characters_of_the_rendered_prompt():
    assert tokens.count_tokens("abcd") == 1
    assert tokens.count_tokens("abcde") == 2
    assert tokens.count_tokens("") == 1
    text = tokens.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokens.count_tokens(text) == -(-len(text) // 4)


def test_chat_content_parts_render_as_their_text():
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}]
    assert tokens.render_chat([{"role": "user", "content": parts}]) == tokens.render_chat(
        [{"role": "user", "content": "ab"}]
    )


def test_block_hashes_cover_full_blocks_only_and_chain():
    block = 16 * 4
    a = "x" * block * 3 + "tail"
    b = "x" * block * 2 + "y" * block
    ha, hb = tokens.block_hashes_for_text(a, 16), tokens.block_hashes_for_text(b, 16)
    assert len(ha) == 3 and len(hb) == 3
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    # Equal block content at another position is another hash: the chain carries the prefix.
    assert len(set(ha)) == 3
    c = "z" + a[1:]
    assert not set(tokens.block_hashes_for_text(c, 16)) & set(ha)


def test_salt_separates_every_block():
    text = "q" * 64 * 4
    plain = tokens.block_hashes_for_text(text, 16)
    salted = tokens.block_hashes_for_text(text, 16, salt="tenant-a")
    assert not set(plain) & set(salted)
    assert salted == tokens.block_hashes_for_text(text, 16, salt="tenant-a")
    assert not set(salted) & set(tokens.block_hashes_for_text(text, 16, salt="tenant-b"))


def test_trace_hashes_share_exactly_the_shared_leading_ids():
    a = tokens.block_hashes_for_trace([1, 2, 3], 1500, trace_block_tokens=512, block_size=16)
    b = tokens.block_hashes_for_trace([1, 2, 9], 1500, trace_block_tokens=512, block_size=16)
    assert len(a) == 1500 // 16
    assert a[:64] == b[:64] and a[64] != b[64]
    assert tokens.block_hashes_for_trace([1, 2, 3], 1500, 512, 16) == a
    # Engine blocks that straddle two trace blocks depend on both.
    odd_a = tokens.block_hashes_for_trace([1, 2], 1024, trace_block_tokens=512, block_size=96)
    odd_b = tokens.block_hashes_for_trace([1, 3], 1024, trace_block_tokens=512, block_size=96)
    assert odd_a[:5] == odd_b[:5] and odd_a[5] != odd_b[5]


def test_replies_are_deterministic_words_with_a_bounded_natural_length():
    seed = tokens.prompt_seed("hello", 0)
    assert tokens.output_text(seed, 0, 5) == tokens.output_text(seed, 0, 2) + tokens.output_text(seed, 2, 3)
    assert tokens.output_text(seed, 0, 5) != tokens.output_text(tokens.prompt_seed("hello", 1), 0, 5)
    lengths = {tokens.natural_length(tokens.prompt_seed(str(i))) for i in range(200)}
    assert min(lengths) >= tokens.NATURAL_MIN and max(lengths) <= tokens.NATURAL_MAX
    assert len(lengths) > 50
