from priority_gateway.engines.sim.cli import main

main()
