"""Real vLLM engines on the lent GPU, the gateway and ``vllm-router`` in front, one plan of runs.

Rules:
- The device keeps nothing between sessions and only ~30 s between calls, so the whole plan runs
  in the background (its own process session) and outlives the call that started it; each call
  only follows it (``wait``) and brings back one archive of everything written so far
  (``$OUT/gpu-results.tgz``). The next call picks up where the last one stopped.
- Each step names the engines it needs (a layout: one ``EngineSpec`` per engine, 7B-shaped vLLM
  engines with dummy weights sharing the GPUs round robin). A pool's engines run that pool's profile
  (``engines/profiles/<pool>.yaml``) with only what the device forces replaced (``engine_args.py``);
  the earlier sittings' plans keep their bench engine (``calibration``). Engines start when a step
  needs a layout that is not running (the old ones stopped first) and serve every step after it
  that needs the same; between runs only the front (gateway or router) restarts and every
  engine's prefix cache is reset (``POST /reset_prefix_cache``, which ``VLLM_SERVER_DEV_MODE=1``
  enables), so each run starts cold.
- Every run writes its own folder: its results (``gateway bench``'s, or the script's), the engines'
  ``/metrics`` before and after, the front's log, the command lines, and ``engines.json``: the commit
  and every engine's arguments as started, with the substitutions made for the device.
- The plan runs in priority order against a budget: a step that would not end in time (counting
  the engines it must start) is skipped and says so, as is one that cannot run here and one whose
  engines did not start (``skipped.json``), so what ran is always packed.
- ``--dry`` runs the same plan here on simulated engines (``priority_gateway.engines.sim``), with durations scaled
  down, to check it before device time is spent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import engine_args
from fronts import front_kind

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the bundle's root: the package is not installed

from priority_gateway.bench import envelope

HERE = Path(__file__).resolve().parent
PROJ = HERE.parents[1]
WORK = Path(os.environ.get("GPU_WORK", "/tmp/gpu"))
RES = WORK / "res"
PLAN_LOG = WORK / "plan.log"
DONE = WORK / "plan.done"
MODEL = "llama7b"
ENGINE_PORT = 8101
FRONT_PORT = 8200
DEADLINE = WORK / "deadline"
# The trace travels with the checkout the device copies; the project copy need not carry it again.
MOONCAKE = Path(os.environ.get("GPU_MOONCAKE", PROJ / "benchmarks/traces/mooncake/conversation_trace.jsonl"))
TRACES = Path(os.environ.get("GPU_TRACES", PROJ / "benchmarks/traces"))

# A 7B dense decoder (Qwen2.5-7B's shape: hidden 3584, 28 layers, 28 query / 4 KV heads of 128,
# vocabulary cut to the 32k tokenizer the bundle carries), bf16, random weights (--load-format dummy).
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}
# The earlier sittings' bench engines (routing, calibration, mixed steps, relay, fleet; their results
# are committed under benchmarks/results/gpu): not a pool of ours, but what those plans keep running
# so that a rerun compares with them. The plans of the pools (budgets, fleet-itl) run the profiles'
# own arguments (engine_args.py).
CALIBRATION_ARGS = [
    "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "131072",
    "--gpu-memory-utilization", "0.22", "--kv-cache-memory-bytes", str(engine_args.KV_CACHE_BYTES),
    "--max-num-seqs", "128", "--max-num-batched-tokens", "8192", "--block-size", "16",
    "--enable-prefix-caching", "--enable-prompt-tokens-details",
]  # fmt: skip
CALIBRATION = "calibration"
DEVICE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not carried
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}
# vllm-router's cache_aware, tuned as its load-balancing guide shows (match threshold 0.5, balance
# once 32 requests apart and 1.1x), with each worker's tree sized to what that engine's KV cache
# holds: about 220k tokens at ~6 characters per token id written as text.
TUNED_CACHE_AWARE = [
    "--cache-threshold", "0.5", "--balance-abs-threshold", "32", "--balance-rel-threshold", "1.1",
    "--max-tree-size", "1300000", "--eviction-interval-secs", "30",
]  # fmt: skip


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def http(url: str, method: str = "GET", timeout: float = 5.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError):
        return 0, b""


def wait_until(url: str, seconds: float, alive: Callable[[], bool] = lambda: True) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if http(url, timeout=2)[0] == 200:
            return True
        if not alive():
            return False
        time.sleep(1.0)
    return False


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


# -- the device or this machine -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine of a layout: the pool profile it runs (or ``calibration``, the earlier sittings' bench
    engine) and the experiment's own flags, each ``(flag, value, why)``."""

    pool: str
    experiment: tuple[tuple[str, str | None, str], ...] = ()
    """A value None drops the profile's flag."""


Layout = tuple[EngineSpec, ...]


@dataclass
class Setup:
    dry: bool
    engines: int = 4
    """Engines of the calibration plans (full, repeat, mixed, fleet); the pool plans give layouts."""
    gpus: int = 1
    time_scale: float = 1.0
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    router_cmd: list[str] = field(default_factory=list)
    sim_profile: str = "h200-32b-fp8"
    graphs: bool = False
    """Real engines with CUDA graphs (no ``--enforce-eager``)."""
    rate_scale: float = 1.0
    """Dry runs: the budgets plan's offered rates times this (the simulated engines share this machine)."""
    layout: Layout = ()
    """The engines running now."""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    launches: list[dict] = field(default_factory=list)
    """What each running engine was started with (``engine_args.EngineLaunch.record``), its URL and KV cache."""
    state: dict = field(default_factory=dict)
    """What a plan's steps tell later ones (the capacity measured, the best cap)."""
    kv_cache_bytes: int = 0
    """KV cache per engine (0: ``KV_CACHE_BYTES``); the sessions plan makes it small so sessions contend."""

    @property
    def urls(self) -> list[str]:
        count = len(self.layout) or self.engines
        return [f"http://127.0.0.1:{ENGINE_PORT + i}" for i in range(count)]

    def seconds(self, s: float) -> float:
        return max(2.0, s * self.time_scale)


