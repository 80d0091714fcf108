"""Lines the gateway cannot place yet wait and come back; they are never failed for it."""

from __future__ import annotations

import pytest

from priority_gateway.config import ConfigError, parse_config
from tests.gateway.batch.support import chat_line, client_for, submit, wait_batch
from tests.support.observe import metric, wait_for
from tests.support.procs import free_port, start_engine, start_gateway


def test_lines_refused_for_want_of_an_engine_are_retried_until_one_is_up(procs, tmp_path):
    interactive = start_engine(tmp_path, "--token-delay-ms", "1")
    procs.append(interactive)
    interactive.wait_ready()
    batch_port = free_port()
    config = {
        "pools": {
            "interactive": {"engines": [interactive.url], "backfill": False},
            "batch": {"engines": [f"http://127.0.0.1:{batch_port}"], "scheduling_policy": "priority"},
        },
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
        "batch": {"poll_s": 0.1, "retry_base_s": 0.2, "retry_max_s": 0.5},
    }
    gateway = start_gateway(tmp_path, config)
    procs.append(gateway)
    gateway.wait_ready("/health")
    client = client_for(gateway)
    created = submit(client, [chat_line(i) for i in range(10)])
    retried = wait_for(lambda: metric(gateway.url, "gateway_batch_requests_total", status="retried") >= 10, timeout=20)
    assert retried, "lines were not retried"
    waiting = client.batches.retrieve(created.id)
    assert waiting.status == "in_progress" and waiting.request_counts.failed == 0
    engine = start_engine(tmp_path, "--token-delay-ms", "1", "--scheduling-policy", "priority", port=batch_port)
    procs.append(engine)
    batch = wait_batch(client, created.id, timeout=30)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 10, "completed": 10, "failed": 0}


@pytest.mark.parametrize(
    ("section", "bad", "word"),
    [
        ("batch", {"concurency": 8}, "concurency"),
        ("batch", {"concurrency": -1}, "concurrency"),
        ("batch", {"lease_s": "soon"}, "lease_s"),
        ("keys", {"admn": "x"}, "admn"),
        ("keys", {"required": "sometimes"}, "required"),
    ],
)
def test_the_batch_and_keys_sections_are_checked(section, bad, word):
    pools = {"interactive": {"engines": ["http://127.0.0.1:1"]}}
    assert parse_config({"pools": pools, "batch": {"concurrency": 8}}).batch.concurrency == 8
    with pytest.raises(ConfigError, match=word):
        parse_config({"pools": pools, section: bad})
