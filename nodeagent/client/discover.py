"""``python -m nodeagent.client.discover``: Horovod host discovery (see
nodeagent.adapters.k8s.discover)."""

import sys

from nodeagent.adapters.k8s.discover import main

if __name__ == "__main__":
    sys.exit(main())
