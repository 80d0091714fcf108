/opt/torch/.venv/bin/python3 -m priority_gateway serve --config /tmp/gpu/res/sessions/ours-wait/gateway.json --port 8200
