"""OpenAI Files and Batches on top of the store."""

from priority_gateway.batch.runner import BatchRunner, LineResponse
from priority_gateway.batch.service import BatchService
from priority_gateway.batch.settings import BatchSettings

__all__ = ["BatchRunner", "BatchService", "BatchSettings", "LineResponse"]
