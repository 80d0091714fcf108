import sys

from priority_gateway.cli import main

sys.exit(main())
