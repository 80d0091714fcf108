"""Real vLLM engines on the lent GPU, the gateway and ``vllm-router`` in front, one plan of runs.

Rules:
- The device keeps nothing between sessions and only ~30 s between calls, so the whole plan runs
  in the background (its own process session) and outlives the call that started it; each call
  only follows it (``wait``) and brings back one archive of everything written so far
  (``$OUT/gpu-results.tgz``). The next call picks up where the last one stopped.
- Engines start once (``N`` vLLM engines of a 7B-shaped model with dummy weights, sharing the
  GPUs round robin) and serve every run; between runs only the front (gateway or router)
  restarts and every engine's prefix cache is reset (``POST /reset_prefix_cache``, which
  ``VLLM_SERVER_DEV_MODE=1`` enables), so each run starts cold.
- Every run writes its own folder: ``gateway bench`` results (with each request's cached tokens),
  the engines' ``/metrics`` before and after, the front's log and the command lines.
- The plan runs in priority order against a budget: a step that would not end in time is
  skipped and says so (``skipped.json``), so what ran is always packed.
- ``--dry`` runs the same plan here on simulated engines (``priority_gateway.engines.sim``), with durations scaled
  down, to check it before device time is spent.
"""

from __future__ import annotations

import argparse
import json
import os
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
from pathlib import Path

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
KV_CACHE_BYTES = 12 * 1024**3
ENGINE_ARGS = [
    "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "131072",
    "--gpu-memory-utilization", "0.22", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
    "--max-num-seqs", "128", "--max-num-batched-tokens", "8192", "--block-size", "16",
    "--enable-prefix-caching", "--enable-prompt-tokens-details",
]  # fmt: skip
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


@dataclass
class Setup:
    dry: bool
    engines: int = 4
    gpus: int = 1
    time_scale: float = 1.0
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    router_cmd: list[str] = field(default_factory=list)
    sim_profile: str = "h200-32b-fp8"

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{ENGINE_PORT + i}" for i in range(self.engines)]

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


