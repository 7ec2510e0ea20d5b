"""Short runs of bench/hot_path.py and bench/chunk_latency.py: ratios, never absolute times.

Direct, the gateway with shadow sampling at 0% and at 10%, at 8 connections, 3 s per point;
and one stream's chunks, timed against the upstream's gap between them.
The bounds are generous (issue #10: a build fails when a ratio falls far below what
docs/performance.md reports), so a busy machine does not fail them but a hot-path regression
that halves throughput does.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import chunk_latency, hot_path

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

# Measured on the 2-core development machine (docs/performance.md): gateway / direct is
# 0.30-0.40 for chat and 0.68-0.72 for 16-chunk streams since the gateway's own upstream client
# (0.13-0.17 and 0.38-0.43 with aiohttp); 10% shadow keeps about 0.9 of the throughput.
MIN_CHAT_SHARE_OF_DIRECT = 0.08
MIN_STREAM_SHARE_OF_DIRECT = 0.2
MIN_THROUGHPUT_KEPT_WITH_SHADOW = 0.5
# A chunk's way through the gateway, in the upstream's gaps between chunks: measured 0.15.
MAX_CHUNK_DELAY_IN_GAPS = 2


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


def test_streamed_chunks_reach_the_client_as_they_are_sent(tmp_path: Path) -> None:
    """bench/chunk_latency.py, short: every stamped event arrives, and arrives in its turn.

    A gateway that held a stream's events back (buffered the answer, or relayed it only as a
    whole) would deliver them about half a stream late: 8 of the upstream's gaps on average.
    """
    out = tmp_path / "chunk_latency.json"
    gap_ms = 2.0
    chunk_latency.main(
        ["--streams", "1", "--seconds", "1", "--gap-ms", str(gap_ms), "--out", str(out)]
    )
    point = json.loads(out.read_text())["points"]["1"]
    direct, through = point["direct"], point["gateway"]
    assert through["failures"] == 0 and through["events"] > 0, point
    assert through["events"] >= 0.5 * direct["events"], point
    assert through["p50_ms"] < MAX_CHUNK_DELAY_IN_GAPS * gap_ms, point
