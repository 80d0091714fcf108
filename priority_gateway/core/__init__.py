"""The pure core: no I/O, no clocks, no asyncio.

Everything here takes time as an argument, so the HTTP server (wall clock) and the
cluster simulator (virtual clock) drive the very same decisions.
"""
