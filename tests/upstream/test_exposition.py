"""Reading Prometheus' text format: the samples of one metric, as real exporters write them."""

from __future__ import annotations

import pytest

from gateway.upstream.exposition import samples, total


def test_reads_and_sums_dcgm_energy_over_devices() -> None:
    text = (
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="a"} 1500\n'
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="b"} 2500\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0"} 250.5\n'
    )
    assert total(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == pytest.approx(4000.0)
    assert total(text, "DCGM_FI_DEV_TOTAL_ENERGY") is None  # a prefix is another metric


def test_a_sample_with_a_timestamp_is_read_by_its_value() -> None:
    text = "vllm:num_requests_running 3 1700000000000\nplain 2\n"
    assert total(text, "vllm:num_requests_running") == 3.0
    assert total(text, "plain") == 2.0


def test_label_values_may_hold_commas_braces_quotes_and_escapes() -> None:
    text = (
        'm{model_name="a,b}",path="C:\\\\x",q="say \\"hi\\"",n="1\\n2"} 7\n'
        'm{model_name="other"} 5\n'
    )
    labels = [labels for labels, _ in samples(text, "m")]
    assert labels[0] == {"model_name": "a,b}", "path": "C:\\x", "q": 'say "hi"', "n": "1\n2"}
    assert total(text, "m", {"model_name": "other"}) == 5.0
    assert total(text, "m", {"model_name": "none"}) is None


def test_malformed_and_non_finite_samples_are_not_trusted() -> None:
    text = 'm{a="unterminated} 1\nm{a=1} 2\nm not-a-number\nm NaN\nm +Inf\nm 1 2 3\nm{a="ok"} 4\n'
    assert total(text, "m") == 4.0
