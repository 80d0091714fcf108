"""``benchmarks/agent_sessions_client.py``: what a session's turns count as re-prefilled, and several
runs of every front folded into medians and ratios against the gateway's plain prefix routing."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import run_script
from tests.support.procs import ROOT


@pytest.fixture
def client(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import agent_sessions_client

    return agent_sessions_client


def _turn(session: str, turn: int, prompt: int, cached: int, output: int = 10, sent: float = 0.0) -> dict:
    return {
        "session": session,
        "turn": turn,
        "sent": sent,
        "status": 200,
        "ttft": 0.1 * turn,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": output,
        "done": sent + 1.0,
        "session_finished": True,
    }


def test_a_continuing_turn_counts_what_it_computed_again_of_the_context_it_resent(client):
    turns = [
        _turn("a", 1, 1000, 0, output=100),
        _turn("a", 2, 1600, 1100, sent=5.0),  # all 1,100 of the context it resent found cached
        _turn("b", 1, 500, 0, output=50),
        _turn("b", 2, 900, 200, sent=3.0),  # 550 known, 200 cached: 350 computed again
    ]
    summary = client.summarize(turns, 10.0)
    assert summary["continuing_turns"] == 2
    assert summary["reprefilled_tokens"] == 350
    assert summary["sessions_complete"] == 2 and summary["session_completion_p99_s"] == 6.0


def test_runs_of_each_front_fold_into_medians_and_ratios_against_plain_prefix_routing(tmp_path):
    def write(run: str, front: str, reprefilled: int, continuing: int, ttft_p99: float) -> None:
        folder = tmp_path / run / front
        folder.mkdir(parents=True)
        summary = {
            "sessions": 10,
            "sessions_complete": 8,
            "turns": 30,
            "continuing_turns": continuing,
            "reprefilled_tokens": reprefilled,
            "turn_ttft_p50_s": 0.2,
            "turn_ttft_p99_s": ttft_p99,
            "session_completion_p50_s": 40.0,
            "session_completion_p99_s": 80.0,
            "new_session_ttft_p99_s": ttft_p99,
            "output_tokens_per_s": 300.0,
        }
        (folder / "sessions.json").write_text(json.dumps({"summary": summary}))

    write("run-1", "ours-prefix", 8000, 20, 4.0)
    write("run-2", "ours-prefix", 12000, 20, 6.0)
    write("run-1", "vllmr-ch", 4000, 20, 9.0)
    write("run-2", "vllmr-ch", 6000, 20, 9.0)
    out = tmp_path / "out"
    run_script("agent_sessions_client.py", f"--overview {tmp_path / 'run-1'} {tmp_path / 'run-2'}", out)

    result = json.loads((out / "sessions.json").read_text())
    prefix = result["medians"]["ours-prefix"]
    assert prefix["runs"] == 2 and prefix["reprefilled_tokens"] == 10000 and prefix["turn_ttft_p99_s"] == 5.0
    assert prefix["reprefilled_per_continuing_turn"] == 500.0
    assert result["ratios_against_ours_prefix"]["vllmr-ch"]["reprefill_fewer_x"] == 2.0
    assert result["ratios_against_ours_prefix"]["vllmr-ch"]["new_session_ttft_p99_change"] == 1.8
    assert [r["run"] for r in result["runs"]["vllmr-ch"]] == ["run-1", "run-2"]
    assert (out / "sessions.png").stat().st_size > 0
