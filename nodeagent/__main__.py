from common.leave import hear_stop, leave

hear_stop()  # first: a SIGTERM while starting is remembered, not ignored as PID 1

from nodeagent.wiring.cli import main  # noqa: E402

leave(main())
