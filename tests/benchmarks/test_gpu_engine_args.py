"""The GPU harness starts each pool's engines with the pool profile's own arguments: what the device
runs is ``engines/profiles/<pool>.yaml``'s ``args`` with only the documented substitutions, each named
with its reason, and every flag one that vLLM 0.26 (on the device) defines."""

from __future__ import annotations

import json
import zipfile

import pytest

from tests.deploy.support import POOLS, flag_values, profile
from tests.support.procs import ROOT

GPU = ROOT / "benchmarks" / "gpu"


@pytest.fixture
def gpu(monkeypatch):
    """The lane's modules, imported as the device imports them (from their own folder)."""
    monkeypatch.syspath_prepend(str(GPU))
    import engine_args
    import harness

    return engine_args, harness


def rebuilt(launch) -> list[str]:
    """The profile's arguments, recovered from what the device runs by undoing each named substitution."""
    subs = {s.flag: s for s in launch.substitutions}
    device = list(launch.args)
    assert device[0] == subs["model"].device
    out = [subs["model"].shipped]
    added = {flag for flag, s in subs.items() if s.shipped is None}
    for flag, s in subs.items():
        if s.shipped is None:
            continue
        assert s.why, f"{flag}: a substitution without its reason"
    by_flag = flag_values(device)
    for arg in launch.shipped[1:]:
        flag, eq, _ = arg.partition("=")
        if flag in subs:
            s = subs[flag]
            if s.device is None:
                assert flag not in by_flag, f"{flag} dropped but still run"
            else:
                assert by_flag[flag] == s.device
            out.append(f"{flag}={s.shipped}" if eq else flag)
        else:
            assert arg in device, f"{arg} of the profile is not what the device runs"
            out.append(arg)
    extra = [a for a in device[1:] if a.partition("=")[0] not in {x.partition("=")[0] for x in launch.shipped}]
    assert {a.partition("=")[0] for a in extra} == added, "an argument added without a substitution naming it"
    return out


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("engines_on_gpu", [1, 4])
@pytest.mark.parametrize("graphs", [False, True])
def test_the_device_runs_the_profile_with_only_the_named_substitutions(gpu, pool, engines_on_gpu, graphs):
    engine_args, _ = gpu
    launch = engine_args.device_launch(
        pool, model_dir="/tmp/q7b", port=8101, engines_on_gpu=engines_on_gpu, graphs=graphs
    )
    assert launch.shipped == tuple(profile(pool)["args"])
    assert rebuilt(launch) == profile(pool)["args"]
    values = flag_values(list(launch.args))
    assert values["--port"] == "8101" and values["--host"] == "127.0.0.1"
    assert ("--enforce-eager" in values) is not graphs
    assert ("--kv-cache-memory-bytes" in values) is (engines_on_gpu > 1)
    # What the device does not force stays as shipped: the scheduler's limits above all.
    shipped = flag_values(profile(pool)["args"])
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--scheduling-policy", "--enable-prefix-caching"):
        assert values.get(flag) == shipped.get(flag), flag
    json.dumps(launch.record())  # recorded with every result


def test_every_flag_the_device_runs_is_one_vllm_026_defines(gpu):
    engine_args, _ = gpu
    known = engine_args.flags_026()
    assert known["vllm"] == "0.26.0"
    for pool in POOLS:
        launch = engine_args.device_launch(pool, model_dir="/m", port=8101, engines_on_gpu=4)
        assert set(flag_values(list(launch.args))) <= set(known["flags"])
    # The interactive profile's waiting-room bound is newer than 0.26: dropped, and said so.
    interactive = engine_args.device_launch("interactive", model_dir="/m", port=8101)
    dropped = {s.flag: s for s in interactive.substitutions if s.device is None}
    assert "--max-num-queued-reqs" not in known["flags"]
    assert dropped["--max-num-queued-reqs"].shipped == "4" and "0.26" in dropped["--max-num-queued-reqs"].why


