"""Apply: the one way a policy text becomes the active version, for every caller alike."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from gateway.db.connection import connect
from gateway.db.schema import precision_checks
from gateway.errors import PolicyError
from gateway.policy import versions
from gateway.policy.apply import apply, rollback
from gateway.policy.credentials import Access
from gateway.policy.load import render_policy
from gateway.policy.suites import SHIPPED
from policies import fleet_policy, loopback_access

TEXT = render_policy(fleet_policy())


def keyed(variable: str) -> str:
    """Return the policy text with the GPU backend taking its key from `variable`."""
    doc = yaml.safe_load(TEXT)
    doc["pools"]["gpu"]["backends"][0]["api_key_env"] = variable
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_valid_text_becomes_the_active_version_with_its_warnings(database: str) -> None:
    db = connect(database)
    applied = apply(db, TEXT, "policy.yaml", author="ana", message="first")
    active = versions.active(db)
    assert applied.changed and active is not None
    assert (active.version, active.author, active.message) == (1, "ana", "first")
    assert applied.version == active
    assert all(w.location.startswith("policy.yaml") for w in applied.warnings)
    db.dispose()


def test_an_invalid_text_is_refused_with_every_problem_located_and_nothing_stored(
    database: str,
) -> None:
    db = connect(database)
    apply(db, TEXT, "policy.yaml", author="ana", message="first")
    broken = TEXT.replace("max_context: 4096", "max_context: lots")
    with pytest.raises(PolicyError) as refused:
        apply(db, broken, "policy.yaml", author="bo", message="broken")
    assert any(p.path.endswith("max_context") for p in refused.value.problems)
    assert refused.value.problems[0].location.startswith("policy.yaml:")
    assert [v.version for v in versions.history(db)] == [1]
    db.dispose()


def test_the_active_text_applied_again_is_not_a_new_version(database: str) -> None:
    db = connect(database)
    first = apply(db, TEXT, "policy.yaml", author="ana", message="first")
    again = apply(db, TEXT, "policy.yaml", author="bo", message="again")
    assert not again.changed and again.version == first.version
    assert [v.version for v in versions.history(db)] == [1]
    db.dispose()


def test_a_key_unset_where_the_policy_is_served_refuses_it_and_elsewhere_warns(
    database: str,
) -> None:
    db = connect(database)
    text = keyed("GATEWAY_UPSTREAM_KEY_GPU")
    with pytest.raises(PolicyError, match="GATEWAY_UPSTREAM_KEY_GPU"):
        apply(db, text, "policy.yaml", author="gw", message="m", access=Access({}))
    assert versions.active(db) is None
    # The CLI runs where no secret need be kept: the same text is stored, with a warning.
    applied = apply(
        db, text, "policy.yaml", author="op", message="m", access=Access({}), serving=False
    )
    assert applied.changed
    assert any("GATEWAY_UPSTREAM_KEY_GPU" in w.message for w in applied.warnings)
    served = apply(
        db,
        keyed("GATEWAY_UPSTREAM_KEY_OTHER"),
        "policy.yaml",
        author="gw",
        message="m",
        access=loopback_access({"GATEWAY_UPSTREAM_KEY_OTHER": "k"}),
    )
    assert served.changed and not any(
        "GATEWAY_UPSTREAM_KEY_OTHER" in w.message for w in served.warnings
    )
    db.dispose()


def cleared(db, pool: str, verdict: str = "pass") -> None:
    """Store a precision check of `pool` with `verdict`, as `gateway precision check` does,
    on the shipped suite, as one that opens the gate (the figures themselves are not read)."""
    gate = {"opens": True, "lacks": [], "labelled": 240, "labelled_needed": 125}
    result = {"suite_file": "chat.jsonl", "suite_sha256": SHIPPED["chat.jsonl"], "gate": gate}
    with db.begin() as conn:
        conn.execute(
            precision_checks.insert().values(
                ts=1.0, pool=pool, reference="gpu", suite="suites/chat.jsonl", verdict=verdict,
                result=json.dumps(result),
            )
        )  # fmt: skip


def with_canary(pool: str, weight: float) -> str:
    """Return the policy text with the first route rolling `pool` out at `weight`."""
    doc = yaml.safe_load(TEXT)
    doc["routes"][0]["canary"] = {"pool": pool, "weight": weight}
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_canary_on_a_shadow_only_pool_is_gated_like_going_live(database: str) -> None:
    db = connect(database)
    apply(db, TEXT, "policy.yaml", author="ana", message="first")  # cim: live false
    with pytest.raises(PolicyError) as refused:
        apply(db, with_canary("cim", 0.5), "policy.yaml", author="bo", message="half")
    (problem,) = refused.value.problems
    assert problem.path == "routes.0.canary.pool"
    assert "pool 'cim' is shadow-only (live: false) and would serve clients as a canary" in (
        problem.message
    )
    assert versions.active_version(db) == 1
    # A canary at weight 0 serves nobody; nor does a rollout's, which its start gated.
    assert apply(db, with_canary("cim", 0.0), "p.yaml", author="bo", message="0").changed
    forced = apply(
        db,
        with_canary("cim", 0.5),
        "policy.yaml",
        author="bo",
        message="half",
        precision_gate="override",
    )
    assert forced.version.message == "half [precision gate overridden for cim by bo]"
    db.dispose()


def test_a_shadow_only_pool_taken_out_and_put_back_live_is_still_gated(database: str) -> None:
    db = connect(database)
    apply(db, TEXT, "policy.yaml", author="ana", message="first")
    doc = yaml.safe_load(TEXT)
    cim = doc["pools"].pop("cim")
    apply(db, yaml.safe_dump(doc), "policy.yaml", author="bo", message="no cim")
    doc["pools"]["cim"] = cim | {"live": True}
    back_live = yaml.safe_dump(doc)
    with pytest.raises(PolicyError, match="pool 'cim' is shadow-only"):
        apply(db, back_live, "policy.yaml", author="bo", message="cim back, live")
    cleared(db, "cim", "fail")
    with pytest.raises(PolicyError, match=r"newest precision check that counts .* is 'fail'"):
        apply(db, back_live, "policy.yaml", author="bo", message="cim back, live")
    cleared(db, "cim")
    assert apply(db, back_live, "policy.yaml", author="bo", message="cim passed").changed
    # A new pool that no version ever kept shadow-only serves at once.
    doc["pools"]["gpu-b"] = copy.deepcopy(doc["pools"]["gpu"])
    assert apply(db, yaml.safe_dump(doc), "p.yaml", author="bo", message="gpu-b").changed
    db.dispose()


def test_a_rollback_is_an_apply_of_the_earlier_text(database: str) -> None:
    db = connect(database)
    apply(db, TEXT, "policy.yaml", author="ana", message="first")
    apply(db, TEXT.replace("max_queue_ms: 200", "max_queue_ms: 300"), "p", author="a", message="2")
    back = rollback(db, author="bo")
    assert back.changed
    assert (back.version.version, back.version.restores, back.version.content) == (3, 1, TEXT)
    assert back.version.message == "roll back to version 1"
    again = rollback(db, author="bo", version=1, message="same again")
    assert not again.changed and versions.active_version(db) == 3
    db.dispose()


def test_a_rollback_to_a_text_that_no_longer_validates_is_refused_and_changes_nothing(
    database: str,
) -> None:
    db = connect(database)
    # Stored before today's memory check: the 70B model and the 8B one on one 80 GB GPU.
    doc = yaml.safe_load(TEXT)
    doc["pools"]["gpu"]["memory_gb"] = 80
    doc["pools"]["gpu"]["models"].append("llama-3.1-70b-instruct")
    versions.record(db, yaml.safe_dump(doc), "ana", "old")
    apply(db, TEXT, "policy.yaml", author="ana", message="fits")
    with pytest.raises(PolicyError) as refused:
        rollback(db, author="bo")
    assert any(p.path == "pools.gpu.memory_gb" for p in refused.value.problems)
    assert refused.value.problems[0].location.startswith("version 1:")
    assert versions.active_version(db) == 2
    db.dispose()


def test_a_rollback_that_would_put_a_shadow_only_pool_live_is_gated(database: str) -> None:
    db = connect(database)
    doc = yaml.safe_load(TEXT)
    doc["pools"]["cim"]["live"] = True
    versions.record(db, yaml.safe_dump(doc), "ana", "cim live, before the gate")
    apply(db, TEXT, "policy.yaml", author="ana", message="cim shadow-only")
    with pytest.raises(PolicyError, match="pool 'cim' is shadow-only"):
        rollback(db, author="bo")
    forced = rollback(db, author="bo", precision_gate="override")
    assert forced.version.message.endswith("[precision gate overridden for cim by bo]")
    db.dispose()


def test_the_first_version_is_gated_too(database: str) -> None:
    db = connect(database)
    with pytest.raises(PolicyError, match="pool 'cim' is shadow-only"):
        apply(db, with_canary("cim", 0.5), "policy.yaml", author="ana", message="first")
    assert versions.active(db) is None
    db.dispose()
