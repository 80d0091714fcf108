import sys

try:
    from priority_gateway.cli import main
except KeyboardInterrupt:  # Ctrl-C while the modules load: a stop, not a crash
    sys.exit(130)

sys.exit(main())
