"""Short runs of bench/hot_path.py, bench/tail_windows.py and bench/chunk_latency.py: ratios,
never absolute times.

Direct, the gateway with shadow sampling at 0% and at 10%, at 8 connections, 3 s per point;
and one stream's chunks, timed against the upstream's gap between them.
The bounds are generous (issue #10: a build fails when a ratio falls far below what
docs/performance.md reports), so a busy machine does not fail them but a hot-path regression
that doubles the work per request does. They bound CPU time per request, which another job on
the machine hardly moves, rather than throughput, which it can cut by five: each path is pinned
to a core that job may share.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import chunk_latency, hot_path, tail_windows

pytestmark = [
    pytest.mark.alone,  # it takes both cores, and measures them
    pytest.mark.skipif(
        shutil.which("wrk") is None,
        reason="wrk is not installed: `apt-get install wrk` (make test tries as root)",
    ),
    pytest.mark.skipif(
        shutil.which("taskset") is None or (os.cpu_count() or 1) < 2,
        reason="needs taskset and two cores: the server is pinned apart from wrk and upstream",
    ),
]

# Measured on the 2-core development machine, one core kept busy by another process: the
# gateway spends 10.4 times the CPU per chat request that the upstream it relays to does (374
# against 36 us), 4.4 times per 16-chunk stream (523 against 118 us), and 10% shadow sampling
# adds 23% (460 us). The bounds are about twice that.
MAX_CHAT_CPU_OVER_DIRECT = 20.0
MAX_STREAM_CPU_OVER_DIRECT = 10.0
MAX_CPU_ADDED_BY_SHADOW = 2.0
# What the gateway adds to a chunk's way, beside direct's in the same run, in the upstream's
# gaps between chunks: measured 0.15 of a 2 ms gap; a relay holding the stream back adds ~8.
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


def cpu_over(results: dict[str, Any], path: str, base: str, mode: str) -> float:
    """Return the CPU one path spends per request over another's, at 8 connections."""
    paths = results["paths"]
    spent = paths[path][mode]["8"]["cpu_us_per_req"]
    return float(spent / max(paths[base][mode]["8"]["cpu_us_per_req"], 1))


def test_gateway_spends_a_bounded_multiple_of_the_upstreams_cpu(results: dict[str, Any]) -> None:
    assert cpu_over(results, "gateway", "direct", "chat") <= MAX_CHAT_CPU_OVER_DIRECT, results
    assert cpu_over(results, "gateway", "direct", "stream") <= MAX_STREAM_CPU_OVER_DIRECT, results


def test_ten_percent_shadow_sampling_adds_little_cpu(results: dict[str, Any]) -> None:
    assert cpu_over(results, "gateway-shadow10", "gateway", "chat") <= MAX_CPU_ADDED_BY_SHADOW
    copies = results["paths"]["gateway-shadow10"]["shadow_copies"]
    # The 10% path really mirrors: thousands of requests in 3 s, none copied is below 1e-40.
    assert copies.get("sent", 0) > 0, copies


def test_streamed_chunks_reach_the_client_as_they_are_sent(tmp_path: Path) -> None:
    """bench/chunk_latency.py, short: every stamped event arrives, and arrives in its turn.

    A gateway that held a stream's events back (buffered the answer, or relayed it only as a
    whole) would deliver them about half a stream late: 8 of the upstream's gaps on average.
    """
    out = tmp_path / "chunk_latency.json"
    gap_ms = 10.0  # wide enough that a busy machine's scheduling is not mistaken for holding
    chunk_latency.main(
        ["--streams", "1", "--seconds", "1", "--gap-ms", str(gap_ms), "--out", str(out)]
    )
    point = json.loads(out.read_text())["points"]["1"]
    direct, through = point["direct"], point["gateway"]
    assert through["failures"] == 0 and through["events"] > 0, point
    assert through["events"] >= 0.5 * direct["events"], point
    assert point["added_p50_ms"] < MAX_CHUNK_DELAY_IN_GAPS * gap_ms, point


def test_tail_windows_measures_the_gateway_beside_the_relay_in_the_split_layout(
    tmp_path: Path,
) -> None:
    out = tmp_path / "windows.json"
    argv = ["--windows", "2", "--seconds", "1", "--layout", "split", "--out", str(out)]
    assert tail_windows.main(argv) == 0
    assert (hot_path.SERVER_CORE, hot_path.LOAD_CORE) == (0, 1)  # the layout is put back
    windows = json.loads(out.read_text())["windows"]
    assert len(windows) == 2
    for window in windows:
        for point in window.values():
            assert point["rps"] > 0 and point["non_2xx"] == 0 and point["socket_errors"] == 0
        assert "over_20ms" in window["gateway-default"]["loop_stalls"]