def device_setup(engines: int) -> Setup:
    site = WORK / "vlsite"
    paths = [str(PROJ), str(WORK / "gwsite"), str(WORK / "router")]
    shadow = site / "shadow"
    for name in ("protobuf", "typing_extensions", "anyio"):
        if (shadow / name).is_dir() and not _new_enough(name):
            paths.append(str(shadow / name))
    paths.append(str(site / "site"))
    env = {**os.environ, **DEVICE_ENV, "PYTHONPATH": ":".join(paths)}
    gpus = int(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU "))
    router = [sys.executable, "-c", "import sys; from vllm_router.launch_router import main; sys.exit(main())"]
    return Setup(dry=False, engines=engines, gpus=max(1, gpus), env=env, router_cmd=router)


def _new_enough(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    need = {"protobuf": (6, 33, 5), "typing_extensions": (4, 16, 0), "anyio": (4, 10, 0)}[name]
    try:
        have = tuple(int(x) for x in version(name).split(".")[:3] if x.isdigit())
    except PackageNotFoundError:
        return False
    return have >= need


def dry_setup(engines: int, time_scale: float, profile: str) -> Setup:
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(PROJ), "PYTHONUNBUFFERED": "1"}
    router = os.environ.get("ROUTER_BIN") or shutil.which("vllm-router") or "vllm-router"
    return Setup(dry=True, engines=engines, time_scale=time_scale, env=env, router_cmd=[router], sim_profile=profile)


# -- engines --------------------------------------------------------------------------------------


def model_dir() -> Path:
    path = WORK / "q7b"
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        for item in (WORK / "vlsite" / "tok").iterdir():
            shutil.copy(item, path)
        (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
        (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return path


def calibration_layout(engines: int) -> Layout:
    return (EngineSpec(CALIBRATION),) * engines


def engine_command(setup: Setup, spec: EngineSpec, index: int, count: int) -> tuple[list[str], dict]:
    """The command that starts engine ``index`` of ``count``, and what it is (recorded with every result)."""
    port = ENGINE_PORT + index
    if spec.pool == CALIBRATION:
        record = {"pool": CALIBRATION, "note": "the earlier sittings' bench engine (CALIBRATION_ARGS), not a pool"}
        if setup.dry:
            cmd = [setup.python, "-m", "priority_gateway.engines.sim", "--port", str(port), "--model", MODEL]
            return [*cmd, "--profile", setup.sim_profile, "--enable-prompt-tokens-details"], record
        cmd = [setup.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(WORK / "q7b")]
        cmd += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), *CALIBRATION_ARGS]
        return cmd, {**record, "device_args": cmd[3:]}
    experiment = {flag: (value, why) for flag, value, why in spec.experiment}
    if setup.kv_cache_bytes:
        why = "the sessions plan: a small KV cache per engine, so that agent sessions contend for it"
        experiment["--kv-cache-memory-bytes"] = (str(setup.kv_cache_bytes), why)
    launch = engine_args.device_launch(
        spec.pool,
        model_dir=str(WORK / "q7b"),
        port=port,
        engines_on_gpu=max(1, count // max(1, setup.gpus)),
        graphs=setup.graphs,
        experiment=experiment,
    )
    record = launch.record()
    if setup.dry:
        sim = engine_args.sim_args(launch, port, setup.sim_profile)
        record["dry"] = {"simulator_args": sim, "note": "dry run: the simulator stands in with the device's limits"}
        return [setup.python, "-m", "priority_gateway.engines.sim", *sim], record
    return [setup.python, "-m", "vllm.entrypoints.openai.api_server", *launch.args], record


ENGINES_FILE = WORK / "engines.json"
_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


def start_engines(setup: Setup, layout: Layout | None = None) -> None:
    """Start ``layout`` (default: the calibration plans' engines), each with its pool's arguments."""
    layout = layout or calibration_layout(setup.engines)
    logs = RES / "engines"
    logs.mkdir(parents=True, exist_ok=True)
    setup.layout, setup.procs, setup.launches = layout, [], []
    began = time.monotonic()
    if not setup.dry:
        model_dir()
    generation = len(list(logs.glob("layout-*.json"))) + 1
    for i, (url, spec) in enumerate(zip(setup.urls, layout, strict=True)):
        env = dict(setup.env)
        if not setup.dry:
            env["CUDA_VISIBLE_DEVICES"] = str(i % setup.gpus)
        cmd, record = engine_command(setup, spec, i, len(layout))
        name = f"engine{i + 1}" if generation == 1 else f"engine{i + 1}-layout{generation}"
        (logs / f"{name}.cmd").write_text(" ".join(cmd) + "\n")
        out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - the engine outlives this call
        setup.procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        setup.launches.append({"url": url, "log": f"engines/{name}.log", **record})
        log(f"engine {i + 1} ({spec.pool}) starting on {url}")
        if not setup.dry and i + 1 < len(layout):
            time.sleep(8)  # staggered: profiling runs one at a time
    for i, (url, proc) in enumerate(zip(setup.urls, setup.procs, strict=True)):
        if not wait_until(url + "/health", 420, lambda p=proc: p.poll() is None):
            tail = (RES / setup.launches[i]["log"]).read_text(errors="replace")[-4000:]
            raise RuntimeError(f"engine {i + 1} did not come up:\n{tail}")
    for launch in setup.launches:
        found = _KV_TOKENS.findall((RES / launch["log"]).read_text(errors="replace"))
        launch["kv_cache_tokens"] = int(found[-1].replace(",", "")) if found else None
    up_s = round(time.monotonic() - began, 1)
    record = {"layout": [spec.pool for spec in layout], "healthy_after_s": up_s, "engines": setup.launches}
    (logs / f"layout-{generation}.json").write_text(json.dumps(record, indent=1))
    (RES / "engines.json").write_text(json.dumps(record, indent=1))
    pgids = [proc.pid for proc in setup.procs]
    ENGINES_FILE.write_text(json.dumps({**record, "layout": _layout_key(layout), "pgids": pgids}))
    log(f"{len(setup.procs)} engines healthy after {up_s:.0f} s")


def _layout_key(layout: Layout) -> list:
    return [[spec.pool, [list(x) for x in spec.experiment]] for spec in layout]


def adopt_engines(setup: Setup) -> bool:
    """Engines a previous plan process started on this (warm) machine, still healthy: take them over."""
    try:
        known = json.loads(ENGINES_FILE.read_text())
    except (OSError, ValueError):
        return False
    layout = tuple(EngineSpec(pool, tuple(tuple(x) for x in exp)) for pool, exp in known["layout"])
    setup.layout, setup.launches = layout, known["engines"]
    if engines_up(setup):
        log(f"engines of an earlier plan taken over: {[s.pool for s in layout]}")
        return True
    setup.layout, setup.launches = (), []
    return False


def stop_engines(setup: Setup) -> None:
    """Stop the engines running now (started here, or taken over) and wait for the GPU to be free."""
    for proc in setup.procs:
        stop(proc)  # ours: SIGTERM to the group, then SIGKILL, and reaped
    if not setup.procs:  # an earlier plan process's: not our children, only their process groups
        try:
            pgids = json.loads(ENGINES_FILE.read_text())["pgids"]
        except (OSError, ValueError, KeyError):
            pgids = []
        for pgid in pgids:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, sig)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and _group_alive(pgid):
                    time.sleep(0.5)
                if not _group_alive(pgid):
                    break
    ENGINES_FILE.unlink(missing_ok=True)
    setup.layout, setup.procs, setup.launches = (), [], []
    if not setup.dry:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _gpu_memory_used_mib() > 2048:
            time.sleep(1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _gpu_memory_used_mib() -> float:
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    try:
        return max(float(x) for x in done.stdout.split())
    except ValueError:
        return 0.0


SPECULATIVE_FALLBACK_WHY = (
    "the batch pool's engines did not start with ngram_gpu speculative decoding on the device (the "
    "first attempt's log tail is in engines/): they run without speculative decoding"
)


def use_engines(setup: Setup, layout: Layout) -> None:
    """Make ``layout`` the engines running: nothing to do when it already is (or its stand-in does),
    else stop and start. A layout whose speculative decoding does not start (MTP's stand-in, never run
    on the device before) is started once more without it, and that stands in for it from then on."""
    wanted = setup.state.get("stand_in", {}).get(layout, layout)
    if setup.layout == wanted and engines_up(setup):
        return
    if setup.layout or ENGINES_FILE.exists():
        log(f"engines: {[s.pool for s in setup.layout]} -> {[s.pool for s in wanted]}")
        stop_engines(setup)
    try:
        start_engines(setup, wanted)
    except RuntimeError as exc:
        speculative = [i for i, spec in enumerate(wanted) if "--speculative-config" in _flags_of(setup, spec)]
        if not speculative or wanted is not layout:
            raise
        log(f"engines did not start ({str(exc)[-300:]!r}); again without speculative decoding")
        stop_engines(setup)
        plain = list(wanted)
        for i in speculative:
            plain[i] = EngineSpec(
                wanted[i].pool, (*wanted[i].experiment, ("--speculative-config", None, SPECULATIVE_FALLBACK_WHY))
            )  # type: ignore[arg-type]
        wanted = tuple(plain)
        setup.state.setdefault("stand_in", {})[layout] = wanted
        start_engines(setup, wanted)
    warm_up(setup)


def _flags_of(setup: Setup, spec: EngineSpec) -> dict[str, str]:
    if spec.pool == CALIBRATION:
        return {}
    experiment = {flag: (value, why) for flag, value, why in spec.experiment}
    if setup.kv_cache_bytes:
        why = "the sessions plan: a small KV cache per engine, so that agent sessions contend for it"
        experiment["--kv-cache-memory-bytes"] = (str(setup.kv_cache_bytes), why)
    launch = engine_args.device_launch(spec.pool, model_dir="/m", port=0, engines_on_gpu=4, experiment=experiment)
    return engine_args.flag_values(list(launch.args))


def engine_start_s(setup: Setup, layout: Layout) -> float:
    """What starting ``layout`` costs, for the plan's budget (an engine alone was healthy after 88-97 s)."""
    if setup.dry:
        return 10.0
    return 110.0 + 10.0 * (len(layout) - 1)


def engines_up(setup: Setup) -> bool:
    return all(http(url + "/health")[0] == 200 for url in setup.urls)


def reset_caches(urls: list[str], tries: int = 10, pause_s: float = 1.0) -> list[int]:
    """Empty every engine's prefix cache and its KV connector's (the CPU tier of ``--kv-offloading-size``,
    which a plain reset keeps: fronts run one after another would find each other's blocks there); vLLM
    answers ``success: false`` while blocks are held (a request or an offload still running), so try again.
    Each engine's status: 200 once a reset succeeded."""
    codes = []
    for url in urls:
        code = 0
        for _ in range(tries):
            code, body = http(url + "/reset_prefix_cache?reset_external=true", "POST", timeout=30)
            try:
                done = code != 200 or json.loads(body or b"{}").get("success", True) is not False
            except ValueError:
                done = True
            if done:
                break
            code = 409
            time.sleep(pause_s)
        if code != 200:
            log(f"prefix cache of {url} not reset: {code}")
        codes.append(code)
    return codes


def save_metrics(urls: list[str], folder: Path, tag: str) -> None:
    for i, url in enumerate(urls):
        status, body = http(url + "/metrics", timeout=10)
        if status == 200:
            (folder / f"metrics-{tag}-engine{i + 1}.txt").write_bytes(body)


def warm_up(setup: Setup) -> None:
    """First requests on an eager engine pay one-off kernel setup; pay it before measuring."""

    def one(url: str) -> None:
        for length in (64, 1024, 8192):
            body = {"model": MODEL, "prompt": [100 + (7 * i) % 30000 for i in range(length)], "max_tokens": 8}
            request = urllib.request.Request(
                url + "/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()

    threads = [threading.Thread(target=one, args=(url,)) for url in setup.urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reset_caches(setup.urls)
    log("engines warmed up")


# -- fronts ---------------------------------------------------------------------------------------

_prometheus_port = 29100


def start_front(setup: Setup, name: str, urls: list[str], folder: Path, config: dict | None = None) -> subprocess.Popen:
    """``ours-<policy>`` (the gateway), ``vllmr-<policy>`` (vllm-router), ``gateway-config`` (given)."""
    global _prometheus_port
    if name.startswith("vllmr-"):
        policies = {"ca": "cache_aware", "ca-tuned": "cache_aware", "rr": "round_robin", "ch": "consistent_hash"}
        policy = policies[name.removeprefix("vllmr-")]
        _prometheus_port += 1
        cmd = [*setup.router_cmd, "--host", "127.0.0.1", "--port", str(FRONT_PORT), "--worker-urls", *urls]
        cmd += ["--policy", policy, "--log-level", "warning", "--prometheus-port", str(_prometheus_port)]
        if name == "vllmr-ca-tuned":
            cmd += TUNED_CACHE_AWARE
        ready = "/health"
    else:
        if config is None:
            policy = {"ours-prefix": "prefix", "ours-rr": "round_robin", "ours-ll": "least_loaded"}[name]
            config = {"pools": {"interactive": {"engines": urls, "policy": policy}}, "admission": {"enabled": False}}
        config = {"log_level": "warning", **config}
        path = folder / "gateway.json"
        path.write_text(json.dumps(config, indent=1))
        cmd = [setup.python, "-m", "priority_gateway", "serve", "--config", str(path), "--port", str(FRONT_PORT)]
        ready = "/ready"
    (folder / "front.cmd").write_text(" ".join(cmd) + "\n")
    out = open(folder / "front.log", "ab")  # noqa: SIM115 - closed when the process ends
    proc = subprocess.Popen(cmd, env=setup.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    if not wait_until(f"http://127.0.0.1:{FRONT_PORT}{ready}", 90, lambda: proc.poll() is None):
        stop(proc)
        raise RuntimeError(f"{name} did not come up: {(folder / 'front.log').read_text(errors='replace')[-2000:]}")
    return proc


def run_bench(setup: Setup, args: list[str], out: Path, limit_s: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [setup.python, "-m", "priority_gateway", "bench", "--model", MODEL, "--out", str(out), *args]
    with open(out / "bench.log", "ab") as sink:
        try:
            subprocess.run(cmd, env=setup.env, stdout=sink, stderr=subprocess.STDOUT, timeout=limit_s, check=False)
        except subprocess.TimeoutExpired:
            log(f"bench in {out.name} ran past {limit_s:.0f} s and was stopped")
    try:
        return json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return {}


def summary_line(name: str, results: dict) -> str:
    runs = results.get("runs") or [{}]
    keys = ("completed", "errors", "cached_token_ratio", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms")
    return f"{name}: " + " ".join(f"{k}={runs[0].get(k)}" for k in (*keys, "output_tokens_per_s"))


# -- runs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    bench: list[str]
    duration_s: float


def workloads(setup: Setup) -> dict[str, Workload]:
    hot_s, mooncake_s = setup.seconds(60), setup.seconds(75)
    hot = f"hot:rate=6,prompts=128,prompt_len=1536,user_len=256,output=64,zipf=1.1,minutes={hot_s / 60:.4g}"
    common = ["--endpoint", "completions", "--token-ids", "--timeout", "300"]
    mooncake = ["--trace", f"{MOONCAKE}@interactive", "--rate-scale", "1.6", "--trace-block-tokens", "128"]
    return {
        "hot": Workload("hot", ["--trace", f"{hot}@interactive", *common], hot_s),
        "mooncake": Workload(
            "mooncake",
            [*mooncake, *common, "--duration", f"{mooncake_s:g}"],
            mooncake_s,
        ),
    }


def route(setup: Setup, workload: Workload, front: str, repeat: bool = False) -> None:
    """One routing run; ``repeat`` names the folder ``route-<workload>-repeat-<front>`` (a front's second run)."""
    folder = RES / f"route-{workload.name}{'-repeat' if repeat else ''}-{front}"
    folder.mkdir(parents=True, exist_ok=True)
    codes = reset_caches(setup.urls)
    save_metrics(setup.urls, folder, "before")
    proc = start_front(setup, front, setup.urls, folder)
    started = time.time()
    try:
        results = run_bench(
            setup, ["--url", f"http://127.0.0.1:{FRONT_PORT}", *workload.bench], folder, workload.duration_s + 240
        )
    finally:
        stop(proc)
    save_metrics(setup.urls, folder, "after")
    meta = {"front": front, "workload": workload.name, "reset_status": codes, "started": started, "wall_s": 0.0}
    meta["wall_s"] = round(time.time() - started, 1)
    (folder / "run.json").write_text(json.dumps(meta, indent=1))
    log(summary_line(f"route {workload.name} {front}", results))


def calibrate(setup: Setup, phases: str = "single") -> None:
    """``calibrate.py``'s phases against the first engine: ``single`` (calibration.json) or ``mixed`` (mixed.json)."""
    folder = RES / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    reset_caches(setup.urls)
    name = "calibration" if phases == "single" else phases
    save_metrics(setup.urls[:1], folder, f"{name}-before")
    cmd = [setup.python, str(HERE / "calibrate.py"), "--url", setup.urls[0], "--model", MODEL, "--phases", phases]
    cmd += ["--out", str(folder / f"{name}.json")] + (["--quick"] if setup.dry else [])
    with open(folder / f"{name}.log", "ab") as sink:
        subprocess.run(cmd, env=setup.env, stdout=sink, stderr=subprocess.STDOUT, timeout=420, check=False)
    save_metrics(setup.urls[:1], folder, f"{name}-after")
    log(f"{name} written: {(folder / f'{name}.json').exists()}")


INTERACTIVE_BUDGET = {"ttft_p99_ms": 1000, "itl_p99_ms": 100}


def admission(setup: Setup, mode: str) -> None:
    """Interactive Poisson traffic beside a batch flood: separate pools with admission, or one FCFS pool."""
    folder = RES / f"admission-{mode}"
    folder.mkdir(parents=True, exist_ok=True)
    urls = setup.urls
    half = len(urls) // 2
    classes = {"interactive": INTERACTIVE_BUDGET, "batch": {"deadline_s": 3600}}
    if mode == "pools":
        config = {
            "pools": {"interactive": {"engines": urls[:half]}, "batch": {"engines": urls[half:]}},
            "classes": {"interactive": {**INTERACTIVE_BUDGET, "pool": "interactive"}, "batch": {"pool": "batch"}},
        }
    else:
        config = {
            "pools": {"shared": {"engines": urls, "policy": "least_loaded"}},
            "classes": {name: {**value, "pool": "shared"} for name, value in classes.items()},
            "admission": {"enabled": False},
        }
    reset_caches(urls)
    save_metrics(urls, folder, "before")
    proc = start_front(setup, "gateway-config", urls, folder, config)
    seconds = setup.seconds(60)
    url = f"http://127.0.0.1:{FRONT_PORT}"
    common = ["--url", url, "--endpoint", "completions", "--token-ids", "--timeout", "600"]
    budget = ["--ttft-ms", str(INTERACTIVE_BUDGET["ttft_p99_ms"]), "--itl-ms", str(INTERACTIVE_BUDGET["itl_p99_ms"])]
    flood_cmd = [
        setup.python,
        "-m",
        "priority_gateway",
        "bench",
        "--model",
        MODEL,
        "--out",
        str(folder / "batch"),
        *common,
    ]
    flood_cmd += ["--x-priority", "batch", "--concurrency", "192", "--duration", f"{seconds:g}"]
    flood_cmd += ["--input-len", "2048", "--output-len", "256", "--ramp-up", "5"]
    (folder / "batch").mkdir(exist_ok=True)
    try:
        with open(folder / "batch" / "bench.log", "ab") as sink:
            flood = subprocess.Popen(flood_cmd, env=setup.env, stdout=sink, stderr=subprocess.STDOUT)
            time.sleep(setup.seconds(8))  # the flood is on before interactive traffic starts
            interactive = f"poisson:rate=2,input=1024,output=128,minutes={seconds / 60:.4g}@interactive"
            results = run_bench(
                setup, [*common, *budget, "--trace", interactive], folder / "interactive", seconds + 240
            )
            try:
                flood.wait(seconds + 300)
            except subprocess.TimeoutExpired:
                flood.kill()
    finally:
        stop(proc)
    save_metrics(urls, folder, "after")
    log(summary_line(f"admission {mode} interactive", results))


RELAY_FRONTS = ("direct", "ours-prefix", "vllmr-rr")


def relay_bench(seconds: float) -> list[str]:
    bench = ["--duration", f"{seconds:g}", "--ramp-up", "2", "--input-len", "128", "--output-len", "32"]
    return [*bench, "--spread", "0", "--endpoint", "completions", "--token-ids"]


def relay(setup: Setup, engines: int = 1, seconds: float = 8.0) -> None:
    """Added TTFT of each front at concurrency 1 and 64, every front in front of the first ``engines``.

    With one engine the folders are ``relay-<front>``; with more, ``relay<engines>-<front>``, and
    direct is run first and again last (``direct-again``) so that drift shows. Direct before
    several engines is one client per engine, each at its share of the concurrency (64 / engines):
    the load every engine sees from a front that spreads it evenly, with no front in between."""
    urls = setup.urls[:engines]
    seconds = setup.seconds(seconds)
    prefix = "relay" if engines == 1 else f"relay{engines}"
    fronts = RELAY_FRONTS if engines == 1 else (*RELAY_FRONTS, "direct-again")
    for front in fronts:
        folder = RES / f"{prefix}-{front}"
        folder.mkdir(parents=True, exist_ok=True)
        reset_caches(urls)
        if front.startswith("direct") and engines > 1:
            relay_direct_spread(setup, urls, folder, seconds)
            continue
        proc = None if front.startswith("direct") else start_front(setup, front, urls, folder)
        target = urls[0] if front.startswith("direct") else f"http://127.0.0.1:{FRONT_PORT}"
        bench = ["--url", target, "--concurrency", "1,64", *relay_bench(seconds)]
        try:
            results = run_bench(setup, bench, folder, 4 * seconds + 120)
        finally:
            stop(proc)
        log(summary_line(f"{prefix} {front}", results))


def relay_direct_spread(setup: Setup, urls: list[str], folder: Path, seconds: float) -> None:
    """Concurrency 1 against the first engine; concurrency 64 as one client per engine at 64 / engines."""
    results = run_bench(setup, ["--url", urls[0], "--concurrency", "1", *relay_bench(seconds)], folder / "c1", 300)
    log(summary_line(f"relay{len(urls)} {folder.name} c=1", results))
    share = str(64 // len(urls))
    jobs = [
        (setup, ["--url", url, "--concurrency", share, *relay_bench(seconds)], folder / f"c64-engine{i + 1}", 300)
        for i, url in enumerate(urls)
    ]
    threads = [threading.Thread(target=run_bench, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(len(urls)):
        try:
            results = json.loads((folder / f"c64-engine{i + 1}" / "results.json").read_text())
        except (OSError, ValueError):
            results = {}
        log(summary_line(f"relay{len(urls)} {folder.name} c=64 engine {i + 1}", results))


# -- the plan -------------------------------------------------------------------------------------


# The fleet plan: issue-scale real-time benchmarks (several gateway replicas on one redis-server,
# tenants sharing a pool) run as they run on CPU, against the device's engines: engines 1-2 are the
# interactive pool and 3-4 the batch pool. Budgets suit eager 7B engines sharing one GPU.
FLEET_BUDGET = ["--budget-ms", "1000,100"]


def redis_binary(setup: Setup) -> tuple[str, dict[str, str]]:
    """The redis-server to start, and the environment it needs: on the device, Debian's packages
    carried as .deb files (``.gpu/redis``) unpacked under the work folder, with their libraries."""
    if setup.dry:
        return shutil.which("redis-server") or "redis-server", {}
    root = WORK / "redis"
    if not (root / "usr/bin/redis-server").exists():
        where = os.environ.get("GPU_REDIS_DEBS") or (WORK / "redisdebs" if (WORK / "redisdebs").is_dir() else None)
        debs = sorted(Path(where or PROJ / ".gpu/redis").glob("*.deb"))
        if not debs:
            raise NotRun("no redis-server carried (prepare.sh's c3, harness.py extras): the fleet scenes need one")
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    libs = str(root / "usr/lib/x86_64-linux-gnu")
    return str(root / "usr/bin/redis-server"), {"LD_LIBRARY_PATH": libs}


def realtime_script(setup: Setup, name: str, script: str, args: list[str], limit_s: float) -> None:
    """Run one of the project's real-time benchmarks against the engines, its results under ``name``."""
    folder = RES / name
    folder.mkdir(parents=True, exist_ok=True)
    redis, extra = redis_binary(setup)
    env = {**setup.env, **extra, "PYTHONUNBUFFERED": "1"}
    cmd = [setup.python, str(PROJ / "benchmarks" / script), *args, "--redis-server", redis, "--out", str(folder)]
    (folder / "command.txt").write_text(" ".join(cmd) + "\n")
    record_engines(setup, folder)
    reset_caches(setup.urls)
    with open(folder / "bench.log", "ab") as sink:
        proc = subprocess.Popen(cmd, env=env, cwd=PROJ, stdout=sink, stderr=subprocess.STDOUT)
        try:
            proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeError(f"{script} ran past {limit_s:.0f} s") from None
    if proc.returncode:
        raise RuntimeError(f"{script} exited {proc.returncode}: see {folder / 'bench.log'}")


def fleet_steps(setup: Setup) -> list[tuple[str, float, Callable[[], None]]]:
    urls = setup.urls
    half = len(urls) // 2
    pools = [f"interactive={','.join(urls[:half])}", f"batch={','.join(urls[half:])}"]
    minutes = max(0.5, 0.75 * setup.time_scale)
    fleet = ["--engines", *pools, "--replicas", "4", "--repeats", "2", "--minutes", f"{minutes:g}"]
    fleet += ["--warmup-s", f"{setup.seconds(15):g}", "--rate", "2", "--input", "1024", "--output", "128"]
    fleet += ["--flood", "192", *FLEET_BUDGET]
    fleet_s = 2 * 3 * (minutes * 60 + 35)
    fair_s = max(setup.seconds(35), 30.0)
    fair = ["--engines", f"interactive={','.join(urls)}", "--seconds", f"{fair_s:g}", "--warmup-s", "10"]
    fair += FLEET_BUDGET
    fair_total = 9 * (fair_s + 20)
    return [
        (
            "fleet admission",
            fleet_s + 60,
            lambda: realtime_script(setup, "fleet-admission", "fleet_admission_realtime.py", fleet, fleet_s + 240),
        ),
        (
            "fairness",
            fair_total + 30,
            lambda: realtime_script(setup, "fairness", "fairness_realtime.py", fair, fair_total + 240),
        ),
    ]


def fleet_itl_args(setup: Setup, repeats: int, *more: str) -> tuple[list[str], float]:
    """``fleet_itl.py``'s arguments on the device's engines (1-2 interactive, 3-4 batch), and its time."""
    urls = setup.urls
    half = len(urls) // 2
    seconds = max(20.0, setup.seconds(75))
    args = ["--engines", f"interactive={','.join(urls[:half])}", f"batch={','.join(urls[half:])}"]
    args += ["--replicas", "4", "--repeats", str(repeats), "--seconds", f"{seconds:g}"]
    args += ["--warmup-s", f"{setup.seconds(15):g}", "--rate", "2", "--input", "1024", "--output", "128"]
    args += ["--flood", "192", "--scrape-s", "0.5", *FLEET_BUDGET, *more]
    runs = repeats * (2 if "--setups" not in more else 1)
    return args, runs * (seconds + 30)


def fleet_itl_steps(setup: Setup, pinned: bool = False) -> list[tuple[str, float, Callable[[], None]]]:
    """The fleet plan's one replica against four, each run instrumented (``fleet_itl.py``): every
    request's timeline with its replica and engine, the engines' own histograms and the host's CPU
    every half second; three runs of each, alternated (one dry). ``pinned``: instead, four replicas
    with every limit fixed at 2 (what one replica learned) and one replica fixed at 3 (what four
    learned), one run each: whether the tail follows the engines' concurrency or the replicas."""
    if pinned:
        runs = [("fleet-itl-pin2", "fleet", "2"), ("fleet-itl-pin3", "one", "3")]
        steps = []
        for folder, which, limit in runs:
            args, total = fleet_itl_args(setup, 1, "--setups", which, "--pin-limit", limit)
            steps.append((folder, total + 30, lambda f=folder, a=args, t=total: _fleet_itl(setup, f, a, t)))
        return steps
    args, total = fleet_itl_args(setup, 1 if setup.dry else 3)
    return [("fleet itl", total + 30, lambda: _fleet_itl(setup, "fleet-itl", args, total))]


def _fleet_itl(setup: Setup, folder: str, args: list[str], total: float) -> None:
    realtime_script(setup, folder, "gpu/fleet_itl.py", args, total + 240)


SESSIONS_KV_BYTES = 2 * 1024**3
"""The sessions plan's KV cache per engine: ~37k tokens (of 57,344 bytes each: bf16 K and V, 4 KV heads
of 128, 28 layers), so four engines hold ~150k tokens while the live agent sessions' contexts ask for more."""
SESSIONS_CPU_TIER = (
    (
        "--kv-offloading-size",
        str(4 * SESSIONS_KV_BYTES // 1024**3),
        "the sessions-tier plan: a CPU tier 4x the GPU's KV cache (vLLM's native offloading), as the "
        "simulator's agent_sessions runs compare (benchmarks/results/agent_sessions/)",
    ),
    ("--kv-offloading-backend", "native", "the sessions-tier plan: vLLM's own CPU offloading"),
)
"""The experiment's flags of the sessions-tier plan's engines (GiB, as vllm serve takes them)."""
SESSION_FRONTS = {
    "ours-prefix": {"sessions": {"enabled": False}},
    "ours-sessions": {
        "sessions": {"enabled": True, "wait_for_engine": False},
        "prefix": {"policy": {"retention_weight": 0.0}},
    },
    "ours-retention": {
        "sessions": {"enabled": True, "wait_for_engine": False},
        "prefix": {"policy": {"retention_weight": 1.0}},
    },
    "ours-wait": {"sessions": {"enabled": True}, "prefix": {"policy": {"retention_weight": 1.0}}},
    "vllmr-ca": None,
    "vllmr-ch": None,
}


def sessions_steps(setup: Setup, plan: str = "sessions") -> list[tuple[str, float, Callable[[], None]]]:
    """Agent sessions closed loop (``benchmarks/agent_sessions_client.py``) through each front in turn:
    the gateway with sessions off, on, on with retention, on with retention and continuing turns waiting
    for their sessions' engines (the default; admission on, the shipped seats, interactive ITL budget
    250 ms, no TTFT refusals), vllm-router cache_aware and consistent_hash on ``X-Session-ID``; ~120 s
    each."""
    seconds, limit = setup.seconds(40), setup.seconds(100)
    steps = []
    for front in SESSION_FRONTS:
        run = partial(agent_sessions_run, setup, front, seconds, limit, plan)
        steps.append((f"{plan} {front}", limit + 20, run))
    return steps


def agent_sessions_run(setup: Setup, front: str, seconds: float, limit: float, plan: str = "sessions") -> None:
    folder = RES / plan / front
    folder.mkdir(parents=True, exist_ok=True)
    reset_caches(setup.urls)
    config = None
    extra = SESSION_FRONTS[front]
    if extra is not None:
        config = {
            # The pool says what the shipped configuration says of these engines (their seats).
            "pools": {
                "interactive": {"engines": setup.urls, "policy": "prefix", **engine_args.profile_gateway("interactive")}
            },
            "classes": {"interactive": {"ttft_p99_ms": None, "itl_p99_ms": 250}},
            **extra,
        }
    proc = start_front(setup, front, setup.urls, folder, config)
    try:
        save_metrics(setup.urls, folder, "before")
        cmd = [
            setup.python,
            str(PROJ / "benchmarks/agent_sessions_client.py"),
            "--url",
            f"http://127.0.0.1:{FRONT_PORT}",
        ]
        cmd += [
            "--model",
            MODEL,
            "--rate",
            "1",
            "--seconds",
            f"{seconds:g}",
            "--limit-s",
            f"{limit:g}",
            "--trace",
            str(TRACES / "mooncake/conversation_trace.jsonl"),
            "--out",
            str(folder),
        ]
        (folder / "command.txt").write_text(" ".join(cmd) + "\n")
        with open(folder / "bench.log", "ab") as sink:
            subprocess.run(cmd, env=setup.env, cwd=PROJ, stdout=sink, stderr=subprocess.STDOUT, timeout=limit + 60)
        save_metrics(setup.urls, folder, "after")
    finally:
        stop(proc)


def calibration_plan_steps(setup: Setup, name: str) -> list[tuple[str, float, Callable[[], None]]]:
    if name == "fleet":
        return fleet_steps(setup)
    if name in ("fleet-itl", "fleet-itl-pinned"):
        return fleet_itl_steps(setup, pinned=name == "fleet-itl-pinned")
    w = workloads(setup)
    hot_order = ["ours-prefix", "vllmr-ca", "vllmr-ca-tuned", "vllmr-rr"]
    mooncake_order = ["vllmr-ca-tuned", "vllmr-rr", "ours-prefix", "vllmr-ca"]  # rotated
    steps: list[tuple[str, float, Callable[[], None]]] = []
    steps += [(f"route hot {f}", w["hot"].duration_s + 25, lambda f=f: route(setup, w["hot"], f)) for f in hot_order]
    steps += [
        (f"route mooncake {f}", w["mooncake"].duration_s + 40, lambda f=f: route(setup, w["mooncake"], f))
        for f in mooncake_order
    ]
    steps.append(("calibrate", 100 * setup.time_scale + 20, lambda: calibrate(setup)))
    steps += [(f"admission {m}", setup.seconds(60) + 45, lambda m=m: admission(setup, m)) for m in ("pools", "shared")]
    steps.append(("relay", 3 * (2 * setup.seconds(8) + 25), lambda: relay(setup)))
    steps.append(("route hot ours-rr", w["hot"].duration_s + 25, lambda: route(setup, w["hot"], "ours-rr")))
    if name == "mixed":
        # One engine alone on the device: steps that mix prefill chunks with decodes and the tail of
        # plain decode steps first, then the single-engine phases again (same engine, same sitting).
        return [
            ("calibrate mixed", 160 * setup.time_scale + 30, lambda: calibrate(setup, "mixed")),
            ("calibrate", 100 * setup.time_scale + 20, lambda: calibrate(setup)),
        ]
    if name == "repeat":
        # The second sitting: every front's second Mooncake run (the order rotated again against the
        # first's), gateway round robin on Mooncake, relay overhead before four engines, then more
        # round robin runs while time lasts.
        order = ["ours-prefix", "vllmr-ca", "ours-rr", "vllmr-ca-tuned", "vllmr-rr"]
        moon = w["mooncake"]
        steps = [
            (f"route mooncake {f}", moon.duration_s + 40, lambda f=f: route(setup, moon, f, repeat=f != "ours-rr"))
            for f in order
        ]
        relay_s = 4 * (2 * setup.seconds(15) + 20)
        steps.append(("relay 4 engines", relay_s, lambda: relay(setup, engines=setup.engines, seconds=15)))
        steps.append(
            ("route mooncake repeat ours-rr", moon.duration_s + 40, lambda: route(setup, moon, "ours-rr", repeat=True))
        )
        steps.append(
            ("route hot repeat ours-rr", w["hot"].duration_s + 25, lambda: route(setup, w["hot"], "ours-rr", True))
        )
        return steps
    if name == "smoke":
        keep = {"route hot ours-prefix", "route hot vllmr-ca-tuned", "route mooncake ours-prefix", "calibrate"}
        keep |= {"admission pools", "relay"}
        steps = [s for s in steps if s[0] in keep]
    return steps


# -- the budgets plan: the seed's single-GPU experiment live, then the pools as shipped ---------------


SEATS_WHY = (
    "the experiment's variable: fronts that bound concurrency themselves (the gateway's learned or pinned "
    "limit) need an engine that does not, so 256 seats, more than one engine keeps in flight within the "
    "budgets; the profile's 4 is where NVFP4 Gemma 4 holds them, not this 7B"
)
CAP_WHY = "the experiment's variable: a static concurrency cap in the engine, as an operator would tune it by hand"
SINGLE_SEATS = 256
SINGLE: Layout = (EngineSpec("interactive", (("--max-num-seqs", str(SINGLE_SEATS), SEATS_WHY),)),)
SHIPPED_FLEET: Layout = (EngineSpec("interactive"),) * 2 + (EngineSpec("batch"),) * 2
BUDGET = {"ttft_p99_ms": 500, "itl_p99_ms": 50}
POISSON_FRACTIONS = (0.4, 0.75, 1.0, 1.3, 2.0)
BURSTY_FRACTIONS = (0.75, 1.0, 1.4)
CAPS = (32, 16, 64)
"""Pinned limits, in the order they run: 32 first, where gateway sim puts the best of them."""
FALLBACK_CAPACITY_RPS = 17.0
"""Used when the capacity probe did not run: gateway sim's h200-7b-bf16 with 384-token chunks
saturates at ~2,200 output tokens/s of 1024 + 128-token requests."""
FLEET_RUNS = 5


def commit() -> str:
    """The commit of the code the device runs (``prepare.sh`` writes it into the project archive)."""
    return envelope.commit_stamp(PROJ)


def record_engines(setup: Setup, folder: Path) -> None:
    """The engines a result was measured on, as they were started, beside it."""
    record = {"commit": commit(), "layout": [s.pool for s in setup.layout], "engines": setup.launches}
    (folder / "engines.json").write_text(json.dumps(record, indent=1))


def capacity_probe(setup: Setup) -> None:
    """Closed loop at concurrency 64 straight to the engine: the request rate it saturates at, which the
    offered rates of every front are fractions of."""
    folder = RES / "budgets-capacity"
    folder.mkdir(parents=True, exist_ok=True)
    record_engines(setup, folder)
    seconds = setup.seconds(15)
    bench = ["--url", setup.urls[0], "--concurrency", "64", "--duration", f"{seconds:g}", "--ramp-up", "2"]
    bench += ["--input-len", "1024", "--output-len", "128", "--endpoint", "completions", "--token-ids"]
    results = run_bench(setup, [*bench, "--timeout", "120"], folder, seconds + 180)
    runs = results.get("runs") or [{}]
    rps = runs[0].get("request_throughput")
    if not rps:
        raise RuntimeError(f"capacity probe measured nothing: see {folder / 'bench.log'}")
    setup.state["capacity_rps"] = rps
    (folder / "capacity.json").write_text(
        json.dumps({"request_throughput": rps, "concurrency": 64, **runs[0]}, indent=1)
    )
    log(summary_line("capacity c=64", results))


def capacity(setup: Setup) -> tuple[float, str]:
    if "capacity_rps" in setup.state:
        return setup.state["capacity_rps"], setup.state.get("capacity_source", "measured")
    try:
        return json.loads((RES / "budgets-capacity" / "capacity.json").read_text())["request_throughput"], "measured"
    except (OSError, ValueError, KeyError):
        return FALLBACK_CAPACITY_RPS, "gateway sim's estimate (the probe did not run)"


def budgets_front(front: str, url: str) -> dict | None:
    """The gateway's configuration for ``front`` (None: not the gateway). Its pool declares the engine's
    seats, as the shipped configuration declares its pools' (``deploy/base/gateway/gateway.yaml``)."""
    front = front_kind(front)
    base = {
        "pools": {"interactive": {"engines": [url], "policy": "prefix", "max_num_seqs": SINGLE_SEATS}},
        "classes": {"interactive": dict(BUDGET)},
        "log_level": "info",
        "access_log": False,
    }
    if front == "ours-admission":
        return base
    if front == "ours-off" or front.startswith("engine-cap-"):
        return {**base, "admission": {"enabled": False}}
    if front.startswith("cap-"):
        n = int(front.removeprefix("cap-"))
        return {**base, "admission": {"initial_limit": n, "min_limit": n, "max_limit": n}}
    return None


def _fractions(arrivals: str) -> tuple[float, ...]:
    return POISSON_FRACTIONS if arrivals == "poisson" else BURSTY_FRACTIONS


def warmup_s(setup: Setup, front: str) -> float:
    """Every front with admission on gets a warm-up level (at 0.75 of capacity): the gateway that learns
    its limit, and the static caps, which are the gateway with its limit pinned and learn the first-token
    line and margin all the same. What a front learned there it keeps, as a gateway that has been running
    would, and the engine's first loaded seconds fall there, not in a measured level: in the tenth sitting
    the first front's first level (no warm-up, right after the engine's start) had 17 of 144 admitted
    requests miss a budget, where the same front's later run had none, and the margin those raised made the
    first run refuse 25 % at the next level against 4 %. Fronts without admission have nothing to learn.
    Which fronts run admission is read from their configuration (``budgets_front``), not said twice."""
    config = budgets_front(front, "")
    admits = config is not None and config.get("admission", {}).get("enabled", True)
    return setup.seconds(20) if admits else 0.0


def budgets_estimate(setup: Setup, arrivals: str, front: str) -> float:
    """Warm-up, the levels, and the backlog a front that admits everything drains past capacity."""
    level, drain = setup.seconds(15), setup.seconds(45)
    admits_all = front_kind(front) in ("ours-off", "vllmr-rr") or front.startswith("engine-cap-")
    total = warmup_s(setup, front) + 10.0
    for f in _fractions(arrivals):
        total += level + 5.0 + (min(drain, max(0.0, f - 1.0) * level) if admits_all else 2.0)
    return total


def budgets_run(setup: Setup, arrivals: str, front: str) -> None:
    """One front's sweep (``budgets.py sweep``) at the fractions of the engine's capacity."""
    rps, source = capacity(setup)
    rates = [round(rps * f * setup.rate_scale, 2) for f in _fractions(arrivals)]
    folder = RES / f"budgets-{arrivals}-{front}"
    folder.mkdir(parents=True, exist_ok=True)
    record_engines(setup, folder)
    url = setup.urls[0]
    reset_caches(setup.urls)
    save_metrics(setup.urls, folder, "before")
    config = budgets_front(front, url)
    proc = start_front(setup, "gateway-config" if config is not None else front, [url], folder, config)
    started = time.time()
    cmd = [setup.python, str(HERE / "budgets.py"), "sweep", "--url", f"http://127.0.0.1:{FRONT_PORT}"]
    cmd += ["--engine", url, "--front", front, "--arrivals", arrivals, "--rates", ",".join(map(str, rates))]
    cmd += ["--level-s", f"{setup.seconds(15):g}", "--drain-s", f"{setup.seconds(45):g}"]
    cmd += ["--warmup-rate", f"{rps * 0.75 * setup.rate_scale:.2f}", "--warmup-s", f"{warmup_s(setup, front):g}"]
    cmd += ["--traces", str(TRACES), "--out", str(folder)]
    (folder / "command.txt").write_text(" ".join(cmd) + "\n")
    try:
        with open(folder / "bench.log", "ab") as sink:
            limit = budgets_estimate(setup, arrivals, front) + 120
            subprocess.run(cmd, env=setup.env, cwd=PROJ, stdout=sink, stderr=subprocess.STDOUT, timeout=limit)
    finally:
        stop(proc)
    save_metrics(setup.urls, folder, "after")
    meta = {
        "front": front,
        "arrivals": arrivals,
        "capacity_rps": rps,
        "capacity_source": source,
        "rate_fractions": list(_fractions(arrivals)),
        "rate_scale": setup.rate_scale,
        "rates": rates,
        "gateway_config": config,
        "commit": commit(),
        "started": started,
        "wall_s": round(time.time() - started, 1),
        "engines": setup.launches,
    }
    (folder / "run.json").write_text(json.dumps(meta, indent=1))
    try:
        levels = json.loads((folder / "sweep.json").read_text())["levels"]
    except (OSError, ValueError, KeyError):
        raise RuntimeError(f"budgets {arrivals} {front}: no sweep.json, see {folder / 'bench.log'}") from None
    for lv in levels:
        log(
            f"budgets {arrivals} {front} {lv['label']}: goodput {lv['goodput_rps']}/s, attainment "
            f"{lv['attainment_of_admitted']}, refused {lv['refused_share']}, TTFT p99 {lv['ttft_p99_ms']}, "
            f"ITL p99 {lv['itl_p99_ms']}"
        )


def best_cap() -> int:
    """The pinned limit with the highest mean goodput from capacity up (Poisson), of those that ran."""
    scores = {}
    for cap in CAPS:
        try:
            levels = json.loads((RES / f"budgets-poisson-cap-{cap}" / "sweep.json").read_text())["levels"]
        except (OSError, ValueError, KeyError):
            continue
        rows = [lv["goodput_rps"] for lv in levels if not lv.get("warmup")][2:] or [0.0]
        scores[cap] = sum(rows) / len(rows)
    return max(scores, key=lambda c: scores[c]) if scores else CAPS[0]


def engine_cap_layout() -> Layout:
    return (EngineSpec("interactive", (("--max-num-seqs", str(best_cap()), CAP_WHY),)),)


def shipped_pool_options() -> list[str]:
    """The gateway's pools as shipped: each says what its profile's ``gateway:`` section says of the engines
    (their scheduling policy, their seats), as ``fleet_itl.py --pool-option`` settings."""
    out = []
    for pool in ("interactive", "batch"):
        for key, value in engine_args.profile_gateway(pool).items():
            out += ["--pool-option", f"{pool}.{key}={value}"]
    return out


def fleet_shipped_run(setup: Setup, folder: str, *more: str) -> None:
    args, total = fleet_itl_args(setup, 1, *shipped_pool_options(), *more)
    realtime_script(setup, folder, "gpu/fleet_itl.py", args, total + 240)


def shared_gpu_run(setup: Setup, throttle: bool) -> None:
    """The 2+2 scene at the seed's budgets: the interactive pool (engines 1-2) beside a batch flood on
    the batch pool (3-4), every engine on the one GPU; ``throttle``: the batch pool declared as sharing
    the interactive pool's hardware, so that the gateway throttles it from the interactive ITL."""
    folder = f"shared-gpu-throttle-{'on' if throttle else 'off'}"
    more = ["--setups", "one", "--budget-ms", "500,50"]
    if throttle:
        option = "batch.shares_hardware_with=interactive"
        urls = setup.urls
        config = {"pools": {"interactive": {"engines": urls[:2]}, "batch": {"engines": urls[2:]}}}
        config["pools"]["batch"]["shares_hardware_with"] = "interactive"
        check = "import json, sys\nfrom priority_gateway.config.load import parse_config\n"
        check += "parse_config(json.loads(sys.argv[1]))"
        done = subprocess.run(
            [setup.python, "-c", check, json.dumps(config)], env=setup.env, capture_output=True, text=True
        )
        if done.returncode:
            (RES / folder).mkdir(parents=True, exist_ok=True)
            reason = (done.stderr.strip().splitlines() or ["?"])[-1]
            note = {
                "run": False,
                "why": "the gateway does not take pools.<name>.shares_hardware_with yet",
                "error": reason,
            }
            (RES / folder / "not_run.json").write_text(json.dumps(note, indent=1))
            raise NotRun(f"pools.batch.shares_hardware_with is not a setting of this gateway yet ({reason})")
        more += ["--pool-option", option]
    fleet_shipped_run(setup, folder, *more)


def fleet_shipped_steps(setup: Setup, runs: int = FLEET_RUNS) -> list[Step]:
    """The fleet-itl scene with the shipped engines (one replica and four alternated, ``runs`` each) and
    the 2+2 scene throttled and not; the fleet's first pair first, then both shared-GPU runs."""
    _, one_s = fleet_itl_args(setup, 1, "--setups", "one")
    steps = []
    for k in range(runs):
        for which in ("one", "fleet"):
            folder = f"fleet-itl-shipped/{which}-{k}"
            more = ("--setups", which, "--seed", str(k))
            run = lambda f=folder, m=more: fleet_shipped_run(setup, f, *m)  # noqa: E731
            steps.append(Step(f"fleet-itl shipped {which} {k}", one_s + 30, run, SHIPPED_FLEET))
        if k == 0:
            for throttle in (False, True):
                run = lambda t=throttle: shared_gpu_run(setup, t)  # noqa: E731
                name = f"shared gpu throttle {'on' if throttle else 'off'}"
                steps.append(Step(name, one_s + 30, run, SHIPPED_FLEET))
    return steps


def sweep_step(setup: Setup, arrivals: str, front: str) -> Step:
    """One front's sweep as a step of a plan, on the single engine."""
    estimate = budgets_estimate(setup, arrivals, front)
    return Step(f"budgets {arrivals} {front}", estimate, lambda: budgets_run(setup, arrivals, front), SINGLE)


def budgets_steps(setup: Setup, fleet_runs: int = FLEET_RUNS) -> list[Step]:
    """The budgets plan, most valuable first (README, "The budgets plan")."""

    def sweep(arrivals: str, front: str) -> Step:
        return sweep_step(setup, arrivals, front)

    caps = [f"cap-{c}" for c in CAPS]
    steps = [Step("budgets capacity", setup.seconds(15) + 40, lambda: capacity_probe(setup), SINGLE)]
    steps += [sweep("poisson", f) for f in ("ours-admission", caps[0], "ours-off")]
    steps += [sweep("bursty", f) for f in ("ours-admission", caps[0], "ours-off")]
    steps += [sweep("poisson", f) for f in (*caps[1:], "vllmr-rr")]
    steps += fleet_shipped_steps(setup, fleet_runs)
    cap_estimate = budgets_estimate(setup, "poisson", "engine-cap-32")

    def engine_cap() -> None:
        budgets_run(setup, "poisson", f"engine-cap-{best_cap()}")

    steps.append(Step("budgets poisson engine-cap", cap_estimate, engine_cap, engine_cap_layout))
    return steps


AGAIN_ORDER = (
    ("poisson", "cap-64"),
    ("poisson", "ours-admission"),
    ("poisson", "cap-32"),
    ("poisson", "ours-admission@2"),
    ("bursty", "cap-32"),
    ("bursty", "ours-admission"),
    ("bursty", "cap-64"),
    ("poisson", "ours-off"),
    ("poisson", "cap-16"),
)
"""The budgets plan's single-engine part again, the fronts interleaved: the second sitting ran the
gateway first on an engine just started, and every cap after it, so the engine's own warming up fell
on the gateway alone. Here a cap runs first, the gateway twice between caps."""


PAIRS_ORDER = (
    ("poisson", "cap-64"),
    ("poisson", "ours-admission"),
    ("poisson", "ours-admission@2"),
    ("poisson", "cap-64@2"),
    ("bursty", "ours-admission"),
    ("bursty", "cap-64"),
    ("poisson", "cap-64@3"),
    ("poisson", "ours-admission@3"),
)
"""The gateway against the static cap that did best so far (64: its limit never binds, so it stands for
the best an operator's cap can do with the gateway's first-token check), in pairs whose order alternates,
so that each rate has several runs of each and the ratio is of medians, not of one noisy run."""


def budgets_again_steps(setup: Setup, order: tuple[tuple[str, str], ...] = AGAIN_ORDER) -> list[Step]:
    sweeps = [sweep_step(setup, arrivals, front) for arrivals, front in order]
    if "capacity_rps" in setup.state:  # given (``--capacity-rps``): measured before on this kind of card
        return sweeps
    return [Step("budgets capacity", setup.seconds(15) + 40, lambda: capacity_probe(setup), SINGLE), *sweeps]


def plan_steps(setup: Setup, name: str) -> list[Step]:
    runs = int(setup.state.get("fleet_runs", FLEET_RUNS))
    if name == "budgets":
        return budgets_steps(setup, runs)
    if name == "budgets-again":
        return budgets_again_steps(setup)
    if name == "budgets-pairs":
        return budgets_again_steps(setup, PAIRS_ORDER)
    if name == "fleet-itl-shipped":
        return fleet_shipped_steps(setup, runs)
    if name == "sessions":  # four engines of the interactive pool's profile, each a small KV cache
        return [Step(n, e, run, (EngineSpec("interactive"),) * 4) for n, e, run in sessions_steps(setup)]
    if name == "sessions-tier":  # the same, each with a CPU tier behind its small KV cache
        tiered = (EngineSpec("interactive", SESSIONS_CPU_TIER),) * 4
        return [Step(n, e, run, tiered) for n, e, run in sessions_steps(setup, name)]
    layout = calibration_layout(setup.engines)
    return [Step(n, e, run, layout) for n, e, run in calibration_plan_steps(setup, name)]


def time_left(default_deadline: float) -> float:
    """Seconds until the plan's deadline (``wait --deadline-in-s`` may move it)."""
    try:
        return float(DEADLINE.read_text()) - time.time()
    except (OSError, ValueError):
        return default_deadline - time.time()


class NotRun(Exception):
    """A step that cannot run here and says why (recorded in ``skipped.json``)."""


@dataclass
class Step:
    name: str
    estimate_s: float
    run: Callable[[], None]
    layout: Layout | Callable[[], Layout] | None = None
    """The engines it needs (None: whatever runs; a function: decided by the steps before it); starting
    them counts in its estimate."""


def run_plan(setup: Setup, plan: str, budget_s: float) -> None:
    deadline = time.time() + budget_s
    DEADLINE.unlink(missing_ok=True)
    RES.mkdir(parents=True, exist_ok=True)
    DONE.unlink(missing_ok=True)
    gpu_log = None
    skipped: list[dict] = []
    failed: set[Layout] = set()
    try:
        if not setup.dry:
            gpu_log = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,index,utilization.gpu,memory.used,clocks.sm,power.draw",
                    "--format=csv",
                    "-l",
                    "1",
                ],
                stdout=open(RES / "gpu.csv", "ab"),  # noqa: SIM115 - closed when nvidia-smi ends
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        adopt_engines(setup)
        steps = plan_steps(setup, plan)
        only = setup.state.get("only")
        if only:
            left_out = [s.name for s in steps if not re.search(only, s.name)]
            skipped += [{"step": name, "reason": f"--only {only}"} for name in left_out]
            steps = [s for s in steps if re.search(only, s.name)]
        for step in steps:
            wanted = step.layout() if callable(step.layout) else step.layout
            need = wanted or setup.layout or calibration_layout(setup.engines)
            running = setup.state.get("stand_in", {}).get(need, need) == setup.layout
            estimate = step.estimate_s + (0.0 if running else engine_start_s(setup, need))
            left = time_left(deadline)
            if need in failed:
                skipped.append({"step": step.name, "reason": "its engines did not start"})
                continue
            if estimate > left:
                skipped.append({"step": step.name, "estimate_s": round(estimate), "left_s": round(left)})
                log(f"skip {step.name}: needs ~{estimate:.0f} s, {left:.0f} s left")
                continue
            log(f"start {step.name} (~{estimate:.0f} s, {left:.0f} s left)")
            began = time.monotonic()
            try:
                try:
                    use_engines(setup, need)
                except Exception:
                    failed.add(need)
                    raise
                step.run()
            except NotRun as exc:
                log(f"not run {step.name}: {exc}")
                skipped.append({"step": step.name, "reason": str(exc)})
            except Exception as exc:  # a failed step must not lose the others
                log(f"FAILED {step.name}: {exc!r}")
                skipped.append({"step": step.name, "error": repr(exc)[:2000]})
            log(f"end {step.name} after {time.monotonic() - began:.0f} s")
    finally:
        (RES / "skipped.json").write_text(json.dumps(skipped, indent=1))
        if setup.dry:
            stop_engines(setup)
        stop(gpu_log)
        DONE.write_text("done\n")
        log("plan done")


# -- calls ----------------------------------------------------------------------------------------


def stage(carry: Path) -> None:
    """Call 1: keep the first bundle part, the router and the gateway's wheels in /tmp."""
    (WORK / "parts").mkdir(parents=True, exist_ok=True)
    for item in carry.iterdir():
        shutil.copy(item, WORK / "parts" / item.name)
    log(f"staged: {sorted(p.name for p in (WORK / 'parts').iterdir())}")


def unpack(carry: Path) -> None:
    """Call 2: join the bundle's parts, check, unpack; install the router and the gateway's wheels."""
    parts = WORK / "parts"
    for item in carry.iterdir():
        if item.name.startswith("site.tar.xz.part-"):
            shutil.copy(item, parts / item.name)
    site = WORK / "vlsite"
    if not (site / "site" / "vllm").is_dir():
        pieces = sorted(parts.glob("site.tar.xz.part-*"))
        joined = WORK / "site.tar.xz"
        with open(joined, "wb") as out:
            for piece in pieces:
                out.write(piece.read_bytes())
        check = subprocess.run(["sha256sum", "-c", str(carry / "SHA256SUMS")], cwd=WORK, capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemExit(f"bundle checksum failed ({[p.name for p in pieces]}): {check.stdout}{check.stderr}")
        site.mkdir(exist_ok=True)
        subprocess.run(["tar", "-xJf", str(joined), "-C", str(site)], check=True)
        joined.unlink()
        log("bundle unpacked")
    # The project travels without its traces (they are in the checkout the calls run in, beside the
    # carry): link them in, so that a plan launched later without GPU_TRACES still finds them.
    checkout_traces = carry.resolve().parents[1] / "benchmarks" / "traces"
    proj_traces = PROJ / "benchmarks" / "traces"
    if checkout_traces.is_dir() and not proj_traces.exists():
        proj_traces.symlink_to(checkout_traces)
    router = WORK / "router"
    if not (parts / "router.tar.xz").exists():
        log("no vllm-router carried (prepare.sh ROUTER=0): plans with a router cannot run")
    elif not router.is_dir():
        router.mkdir()
        subprocess.run(["tar", "-xJf", str(parts / "router.tar.xz"), "-C", str(router)], check=True)
    for wheel in parts.glob("*.whl"):  # a wheel is a zip of what goes on the path
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(WORK / "gwsite")
    log("router and gateway wheels in place")


def show_steps(setup: Setup, plan: str, budget_s: float) -> None:
    """The plan's steps in order with what each is estimated to take (engine starts included), and
    which would run within ``budget_s`` if every step took its estimate; runs nothing."""
    current: Layout = ()
    total = 0.0
    for step in plan_steps(setup, plan):
        need = (step.layout() if callable(step.layout) else step.layout) or current
        start = 0.0 if need == current else engine_start_s(setup, need)
        estimate = step.estimate_s + start
        fits = total + estimate <= budget_s
        if fits:
            total += estimate
            current = need
        mark = "run " if fits else "skip"
        print(f"{mark} {estimate:6.0f} s {total:6.0f} s  {step.name}" + (f" (+{start:.0f} s engines)" if start else ""))


def extras(carry: Path) -> None:
    """Call 3, while the plan runs: redis-server's packages (the fleet scenes) and, with ``ROUTER=late``,
    vllm-router, put where the plan's later steps look for them."""
    debs = WORK / "redisdebs"
    debs.mkdir(parents=True, exist_ok=True)
    for item in carry.glob("*.deb"):
        shutil.copy(item, debs / item.name)
    router = carry / "router.tar.xz"
    if router.exists() and not (WORK / "router" / "vllm_router").is_dir():
        (WORK / "router").mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-xJf", str(router), "-C", str(WORK / "router")], check=True)
    log(f"extras in place: {len(list(debs.glob('*.deb')))} redis packages, router {(WORK / 'router').is_dir()}")


def launch(setup: Setup, plan: str, budget_s: float) -> None:
    """Start the plan in its own process session: it outlives this call."""
    WORK.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, str(Path(__file__).resolve()), "plan", "--plan", plan, "--budget-s", str(budget_s)]
    args += ["--engines", str(setup.engines)] + (["--graphs"] if setup.graphs else [])
    args += ["--fleet-runs", str(setup.state.get("fleet_runs", FLEET_RUNS))]
    if setup.state.get("only"):
        args += ["--only", setup.state["only"]]
    if "capacity_rps" in setup.state:
        args += ["--capacity-rps", str(setup.state["capacity_rps"])]
        args += ["--capacity-source", setup.state["capacity_source"]]
    if setup.dry:
        args += ["--dry", "--time-scale", str(setup.time_scale), "--sim-profile", setup.sim_profile]
        args += ["--rate-scale", str(setup.rate_scale)]
    # The plan clears it too, once its process runs: a ``wait`` sent at once would find the last plan's
    # mark and end before this one started (the device is then given back while it runs).
    DONE.unlink(missing_ok=True)
    with open(PLAN_LOG, "ab") as out:
        subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=PROJ)
    log(f"plan {plan} launched for {budget_s:.0f} s")


def follow(for_s: float, out: Path) -> None:
    """Print the plan's log as it grows, until it is done or ``for_s`` passes; then pack the results."""
    deadline = time.monotonic() + for_s
    offset = 0
    while True:
        if PLAN_LOG.exists():
            text = PLAN_LOG.read_bytes()[offset:]
            offset += len(text)
            sys.stdout.write(text.decode(errors="replace"))
            sys.stdout.flush()
        if DONE.exists() or time.monotonic() > deadline:
            break
        time.sleep(5)
    pack(out)


def pack(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    RES.mkdir(parents=True, exist_ok=True)
    if PLAN_LOG.exists():
        shutil.copy(PLAN_LOG, RES / "plan.log")
    archive = out / "gpu-results.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(RES, arcname="res")
    log(f"packed {archive} ({archive.stat().st_size / 1e6:.1f} MB); plan done: {DONE.exists()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("stage", "unpack", "extras", "launch", "wait", "plan", "run", "steps"))
    p.add_argument("--carry", type=Path, default=None, help="the carried folder of this call")
    plans = (
        "budgets",
        "budgets-again",
        "budgets-pairs",
        "fleet-itl-shipped",
        "full",
        "smoke",
        "repeat",
        "mixed",
        "fleet",
        "fleet-itl",
        "fleet-itl-pinned",
        "sessions",
        "sessions-tier",
    )
    p.add_argument("--plan", default="full", choices=plans)
    p.add_argument("--budget-s", type=float, default=1300.0, help="the plan's whole time, engine start included")
    p.add_argument("--for-s", type=float, default=560.0, help="wait: follow the plan this long, then pack")
    p.add_argument("--deadline-in-s", type=float, default=None, help="wait: move the plan's deadline to now + this")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--dry", action="store_true", help="simulated engines here instead of vLLM on the device")
    p.add_argument("--time-scale", type=float, default=0.15, help="dry: durations times this")
    p.add_argument("--sim-profile", default="h200-32b-fp8", help="dry: the simulated engines' profile")
    p.add_argument("--rate-scale", type=float, default=1.0, help="dry: the budgets plan's offered rates times this")
    p.add_argument("--graphs", action="store_true", help="real engines with CUDA graphs (no --enforce-eager)")
    p.add_argument("--only", default="", help="run only the plan's steps whose name matches this regex")
    p.add_argument("--fleet-runs", type=int, default=FLEET_RUNS, help="fleet-itl: runs of one and of four replicas")
    p.add_argument(
        "--capacity-rps",
        type=float,
        default=None,
        help="budgets-again, budgets-pairs: the engine's capacity measured before on this kind of card (no probe)",
    )
    p.add_argument("--capacity-source", default="given", help="where --capacity-rps was measured (recorded)")
    args = p.parse_args()
    out = Path(os.environ.get("OUT", WORK / "out"))
    if args.action == "stage":
        return stage(args.carry)
    if args.action == "unpack":
        return unpack(args.carry)
    if args.action == "extras":
        return extras(args.carry)
    if args.action == "wait":
        if args.deadline_in_s is not None:
            DEADLINE.write_text(str(time.time() + args.deadline_in_s))
            log(f"plan deadline moved to {args.deadline_in_s:.0f} s from now")
        return follow(args.for_s, out)
    setup = dry_setup(args.engines, args.time_scale, args.sim_profile) if args.dry else device_setup(args.engines)
    setup.graphs, setup.rate_scale = args.graphs, args.rate_scale
    setup.state.update(only=args.only, fleet_runs=args.fleet_runs)
    if args.capacity_rps is not None:
        setup.state.update(capacity_rps=args.capacity_rps, capacity_source=args.capacity_source)
    if args.action == "steps":
        return show_steps(setup, args.plan, args.budget_s)
    if args.plan in ("sessions", "sessions-tier"):
        setup.kv_cache_bytes = SESSIONS_KV_BYTES
    if args.action == "launch":
        return launch(setup, args.plan, args.budget_s)
    if args.action == "plan":
        return run_plan(setup, args.plan, args.budget_s)
    run_plan(setup, args.plan, args.budget_s)  # run: in the foreground
    pack(out)


if __name__ == "__main__":
    main()
