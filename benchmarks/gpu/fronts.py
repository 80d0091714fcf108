"""The fronts of the budgets plan by name: what the harness's plan (on the device's bare Python, which
has none of the gateway's dependencies) and ``budgets`` (which imports the gateway) both read.

Rules:
- ``cap-N`` is the gateway with every limit pinned at N; ``engine-cap-N`` the engine's own
  ``--max-num-seqs N`` with admission off.
- ``FRONT@K`` is the K-th run of ``FRONT`` (``ours-admission@2``); ``front_kind`` drops the tag.
"""

from __future__ import annotations


def is_cap(front: str) -> bool:
    return front.startswith(("cap-", "engine-cap-"))


def front_kind(front: str) -> str:
    """What a front is, without its repeat's tag (``ours-admission@2`` is a second run of ``ours-admission``)."""
    return front.split("@", 1)[0]


def is_ours(front: str) -> bool:
    """The gateway learning its limit, in any of its runs (``ours-admission``, ``ours-admission@2``)."""
    return front_kind(front) == "ours-admission"
