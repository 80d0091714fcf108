/opt/torch/.venv/bin/python3 -m priority_gateway serve --config /tmp/gpu/res/sessions-tier/ours-retention/gateway.json --port 8200
