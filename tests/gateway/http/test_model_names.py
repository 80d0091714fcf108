import orjson

from priority_gateway.http.model_names import ModelNames, with_model


def test_the_served_name_becomes_the_public_one_only_as_models_value():
    names = ModelNames("chat", "llama")
    answer = b'{"id":"x","model":"llama","choices":[{"text":"llama says \\"model\\":\\"llama\\""}]}'
    restored = orjson.loads(names.restore(answer))
    assert restored["model"] == "chat"
    assert restored["choices"][0]["text"] == 'llama says "model":"llama"'


def test_a_longer_name_with_the_served_one_as_prefix_is_left_alone():
    names = ModelNames("chat", "llama")
    assert names.restore(b'{"model":"llama-2"}') == b'{"model":"llama-2"}'


def test_spaced_json_and_stream_events_are_restored():
    names = ModelNames("chat", "llama")
    assert names.restore(b'data: {"model": "llama"}\n\n') == b'data: {"model": "chat"}\n\n'


def test_the_engine_gets_the_served_name_and_everything_else_unchanged():
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "x": [1, 2.5]}
    assert orjson.loads(with_model(body, "llama")) == {**body, "model": "llama"}
    assert body["model"] == "chat"


def test_a_stream_cut_anywhere_is_restored_as_if_whole():
    names = ModelNames("chat", "llama")
    stream = b"".join(
        b'data: {"id":"c","model":"llama","choices":[{"delta":{"content":"%d"}}]}\n\n' % i for i in range(3)
    )
    whole = names.restore(stream)
    for cut in range(1, len(stream)):
        for second in range(cut, len(stream), 7):
            parts = [stream[:cut], stream[cut:second], stream[second:]]
            held, out = b"", []
            for part in parts:
                sent, held = names.restore_stream(held + part)
                out.append(sent)
            assert b"".join(out) + held == whole
            assert len(held) < len(b'"model": "llama"')
