"""The HTTP layer: a thin ASGI front that parses the least it must and calls the core."""