def test_mtp_runs_as_its_nearest_equivalent_named_in_the_record(gpu):
    engine_args, _ = gpu
    launch = engine_args.device_launch("batch", model_dir="/m", port=8103, engines_on_gpu=4)
    spec = json.loads(launch.flag("--speculative-config"))
    shipped = json.loads(flag_values(profile("batch")["args"])["--speculative-config"])
    assert shipped["method"] == "mtp"
    assert spec["method"] == "ngram_gpu" and spec["num_speculative_tokens"] == shipped["num_speculative_tokens"]
    (sub,) = [s for s in launch.record()["substitutions"] if s["flag"] == "--speculative-config"]
    assert "ngram_gpu" in sub["device"] and "MTP" in sub["why"]


def test_an_experiment_may_drop_a_flag_and_says_why(gpu):
    """What the harness falls back to when the batch pool's speculative decoding does not start."""
    engine_args, _ = gpu
    why = "did not start"
    launch = engine_args.device_launch(
        "batch", model_dir="/m", port=8103, engines_on_gpu=4, experiment={"--speculative-config": (None, why)}
    )
    assert launch.flag("--speculative-config") is None
    (sub,) = [s for s in launch.substitutions if s.flag == "--speculative-config"]
    assert sub.device is None and sub.why == why and "mtp" in sub.shipped
    assert rebuilt(launch) == profile("batch")["args"]


def test_a_profile_flag_026_lacks_stops_the_harness_unless_a_rule_covers_it(gpu):
    engine_args, _ = gpu
    args = [*profile("interactive")["args"], "--max-num-waiting-prefills=2"]
    with pytest.raises(ValueError, match=r"--max-num-waiting-prefills is not a flag of vLLM 0\.26\.0"):
        engine_args.device_launch("interactive", model_dir="/m", port=8101, shipped=args)
    bad = [
        a if not a.startswith("--performance-mode") else "--performance-mode=fastest"
        for a in profile("interactive")["args"]
    ]
    with pytest.raises(ValueError, match="performance-mode=fastest"):
        engine_args.device_launch("interactive", model_dir="/m", port=8101, shipped=bad)


def test_the_budgets_plan_starts_the_pools_as_shipped(gpu):
    """The harness's own engine commands: the interactive pool's chunk budget is the manifest's 384
    (the harness ran 8192 for every engine before), the experiment's seat count is named."""
    engine_args, harness = gpu
    setup = harness.Setup(dry=False, gpus=1)
    (single,) = harness.SINGLE
    cmd, record = harness.engine_command(setup, single, 0, 1)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    values = flag_values(cmd[3:])
    assert values["--max-num-batched-tokens"] == flag_values(profile("interactive")["args"])["--max-num-batched-tokens"]
    assert values["--max-num-seqs"] == "256"
    (seats,) = [s for s in record["substitutions"] if s["flag"] == "--max-num-seqs"]
    assert seats["shipped"] == "4" and "experiment" in seats["why"]
    fleet = [harness.engine_command(setup, spec, i, 4) for i, spec in enumerate(harness.SHIPPED_FLEET)]
    assert [r["pool"] for _, r in fleet] == ["interactive", "interactive", "batch", "batch"]
    for (cmd, record), spec in zip(fleet, harness.SHIPPED_FLEET, strict=True):
        launch = engine_args.device_launch(spec.pool, model_dir=str(harness.WORK / "q7b"), port=0, engines_on_gpu=4)
        assert flag_values(cmd[3:])["--max-num-seqs"] == launch.flag("--max-num-seqs")
        assert record["shipped_args"] == profile(spec.pool)["args"]


