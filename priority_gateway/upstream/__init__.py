"""Everything that talks to engines: the HTTP/1.1 client, relay, health and metrics scrapes."""
