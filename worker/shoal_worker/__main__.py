import sys

from shoal_worker.cli import main

sys.exit(main())