def start_engines(setup: Setup) -> list[subprocess.Popen[bytes]]:
    procs = []
    logs = RES / "engines"
    logs.mkdir(parents=True, exist_ok=True)
    for i, url in enumerate(setup.urls):
        port = url.rsplit(":", 1)[1]
        env = dict(setup.env)
        if setup.dry:
            cmd = [
                setup.python,
                "-m",
                "priority_gateway.engines.sim",
                "--port",
                port,
                "--model",
                MODEL,
                "--profile",
                setup.sim_profile,
            ]
            cmd.append("--enable-prompt-tokens-details")
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(i % setup.gpus)
            cmd = [setup.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir())]
            cmd += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", port, *ENGINE_ARGS]
        (logs / f"engine{i + 1}.cmd").write_text(" ".join(cmd) + "\n")
        out = open(logs / f"engine{i + 1}.log", "ab")  # noqa: SIM115 - the engine outlives this call
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        log(f"engine {i + 1} starting on port {port}")
        if not setup.dry:
            time.sleep(8)  # staggered: profiling runs one at a time
    for i, (url, proc) in enumerate(zip(setup.urls, procs, strict=True)):
        if not wait_until(url + "/health", 420, lambda p=proc: p.poll() is None):
            tail = (logs / f"engine{i + 1}.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"engine {i + 1} did not come up:\n{tail}")
    log(f"{len(procs)} engines healthy")
    return procs


def engines_up(setup: Setup) -> bool:
    return all(http(url + "/health")[0] == 200 for url in setup.urls)


def reset_caches(urls: list[str]) -> list[int]:
    return [http(url + "/reset_prefix_cache", "POST", timeout=30)[0] for url in urls]


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
        policy = {"ca": "cache_aware", "ca-tuned": "cache_aware", "rr": "round_robin"}[name.removeprefix("vllmr-")]
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
        debs = sorted(Path(os.environ.get("GPU_REDIS_DEBS", PROJ / ".gpu/redis")).glob("*.deb"))
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


def plan_steps(setup: Setup, name: str) -> list[tuple[str, float, Callable[[], None]]]:
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


def time_left(default_deadline: float) -> float:
    """Seconds until the plan's deadline (``wait --deadline-in-s`` may move it)."""
    try:
        return float(DEADLINE.read_text()) - time.time()
    except (OSError, ValueError):
        return default_deadline - time.time()


def run_plan(setup: Setup, plan: str, budget_s: float) -> None:
    deadline = time.time() + budget_s
    DEADLINE.unlink(missing_ok=True)
    RES.mkdir(parents=True, exist_ok=True)
    DONE.unlink(missing_ok=True)
    gpu_log = None
    skipped: list[dict] = []
    engines: list[subprocess.Popen[bytes]] = []
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
        if not engines_up(setup):
            engines = start_engines(setup)
            warm_up(setup)
        for name, estimate, step in plan_steps(setup, plan):
            left = time_left(deadline)
            if estimate > left:
                skipped.append({"step": name, "estimate_s": round(estimate), "left_s": round(left)})
                log(f"skip {name}: needs ~{estimate:.0f} s, {left:.0f} s left")
                continue
            log(f"start {name} (~{estimate:.0f} s, {left:.0f} s left)")
            began = time.monotonic()
            try:
                step()
            except Exception as exc:  # a failed step must not lose the others
                log(f"FAILED {name}: {exc!r}")
                skipped.append({"step": name, "error": repr(exc)[:2000]})
            log(f"end {name} after {time.monotonic() - began:.0f} s")
    finally:
        (RES / "skipped.json").write_text(json.dumps(skipped, indent=1))
        if setup.dry:
            for proc in engines:
                stop(proc)
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


def launch(setup: Setup, plan: str, budget_s: float) -> None:
    """Start the plan in its own process session: it outlives this call."""
    WORK.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, str(Path(__file__).resolve()), "plan", "--plan", plan, "--budget-s", str(budget_s)]
    args += ["--engines", str(setup.engines)]
    if setup.dry:
        args += ["--dry", "--time-scale", str(setup.time_scale), "--sim-profile", setup.sim_profile]
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
    p.add_argument("action", choices=("stage", "unpack", "launch", "wait", "plan", "run"))
    p.add_argument("--carry", type=Path, default=None, help="the carried folder of this call")
    plans = ("full", "smoke", "repeat", "mixed", "fleet", "fleet-itl", "fleet-itl-pinned")
    p.add_argument("--plan", default="full", choices=plans)
    p.add_argument("--budget-s", type=float, default=1300.0, help="the plan's whole time, engine start included")
    p.add_argument("--for-s", type=float, default=560.0, help="wait: follow the plan this long, then pack")
    p.add_argument("--deadline-in-s", type=float, default=None, help="wait: move the plan's deadline to now + this")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--dry", action="store_true", help="simulated engines here instead of vLLM on the device")
    p.add_argument("--time-scale", type=float, default=0.15, help="dry: durations times this")
    p.add_argument("--sim-profile", default="h200-32b-fp8", help="dry: the simulated engines' profile")
    args = p.parse_args()
    out = Path(os.environ.get("OUT", WORK / "out"))
    if args.action == "stage":
        return stage(args.carry)
    if args.action == "unpack":
        return unpack(args.carry)
    if args.action == "wait":
        if args.deadline_in_s is not None:
            DEADLINE.write_text(str(time.time() + args.deadline_in_s))
            log(f"plan deadline moved to {args.deadline_in_s:.0f} s from now")
        return follow(args.for_s, out)
    setup = dry_setup(args.engines, args.time_scale, args.sim_profile) if args.dry else device_setup(args.engines)
    if args.action == "launch":
        return launch(setup, args.plan, args.budget_s)
    if args.action == "plan":
        return run_plan(setup, args.plan, args.budget_s)
    run_plan(setup, args.plan, args.budget_s)  # run: in the foreground
    pack(out)


if __name__ == "__main__":
    main()