def test_the_sessions_tier_plan_gives_every_engine_a_cpu_tier_vllm_026_takes(gpu):
    """Its engines are the sessions plan's (the interactive profile, a small KV cache) plus vLLM's native
    offloading at 4x that cache, named as experiment flags; the dry run's simulator gets the same tier."""
    _, harness = gpu
    setup = harness.Setup(dry=False, gpus=1, kv_cache_bytes=harness.SESSIONS_KV_BYTES)
    steps = harness.plan_steps(setup, "sessions-tier")
    assert [s.name for s in steps] == [f"sessions-tier {front}" for front in harness.SESSION_FRONTS]
    layout = steps[0].layout
    assert [spec.pool for spec in layout] == ["interactive"] * 4
    cmd, record = harness.engine_command(setup, layout[0], 0, 4)  # check_026 passes inside
    values = flag_values(cmd[3:])
    assert values["--kv-offloading-size"] == "8" and values["--kv-offloading-backend"] == "native"
    assert int(values["--kv-cache-memory-bytes"]) == harness.SESSIONS_KV_BYTES
    added = {s["flag"]: s for s in record["substitutions"] if s["shipped"] is None}
    assert "sessions-tier" in added["--kv-offloading-size"]["why"]
    plain = harness.plan_steps(setup, "sessions")[0].layout[0]
    assert "--kv-offloading-size" not in flag_values(harness.engine_command(setup, plain, 0, 4)[0][3:])
    dry = harness.dry_setup(4, 0.15, "h200-7b-bf16")
    sim_args = harness.engine_command(dry, layout[0], 0, 4)[0][3:]
    assert sim_args[sim_args.index("--kv-offloading-size") + 1] == "8"


@pytest.mark.usefixtures("gpu")  # vllm_flags is imported from the lane's folder
def test_the_flag_list_is_read_from_the_wheels_parser(tmp_path):
    """``vllm_flags.py`` on a wheel of a few lines: explicit flags, their --no- forms, the frontend's
    fields and the values a Literal alias allows."""
    import vllm_flags

    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm-9.9.9.dist-info/METADATA", "Name: vllm\n")
        z.writestr("vllm/engine/arg_utils.py", 'def f(g):\n    g.add_argument("--max-num-seqs", type=int)\n')
        z.writestr(
            "vllm/entrypoints/openai/cli_args.py",
            "class FrontendArgs:\n    enable_prompt_tokens_details: bool = False\n",
        )
        z.writestr("vllm/config/vllm.py", 'from typing import Literal\nPerformanceMode = Literal["a", "b"]\n')
    data = vllm_flags.read_wheel(wheel)
    assert data["vllm"] == "9.9.9"
    assert {"--max-num-seqs", "--enable-prompt-tokens-details", "--no-max-num-seqs"} <= set(data["flags"])
    assert "--max-num-queued-reqs" not in data["flags"]
    assert data["choices"] == {"--performance-mode": ["a", "b"]}


def test_a_cache_reset_empties_the_cpu_tier_too_and_waits_for_held_blocks(gpu):
    # vLLM keeps its KV connector's CPU tier through a plain /reset_prefix_cache, and answers success false
    # while blocks are held: fronts measured one after another would find each other's blocks.
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    _, harness = gpu
    seen: list[str] = []
    answers = iter([b'{"success": false}', b'{"success": false}', b'{"success": true}'])

    class Engine(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.path)
            body = next(answers, b'{"success": false}')
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert harness.reset_caches([url], pause_s=0.01) == [200]
        assert seen == ["/reset_prefix_cache?reset_external=true"] * 3
        assert harness.reset_caches([url], tries=2, pause_s=0.01) == [409]  # held throughout: reported
    finally:
        server.shutdown()
        server.server_close()


def test_a_wait_sent_right_after_a_launch_follows_the_new_plan(gpu, monkeypatch, tmp_path):
    # The last plan's done mark, still there when the next plan's process has not yet started: a wait sent at
    # once ended at the mark, and the device was given back while the new plan ran.
    _, harness = gpu
    for name, path in (("WORK", tmp_path), ("PLAN_LOG", tmp_path / "plan.log"), ("DONE", tmp_path / "plan.done")):
        monkeypatch.setattr(harness, name, path)
    harness.DONE.write_text("done\n")
    started: list[list[str]] = []
    monkeypatch.setattr(harness.subprocess, "Popen", lambda args, **_: started.append(args))
    harness.launch(harness.Setup(dry=False, gpus=1), "budgets-pairs", 60.0)
    assert started and "budgets-pairs" in started[0]
    assert not harness.DONE.exists()
