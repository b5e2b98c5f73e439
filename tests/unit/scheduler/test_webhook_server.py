"""The webhook's answers and its CA bundle upkeep, without an API server."""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
from pathlib import Path

import pytest

from scheduler.k8s.webhook_config import merged_bundle
from scheduler.webhook import certs
from scheduler.webhook.server import NotAReview, answer
from scheduler.webhook.wiring import Layout


def review(pod: object) -> dict[str, object]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "namespace": "ns", "object": pod},
    }


def test_a_shoal_pod_is_allowed_with_a_patch_and_another_without() -> None:
    pod = {"spec": {"schedulerName": "shoal-scheduler", "containers": [{"name": "c"}]}}
    body, warnings = answer(review(pod), "shoal-scheduler", Layout())
    response = body["response"]
    assert (response["uid"], response["allowed"], warnings) == ("u-1", True, ())
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {op["path"] for op in patch} >= {"/spec/volumes", "/spec/containers/0/env"}
    other, _ = answer(review({"spec": {"containers": []}}), "shoal-scheduler", Layout())
    assert other["response"] == {"uid": "u-1", "allowed": True}


def test_a_bad_request_is_allowed_with_its_warning() -> None:
    pod = {
        "metadata": {
            "annotations": {"shoal.dev/checkpoint-claim": "a", "shoal.dev/checkpoint-size": "1Gi"}
        },
        "spec": {"schedulerName": "shoal-scheduler", "containers": [{"name": "c"}]},
    }
    body, warnings = answer(review(pod), "shoal-scheduler", Layout())
    assert body["response"]["allowed"] is True
    assert body["response"]["warnings"] == list(warnings)
    assert "not both" in warnings[0]


@pytest.mark.parametrize(
    "body",
    [[], {"apiVersion": "admission.k8s.io/v1beta1"}, {"apiVersion": "admission.k8s.io/v1"}],
)
def test_what_is_not_an_admission_review_is_refused(body: object) -> None:
    with pytest.raises(NotAReview):
        answer(body, "shoal-scheduler", Layout())


def test_the_bundle_keeps_our_ca_and_the_newest_others() -> None:
    now = datetime.datetime.now(datetime.UTC)
    cas = [certs.make(["127.0.0.1"], now).ca_pem for _ in range(6)]
    bundle = b""
    for ca in cas:
        bundle = merged_bundle(bundle, ca, keep=4)
    assert bundle == b"".join(cas[-4:])
    assert merged_bundle(bundle, cas[-1], keep=4) == bundle
    assert merged_bundle(bundle, cas[-2], keep=4).endswith(cas[-2])


def test_a_certificate_without_its_key_is_refused_naming_where() -> None:
    from scheduler.settings import SettingsError, resolve

    with pytest.raises(SettingsError, match=r"^env SHOAL_SCHEDULER_WEBHOOK_CERT: .*together"):
        resolve([], {"SHOAL_SCHEDULER_WEBHOOK_CERT": "/tls/tls.crt"})
    settings = resolve(["--webhook-cert", "/tls/tls.crt", "--webhook-key", "/tls/tls.key"], {})
    assert (settings.webhook, settings.webhook_port) == (False, 9443)


def test_a_certificate_file_is_loaded_again_when_it_changes(tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    context = certs.server_context()
    pair = certs.FilePair(cert, key)
    for generation, made in enumerate(certs.make(["webhook.svc"], now) for _ in range(2)):
        cert.write_bytes(made.cert_pem)
        key.write_bytes(made.key_pem)
        os.utime(cert, (generation + 1, generation + 1))  # rotated: a new modification time
        assert pair.load_if_changed(context)
        assert not pair.load_if_changed(context)
    key.write_bytes(b"not a key")
    os.utime(key, (9, 9))
    with pytest.raises(ssl.SSLError):  # an OSError: logged by the program, the old pair serves
        pair.load_if_changed(context)
