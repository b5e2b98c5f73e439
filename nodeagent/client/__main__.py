import sys

from nodeagent.client.cli import main

sys.exit(main())
