import sys

from nodeagent.wiring.cli import main

sys.exit(main())
