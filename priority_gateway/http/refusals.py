"""The core's refusals as HTTP answers: one table of status and OpenAI error code per reason."""

from __future__ import annotations

from priority_gateway.core.reasons import Refusal
from priority_gateway.errors import ApiError

ANSWERS: dict[Refusal, tuple[int, str]] = {
    Refusal.INVALID_PRIORITY: (400, "invalid_priority"),
    Refusal.INVALID_HEADER: (400, "invalid_header"),
    Refusal.CLASS_NOT_ALLOWED: (403, "class_not_allowed"),
    Refusal.NO_HEALTHY_ENGINE: (503, "no_healthy_engine"),
    Refusal.MODEL_NOT_SERVED: (404, "model_not_found"),
    Refusal.QUEUE_FULL: (429, "queue_full"),
    Refusal.SHED: (429, "shed"),
    Refusal.SLO_BUDGET_EXCEEDED: (429, "slo_budget_exceeded"),
    Refusal.DEADLINE_EXCEEDED: (429, "deadline_exceeded"),
}


def refused(reason: Refusal, message: str, param: str | None = None, retry_after_s: float | None = None) -> ApiError:
    status, code = ANSWERS[reason]
    return ApiError(status, message, code, param, retry_after_s=retry_after_s)
