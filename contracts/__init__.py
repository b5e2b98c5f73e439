"""User-facing contracts shared by the scheduler, the node agent and the dev tooling.

Only names (labels, annotations, taints) and the codecs of the documents stored under them
belong here. The package is pure: standard library only, no I/O, no project imports. Changing a
name here changes what users write in their manifests, so it needs a migration note in the README.
"""
