"""What both programs do the same way at run time: logging set-up, flag values, Event bodies,
the list/watch/relist loop (:mod:`common.listwatch`) and the kubeconfig loader
(:mod:`common.kubeconfig`, which ``kubectl shoal`` uses too).

Unlike :mod:`contracts` (names and document codecs, standard library only) this package may use
the libraries both programs ship with (structlog, PyYAML); like it, it imports neither program,
nor any Kubernetes, HTTP, gRPC or NVML library: the loop is driven by each program's own
transport, and the loader's configuration is turned into a client by its caller. Its only I/O is
reading the kubeconfig and service-account files.
"""
