"""The loopback processes' ports: free when handed out, and not where the host's clients take theirs."""

import socket
from pathlib import Path

from priority_gateway.loopback import free_port


def test_a_free_port_is_bindable_and_below_the_ephemeral_range_clients_draw_from():
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(port < first_ephemeral for port in ports), (ports, first_ephemeral)
    assert len(ports) > 1, "drawn at random, not one port handed to every caller"
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
