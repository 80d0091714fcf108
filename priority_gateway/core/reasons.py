"""Why the core turns a request away: one reason per case, never an HTTP status.

The HTTP layer maps each reason to a status and an OpenAI error code in one table
(``priority_gateway/http/refusals.py``); the simulator counts them as they are. A reason's value is the
error code clients have always seen for it, and the label of ``gateway_admission_total``.
"""

from __future__ import annotations

from enum import StrEnum


class Refusal(StrEnum):
    # Classification (``classes``): what the request asked for cannot be given.
    INVALID_PRIORITY = "invalid_priority"
    """``X-Priority`` names no class."""
    INVALID_HEADER = "invalid_header"
    """A per-request budget header is not a positive number of milliseconds."""
    CLASS_NOT_ALLOWED = "class_not_allowed"
    """The API key may not use the class asked for."""
    # Admission (``dispatcher``): the request cannot be served now.
    NO_HEALTHY_ENGINE = "no_healthy_engine"
    """No engine of the pool that may serve the request's model answers its health checks."""
    MODEL_NOT_SERVED = "model_not_found"
    """No engine of any pool lists the request's model (an alias to a model nobody serves)."""
    QUEUE_FULL = "queue_full"
    """The pool's queue is at ``admission.max_queue``."""
    SHED = "shed"
    """A queued batch request gave its place to interactive work."""
    SLO_BUDGET_EXCEEDED = "slo_budget_exceeded"
    """It could not start within its time-to-first-token budget."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """Its deadline passed while it was queued."""
