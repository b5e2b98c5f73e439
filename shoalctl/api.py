"""Reads from the API server, with the user's kubeconfig and rights: ``list`` of pods, nodes,
Events and the PodGroup kinds, nothing else (``kubectl shoal`` never writes).

The kubeconfig is found as kubectl finds it: ``--kubeconfig``, else ``$KUBECONFIG`` (a list of
files, merged), else ``~/.kube/config``, else the in-cluster service account. A PodGroup kind the
cluster does not serve, or that the user may not list, is read as none (with a note on stderr
for the latter); PriorityClasses (for a Volcano PodGroup's priority) likewise.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from common import kubeconfig as kubeconfigs
from scheduler.gang.kinds import KINDS, Api, Kinds
from scheduler.model import PodGroup
from shoalctl.views import Cluster


class ReadError(Exception):
    """The cluster could not be read; the message says what and why, for the terminal."""


def connect(kubeconfig: str | None, context: str | None) -> Any:
    """An ApiClient from the kubeconfig kubectl would use (:mod:`common.kubeconfig`)."""
    try:
        found = kubeconfigs.load(kubeconfig, context=context, discover=True)
        return kubeconfigs.official_client(found, client, config)
    except kubeconfigs.NotFound:
        files = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ReadError(
            f"no kubeconfig found ({files}) and not running in a cluster; "
            "pass --kubeconfig or set KUBECONFIG"
        ) from None
    except kubeconfigs.KubeconfigError as exc:  # it names the file and the field
        raise ReadError(f"cannot use {exc}") from None
    except (ConfigException, OSError) as exc:  # the official loader, for a credential plugin
        where = kubeconfig or os.pathsep.join(kubeconfigs.kubeconfig_files(None))
        raise ReadError(f"cannot use kubeconfig {where}: {exc}") from None


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig's context (``default`` when none), as kubectl uses it."""
    return kubeconfigs.namespace(kubeconfig, context)


def _items(response: Any) -> list[dict[str, Any]]:
    doc = json.loads(response.data)
    return list(doc.get("items") or [])


def _denied(what: str, exc: ApiException) -> ReadError:
    return ReadError(f"cannot list {what}: {exc.status} {exc.reason}")


class Reader:
    def __init__(self, api: Any, kinds: Kinds = KINDS) -> None:
        self.kinds = kinds
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.scheduling = client.SchedulingV1Api(api)

    def pods(self, namespace: str | None) -> list[dict[str, Any]]:
        try:
            if namespace is None:
                return _items(self.core.list_pod_for_all_namespaces(_preload_content=False))
            return _items(self.core.list_namespaced_pod(namespace, _preload_content=False))
        except ApiException as exc:
            raise _denied("pods", exc) from None

    def nodes(self) -> list[dict[str, Any]]:
        try:
            return _items(self.core.list_node(_preload_content=False))
        except ApiException as exc:
            raise _denied("nodes", exc) from None

    def events(self, namespace: str | None) -> list[dict[str, Any]]:
        try:
            if namespace is None:
                return _items(self.core.list_event_for_all_namespaces(_preload_content=False))
            return _items(self.core.list_namespaced_event(namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 403:
                print(
                    f"note: cannot list events ({exc.reason}); reasons may be missing",
                    file=sys.stderr,
                )
                return []
            raise _denied("events", exc) from None

    def _groups(self, api: Api, namespace: str | None) -> list[Any]:
        """The objects of one PodGroup kind, in the newest of its versions served."""
        for version in api.versions:
            try:
                if namespace is None:
                    found = self.custom.list_cluster_custom_object(api.group, version, api.plural)
                else:
                    found = self.custom.list_namespaced_custom_object(
                        api.group, version, namespace, api.plural
                    )
            except ApiException as exc:
                if exc.status == 404:
                    continue
                if exc.status == 403:
                    print(f"note: cannot list {api.resource} ({exc.reason})", file=sys.stderr)
                    return []
                raise _denied(api.resource, exc) from None
            return list(found.get("items") or [])
        return []

    def priorities(self) -> dict[str, int]:
        try:
            found = _items(self.scheduling.list_priority_class(_preload_content=False))
        except ApiException:
            return {}
        return {str(i["metadata"]["name"]): int(i.get("value") or 0) for i in found}

    def pod_groups(self, namespace: str | None) -> list[PodGroup]:
        found = [(kind, self._groups(kind.api, namespace)) for kind in self.kinds]
        wanted = any(kind.uses_priorities and raws for kind, raws in found)
        priorities = self.priorities() if wanted else {}
        return [kind.convert(raw, priorities) for kind, raws in found for raw in raws]

    def cluster(self, namespace: str | None, *, with_events: bool = True) -> Cluster:
        return Cluster(
            pods=self.pods(namespace),
            nodes=[],
            events=self.events(namespace) if with_events else [],
            groups=self.pod_groups(namespace),
        )

    def node_view(self) -> Cluster:
        return Cluster(pods=self.pods(None), nodes=self.nodes(), events=[], groups=[])
