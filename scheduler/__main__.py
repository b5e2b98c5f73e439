"""``python -m scheduler --kubeconfig PATH [--config FILE]``; see ``--help`` for every option."""

from __future__ import annotations

import sys

from common.leave import hear_stop, leave

hear_stop()  # first: a SIGTERM while starting is remembered, not ignored as PID 1

from scheduler.settings import SettingsError, resolve  # noqa: E402


def main() -> int:
    try:
        settings = resolve()
    except SettingsError as exc:
        print(f"python -m scheduler: {exc}", file=sys.stderr)
        return 2
    from scheduler.app import run

    return run(settings)


if __name__ == "__main__":
    leave(main())
