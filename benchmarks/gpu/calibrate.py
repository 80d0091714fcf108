"""Step times of one real vLLM engine on the device, for fitting a simulator profile.

The phases of ``benchmarks/vllm_calibration.py`` (TTFT of a lone request by prompt length, ITL
while n sequences decode, TTFT of a repeated prompt, a closed loop, cold against warm), sized for
a 7B model on an H200, run against an engine already serving (the other engines idle), and
written in the same raw form so ``vllm_calibration.fit_report`` fits it:

    python3 benchmarks/gpu/calibrate.py --url http://127.0.0.1:8101 --model llama7b --out calibration.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vllm_calibration as vc

FULL = {
    "ttft_lengths": [128, 512, 1024, 2048, 4096, 8192, 16384, 32768],
    # 64 sequences of 4096 tokens (266k) outgrow the engine's 225k-token cache; the first run at 64
    # also lost its connection (httpx.ReadError, cause not established): 48 is what was measured.
    "decode_seqs": [1, 4, 16, 48],
    "itl_prompt_lengths": [512, 4096],
    "warm_lengths": [1024, 4096, 16384],
    "concurrency": [1, 8, 32],
    "reps": 3,
    "rounds": 3,
}
QUICK = {**FULL, "ttft_lengths": [128, 1024], "decode_seqs": [1, 4], "itl_prompt_lengths": [512]}
QUICK |= {"warm_lengths": [1024], "concurrency": [1, 4], "reps": 1, "rounds": 2}


async def measure(url: str, sizes: dict) -> dict:
    prompts = vc.Prompts(0)
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    out: dict = {"sizes": sizes, "phase_s": {}}
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        for _ in range(3):
            await vc.stream_completion(client, prompts.unique(256), 8)
        out["vllm"] = (await client.get("/version")).json().get("version")
        phases = {
            "ttft_vs_prompt": lambda: vc.measure_ttft_vs_prompt(client, prompts, sizes["ttft_lengths"], sizes["reps"]),
            "itl_vs_decode_seqs": lambda: vc.measure_itl_vs_decode_seqs(
                client, prompts, sizes["decode_seqs"], sizes["itl_prompt_lengths"], 64, 1
            ),
            "warm_ttft_vs_cached": lambda: vc.measure_warm_ttft_vs_cached(
                client, prompts, sizes["warm_lengths"], sizes["reps"]
            ),
            "closed_loop": lambda: vc.measure_closed_loop(
                client, prompts, sizes["concurrency"], 1000, 64, sizes["rounds"]
            ),
            "warm_vs_cold": lambda: vc.measure_warm_vs_cold(client, prompts, 1000, sizes["reps"], 2),
        }
        for name, phase in phases.items():
            began = time.monotonic()
            out[name] = await phase()
            out["phase_s"][name] = round(time.monotonic() - began, 1)
            vc.log("phase_done", phase=name, seconds=out["phase_s"][name])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true", help="a few points only (a dry run on simulated engines)")
    args = p.parse_args()
    vc.MODEL = args.model  # the served model name the phases ask for
    raw = asyncio.run(measure(args.url, QUICK if args.quick else FULL))
    raw["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    raw["command"] = " ".join(["python3", *sys.argv])
    args.out.write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
