"""How hard the property tests search, by hypothesis profile.

- ``thorough`` (the default): each test tries its own count of examples, drawn afresh every run.
- ``ci`` (where ``CI`` is set, as hypothesis itself decides): hypothesis's CI settings (derandomized, no
  example database, the blob to reproduce a failure printed) and a quarter of each test's count: every
  property still runs on every commit, with the same examples each time, in a fraction of the time.

``HYPOTHESIS_PROFILE=thorough`` or ``HYPOTHESIS_PROFILE=ci`` picks one whatever ``CI`` says.
"""

from __future__ import annotations

import math
import os

from hypothesis import settings

CI_SHARE = 0.25
"""The share of each test's examples that the ``ci`` profile tries."""
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if "CI" in os.environ else "thorough")


def load_profile() -> None:
    """Register both profiles and load ``PROFILE`` (``tests/conftest.py``, before any test module)."""
    default = settings.get_profile("default")
    settings.register_profile("thorough", default)
    settings.register_profile("ci", settings.get_profile("ci"), max_examples=examples(default.max_examples, "ci"))
    settings.load_profile(PROFILE)


def examples(thorough: int, profile: str = PROFILE) -> int:
    """A test's count of examples: ``thorough`` in the thorough profile, its share in ``ci``."""
    if profile == "thorough":
        return thorough
    if profile == "ci":
        return max(1, math.ceil(thorough * CI_SHARE))
    raise ValueError(f"HYPOTHESIS_PROFILE={profile!r}: expected thorough or ci")
