"""The core's refusal reasons as HTTP answers: every reason has one, with the right status."""

import orjson
import pytest

from priority_gateway.core.reasons import Refusal
from priority_gateway.http.refusals import ANSWERS, refused


def test_every_reason_the_core_gives_has_an_answer():
    assert set(ANSWERS) == set(Refusal)


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (Refusal.INVALID_PRIORITY, 400),
        (Refusal.INVALID_HEADER, 400),
        (Refusal.CLASS_NOT_ALLOWED, 403),
        (Refusal.NO_HEALTHY_ENGINE, 503),
        (Refusal.QUEUE_FULL, 429),
        (Refusal.SHED, 429),
        (Refusal.SLO_BUDGET_EXCEEDED, 429),
        (Refusal.DEADLINE_EXCEEDED, 429),
    ],
)
def test_a_refusal_is_an_openai_error_with_its_status_and_code(reason, status):
    error = refused(reason, "why", "X-Priority", retry_after_s=2.0)
    assert error.status == status
    body = orjson.loads(error.body())["error"]
    assert body["code"] == reason.value and body["message"] == "why" and body["param"] == "X-Priority"
    assert (b"retry-after", b"2") in error.response_headers()
