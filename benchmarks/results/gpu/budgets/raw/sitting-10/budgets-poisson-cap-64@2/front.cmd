/opt/torch/.venv/bin/python3 -m priority_gateway serve --config /tmp/gpu/res/budgets-poisson-cap-64@2/gateway.json --port 8200
