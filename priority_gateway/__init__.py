"""Priority-routing inference gateway for vLLM pools."""

__version__ = "0.1.0"
