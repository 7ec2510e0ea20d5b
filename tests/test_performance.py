"""A short run of bench/hot_path.py: the gateway's throughput as ratios, never absolute times.

Direct, the gateway with shadow sampling at 0% and at 10%, at 8 connections, 3 s per point.
The bounds are generous (issue #10: a build fails when a ratio falls far below what
docs/performance.md reports), so a busy machine does not fail them but a hot-path regression
that halves throughput does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import hot_path

pytestmark = [
    pytest.mark.skipif(
        shutil.which("wrk") is None,
        reason="wrk is not installed: `apt-get install wrk` (make test tries as root)",
    ),
    pytest.mark.skipif(
        shutil.which("taskset") is None or (os.cpu_count() or 1) < 2,
        reason="needs taskset and two cores: the server is pinned apart from wrk and upstream",
    ),
]

# Measured on the 2-core development machine (docs/performance.md): gateway / direct is about
# 0.13 for chat and 0.4 for 16-chunk streams; 10% shadow keeps about 0.9 of the throughput.
MIN_CHAT_SHARE_OF_DIRECT = 0.05
MIN_STREAM_SHARE_OF_DIRECT = 0.15
MIN_THROUGHPUT_KEPT_WITH_SHADOW = 0.5


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = Path(tmp_path_factory.mktemp("hot-path")) / "hot_path.json"
    argv = [
        "--seconds", "3", "--warmup", "1", "--connections", "8",
        "--paths", "direct,gateway,gateway-shadow10", "--out", str(out),
    ]  # fmt: skip
    return hot_path.run(hot_path.parse_args(argv))


def test_every_request_through_the_gateway_succeeds(results: dict[str, Any]) -> None:
    for name, row in results["paths"].items():
        for mode in hot_path.MODES:
            point = row[mode]["8"]
            assert point["rps"] > 0, (name, mode, point)
            assert point["non_2xx"] == 0 and point["socket_errors"] == 0, (name, mode, point)


def test_gateway_keeps_a_generous_share_of_direct_throughput(results: dict[str, Any]) -> None:
    ratios = results["ratios"]
    assert ratios["gateway/direct chat @8"] >= MIN_CHAT_SHARE_OF_DIRECT, ratios
    assert ratios["gateway/direct stream @8"] >= MIN_STREAM_SHARE_OF_DIRECT, ratios


def test_ten_percent_shadow_sampling_keeps_most_of_the_throughput(
    results: dict[str, Any],
) -> None:
    ratios = results["ratios"]
    assert ratios["shadow10/shadow0 chat @8"] >= MIN_THROUGHPUT_KEPT_WITH_SHADOW, ratios
    copies = results["paths"]["gateway-shadow10"]["shadow_copies"]
    assert copies.get("sent", 0) > 0, copies  # the 10% path really mirrors
