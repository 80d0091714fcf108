"""Batch jobs on the default SQLite store: a gateway killed with SIGKILL mid-batch and started again
on the same data directory finishes the batch, losing and duplicating no line (as on Redis)."""

from __future__ import annotations

import signal

from tests.gateway.batch.support import chat_line, client_for, file_lines, start_stack, submit, wait_batch
from tests.gateway.batch.test_redis_replicas import wait_progress
from tests.support.procs import start_gateway


def test_a_gateway_killed_mid_batch_resumes_it_after_a_restart_losing_and_duplicating_nothing(procs, tmp_path):
    data_dir = tmp_path / "state"
    stack = start_stack(
        tmp_path, procs, store="sqlite", batch={"concurrency": 16, "lease_s": 2}, data_dir=str(data_dir)
    )
    victim = stack.gateways[0]
    client = client_for(victim)
    created = submit(client, [chat_line(i, max_tokens=100) for i in range(500)])
    wait_progress(client, created.id, 50)
    victim.kill(signal.SIGKILL)
    assert not victim.alive
    assert (data_dir / "gateway.db").exists()
    port = int(victim.url.rsplit(":", 1)[1])
    revived = start_gateway(tmp_path, stack.config, port=port)
    procs.append(revived)
    revived.wait_ready("/ready")
    batch = wait_batch(client, created.id, timeout=120)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 500, "completed": 500, "failed": 0}
    ids = [line["custom_id"] for line in file_lines(client, batch.output_file_id)]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(500)), "every line once"
    assert client.files.content(created.input_file_id).text.count("\n") >= 499, "the input file is kept too"
