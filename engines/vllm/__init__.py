"""Real vLLM on CPU-only machines: the pinned lock, the tiny test model and a pinned launcher."""
