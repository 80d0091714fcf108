/opt/torch/.venv/bin/python3 -m priority_gateway serve --config /tmp/gpu/res/budgets-poisson-ours-admission/gateway.json --port 8200
