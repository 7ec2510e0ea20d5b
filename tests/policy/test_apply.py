"""Apply: the one way a policy text becomes the active version, for every caller alike."""

from __future__ import annotations

import pytest
import yaml

from gateway.db.engine import make_engine
from gateway.errors import PolicyError
from gateway.policy import versions
from gateway.policy.apply import apply
from gateway.policy.credentials import Access
from gateway.policy.load import render_policy
from policies import fleet_policy

TEXT = render_policy(fleet_policy())


def keyed(variable: str) -> str:
    """Return the policy text with the GPU backend taking its key from `variable`."""
    doc = yaml.safe_load(TEXT)
    doc["pools"]["gpu"]["backends"][0]["api_key_env"] = variable
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_valid_text_becomes_the_active_version_with_its_warnings(database: str) -> None:
    engine = make_engine(database)
    applied = apply(engine, TEXT, "policy.yaml", author="ana", message="first")
    active = versions.active(engine)
    assert applied.changed and active is not None
    assert (active.version, active.author, active.message) == (1, "ana", "first")
    assert applied.version == active
    assert all(w.location.startswith("policy.yaml") for w in applied.warnings)
    engine.dispose()


def test_an_invalid_text_is_refused_with_every_problem_located_and_nothing_stored(
    database: str,
) -> None:
    engine = make_engine(database)
    apply(engine, TEXT, "policy.yaml", author="ana", message="first")
    broken = TEXT.replace("max_context: 4096", "max_context: lots")
    with pytest.raises(PolicyError) as refused:
        apply(engine, broken, "policy.yaml", author="bo", message="broken")
    assert any(p.path.endswith("max_context") for p in refused.value.problems)
    assert refused.value.problems[0].location.startswith("policy.yaml:")
    assert [v.version for v in versions.history(engine)] == [1]
    engine.dispose()


def test_the_active_text_applied_again_is_not_a_new_version(database: str) -> None:
    engine = make_engine(database)
    first = apply(engine, TEXT, "policy.yaml", author="ana", message="first")
    again = apply(engine, TEXT, "policy.yaml", author="bo", message="again")
    assert not again.changed and again.version == first.version
    assert [v.version for v in versions.history(engine)] == [1]
    engine.dispose()


def test_a_key_unset_where_the_policy_is_served_refuses_it_and_elsewhere_warns(
    database: str,
) -> None:
    engine = make_engine(database)
    text = keyed("GATEWAY_UPSTREAM_KEY_GPU")
    with pytest.raises(PolicyError, match="GATEWAY_UPSTREAM_KEY_GPU"):
        apply(engine, text, "policy.yaml", author="gw", message="m", access=Access({}))
    assert versions.active(engine) is None
    # The CLI runs where no secret need be kept: the same text is stored, with a warning.
    applied = apply(
        engine, text, "policy.yaml", author="op", message="m", access=Access({}), serving=False
    )
    assert applied.changed
    assert any("GATEWAY_UPSTREAM_KEY_GPU" in w.message for w in applied.warnings)
    served = apply(
        engine,
        keyed("GATEWAY_UPSTREAM_KEY_OTHER"),
        "policy.yaml",
        author="gw",
        message="m",
        access=Access({"GATEWAY_UPSTREAM_KEY_OTHER": "k"}),
    )
    assert served.changed and not any(
        "GATEWAY_UPSTREAM_KEY_OTHER" in w.message for w in served.warnings
    )
    engine.dispose()
