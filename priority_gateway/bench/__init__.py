"""``gateway bench``: load tests of any OpenAI-compatible endpoint, with a report.

``workload`` says what to send, ``loadgen`` sends it (closed loop or trace replay) and
times every streamed chunk, ``stats`` turns the timings into the numbers, ``report``
writes results.json, report.png and report.html, ``cli`` ties them to the command line.
"""
