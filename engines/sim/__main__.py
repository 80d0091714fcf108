from engines.sim.cli import main

main()
