/opt/torch/.venv/bin/python3 -m priority_gateway serve --config /tmp/gpu/res/sessions-tier/ours-wait/gateway.json --port 8200
