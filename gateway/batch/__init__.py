"""OpenAI Files and Batches on top of the store."""

from gateway.batch.runner import BatchRunner, LineResponse
from gateway.batch.service import BatchService
from gateway.batch.settings import BatchSettings

__all__ = ["BatchRunner", "BatchService", "BatchSettings", "LineResponse"]
