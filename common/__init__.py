"""What both programs do the same way at run time: logging set-up, flag values, Event bodies.

Unlike :mod:`contracts` (names and document codecs, standard library only) this package may use
the logging library both programs ship with (structlog); like it, it does no I/O of its own and
imports neither program, nor any Kubernetes, HTTP, gRPC or NVML library.
"""
