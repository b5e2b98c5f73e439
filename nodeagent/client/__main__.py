"""``python -m nodeagent.client wait | ack STEP``: ``python -m shoal_worker`` by its old name."""

import sys

from shoal_worker.cli import main

sys.exit(main())
