"""The web view in headless Chromium against a real scheduler on the devcluster: at each moment
of a scenario (a gang admitted, a node under notice, a reclaim, the room taken) the page shows
the expected gangs on the expected nodes, and a stage change (a lowered maximum) with what
`kubectl shoal why` says and the bound change, read from its DOM as it updates live; the PNGs are
kept under build/web-view/. Markup in what users write is shown as text, and every write is
refused with 405."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts import names
from devcluster.ports import free_port
from tests.integration.scheduler.browser import Chromium, binary
from tests.integration.scheduler.conftest import (
    ROOT,
    Pods,
    Pool,
    SchedulerProcess,
    ensure_priority_class,
)
from tests.integration.scheduler.test_kubectl_shoal import notice_on
from tests.waiting import eventually

ARTEFACTS = ROOT / "build" / "web-view"
#: Not a valid gang name anywhere, but a legal annotation value: it reaches the page in the
#: reason the gang cannot be read (which quotes up to 40 characters of it).
MARKUP = "<img src=x onerror=document.title=1>"

#: Per node shown, how many GPU cells each gang colours.
PLACEMENT = """(() => {
  const out = {};
  for (const node of document.querySelectorAll('#cluster [data-node]')) {
    const cells = {};
    for (const cell of node.querySelectorAll('[data-gang]')) {
      cells[cell.dataset.gang] = (cells[cell.dataset.gang] || 0) + 1;
    }
    out[node.dataset.node] = cells;
  }
  return out;
})()"""
TIMELINE = "[...document.querySelectorAll('#timeline li')].map(li => li.dataset.kind)"


@pytest.fixture
def chromium() -> Iterator[Chromium]:
    found = binary()
    if isinstance(found, str):
        pytest.skip(f"the web view's browser test needs Chromium: {found}")
    browser = Chromium(found)
    try:
        yield browser
    finally:
        browser.close()


def _placement(chromium: Chromium, nodes: list[str]) -> dict[str, dict[str, int]]:
    shown: dict[str, dict[str, int]] = chromium.evaluate(PLACEMENT) or {}
    return {n: shown.get(n, {}) for n in nodes}


def _write(url: str, method: str) -> int:
    request = urllib.request.Request(url, data=b"{}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_page_follows_a_scenario_live(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    chromium: Chromium,
) -> None:
    ns, devcluster = pods.namespace, pods.devcluster
    ensure_priority_class(devcluster, "shoal-test-high", 100000)
    first, second = pool.add(2, gpus=8, island_size=4)
    port = free_port()
    # Victims are asked to leave and given ten minutes: the page shows them leaving until the
    # test deletes them, as their workers would after saving.
    start_scheduler("--web-view", str(port), "--reclaim-grace", "600")
    url = f"http://127.0.0.1:{port}"
    alpha, beta, odd = f"{ns}/alpha", f"{ns}/beta", f"{ns}/odd"
    members = pods.gang("alpha", 4, gpus=4, min_member=2, max_member=4)
    pods.create(
        "odd-0", labels={names.GANG_LABEL: "odd"}, annotations={names.MIN_MEMBER_ANNOTATION: MARKUP}
    )
    chromium.open(url + "/")

    # 1. Admitted: alpha at its maximum, four members of 4 GPUs, one NVLink island each.
    eventually(
        lambda: _placement(chromium, [first, second]) == {first: {alpha: 8}, second: {alpha: 8}},
        what="alpha on both nodes' 16 GPUs in the page",
    )
    invalid = eventually(
        lambda: chromium.evaluate(
            f"[...document.querySelectorAll('#invalid tr[data-gang=\"{odd}\"] td')]"
            ".map(td => td.textContent)"
        ),
        what="the unreadable gang in the page",
    )
    assert MARKUP in invalid[2]  # shown as the text it is
    assert chromium.evaluate("document.querySelectorAll('img').length") == 0
    assert chromium.evaluate("document.title") == "Shoal"
    row = chromium.evaluate(
        f"[...document.querySelectorAll('#gangs tr[data-gang=\"{alpha}\"] td')]"
        ".map(td => td.textContent)"
    )
    assert row[2:6] == ["Admitted", "4", "2", "4"]
    chromium.screenshot(ARTEFACTS / "1-admitted.png")

    # 2. A notice on the first node: marked revoking, and on the timeline.
    notice_on(devcluster, first, datetime.now(UTC) + timedelta(minutes=5))
    eventually(
        lambda: (
            chromium.evaluate(
                f"document.querySelector('[data-node=\"{first}\"]').classList.contains('revoking')"
            )
            and "notice" in chromium.evaluate(TIMELINE)
        ),
        what="the first node marked revoking, with a notice on the timeline",
    )
    assert _placement(chromium, [first, second]) == {first: {alpha: 8}, second: {alpha: 8}}
    chromium.screenshot(ARTEFACTS / "2-notice.png")

    # 3. A reclaim: beta (higher priority, two 4-GPU members) cannot use the revoking node,
    # so alpha's two surplus members on the second node are asked to leave for it.
    pods.gang("beta", 2, gpus=4, min_member=2, priority_class="shoal-test-high")
    on_second = sorted(p for p, n in pods.bound(members).items() if n == second)
    leaving = f"document.querySelectorAll('[data-node=\"{second}\"] .cell.leaving').length"
    eventually(
        lambda: (
            chromium.evaluate(leaving) == 8 and chromium.evaluate(TIMELINE).count("reclaim") == 2
        ),
        what="alpha's members on the second node shown leaving, two reclaims on the timeline",
    )
    beta_row: list[str] = eventually(
        lambda: (
            (
                r := chromium.evaluate(
                    f"[...document.querySelectorAll('#gangs tr[data-gang=\"{beta}\"] td')]"
                    ".map(td => td.textContent)"
                )
            )
            and r[8]
            and r
        ),
        what="beta in the queue with its reason",
    )
    assert (beta_row[0], beta_row[2], beta_row[3]) == ("1", "Waiting", "0")
    assert (
        chromium.evaluate(
            f"document.querySelectorAll('[data-node=\"{first}\"] .cell.leaving').length"
        )
        == 0
    )
    chromium.screenshot(ARTEFACTS / "3-reclaim.png")

    # ...and once the victims have left, beta is on the second node, alpha on the first.
    pods.delete(on_second)
    eventually(
        lambda: _placement(chromium, [first, second]) == {first: {alpha: 8}, second: {beta: 8}},
        what="beta on the second node, alpha on the first, in the page",
    )
    assert "bind" in chromium.evaluate(TIMELINE)
    chromium.screenshot(ARTEFACTS / "4-reclaimed.png")

    # 5. A stage change: alpha's maximum lowered to the two members it has. The row says what
    # `kubectl shoal why` says, and the change is kept with its time, on the row and the timeline.
    for name in sorted(set(members) - set(on_second)):
        devcluster.core().patch_namespaced_pod(
            name, ns, {"metadata": {"annotations": {names.MAX_MEMBER_ANNOTATION: "2"}}}
        )
    alpha_row: list[str] = eventually(
        lambda: (
            (
                r := chromium.evaluate(
                    f"[...document.querySelectorAll('#gangs tr[data-gang=\"{alpha}\"] td')]"
                    ".map(td => td.textContent)"
                )
            )
            and r[9]
            and r
        ),
        what="alpha's bound change in the page",
    )
    assert alpha_row[5] == "2"
    assert alpha_row[8] == "Admitted: 2 of min 2 (max 2) bound."
    assert re.fullmatch(r"max 4 -> 2 at \d\d:\d\d:\d\d", alpha_row[9]), alpha_row[9]
    assert "bounds" in chromium.evaluate(TIMELINE)
    chromium.screenshot(ARTEFACTS / "5-bounds.png")

    # Read-only: every write, on every path, is refused, and the page still shows the same.
    for path in ("/", "/state", "/events", "/app.js", "/anything"):
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            assert (path, method, _write(url + path, method)) == (path, method, 405)
    shown: Any = _placement(chromium, [first, second])
    assert shown == {first: {alpha: 8}, second: {beta: 8}}
