import sys

# structlog imports rich, when it is installed, only to pretty-print tracebacks on a terminal.
# The agent logs JSON in its pod and its resident memory budget is 64 MiB, of which rich alone
# would take about 3.4 MiB; without it structlog prints plain tracebacks.
sys.modules.setdefault("rich", None)  # type: ignore[arg-type]

from nodeagent.cli import main  # noqa: E402

sys.exit(main())
