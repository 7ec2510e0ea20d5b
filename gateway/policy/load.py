"""Load a policy: YAML text into a validated Policy, every problem placed at its line and column.

Loading validates every field (gateway/policy/definition.py) and every cross-reference
(gateway/policy/consistency.py); errors name the file, the line and column, the field path and the
bad value. A loaded policy is identified by the SHA-256 of its text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.errors import PolicyError, Problem
from gateway.policy.consistency import reference_errors
from gateway.policy.definition import Policy


class PolicyLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a policy needs none, and a kilobyte of nested
    aliases (an "alias bomb") would expand to gigabytes and hold the loader for minutes."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            message = "aliases (*name) are not allowed in a policy"
            raise yaml.composer.ComposerError(None, None, message, mark)
        return super().compose_node(parent, index)


def _name_backends(data: Any) -> Any:
    """Give unnamed backends the name POOL-INDEX, so headers and metrics have a stable label."""
    if isinstance(data, dict) and isinstance(data.get("pools"), dict):
        for pool_name, pool in data["pools"].items():
            if isinstance(pool, dict) and isinstance(pool.get("backends"), list):
                for i, backend in enumerate(pool["backends"]):
                    if isinstance(backend, dict) and not backend.get("name"):
                        backend["name"] = f"{pool_name}-{i}"
    return data


def _positions(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], yaml.Mark]:
    """Map each field path in a composed YAML document to where its value starts."""
    marks = {path: node.start_mark}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            marks.update(_positions(value, (*path, key.value)))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            marks.update(_positions(item, (*path, i)))
    return marks


def _locate(source: str, marks: dict[tuple[Any, ...], yaml.Mark], path: tuple[Any, ...]) -> str:
    """Return 'file:line:col' for the deepest part of the path found in the document."""
    for end in range(len(path), -1, -1):
        mark = marks.get(tuple(path[:end]))
        if mark is not None:
            return f"{source}:{mark.line + 1}:{mark.column + 1}"
    return source


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


Locator = Callable[[tuple[Any, ...], str], Problem]


def locator(text: str, source: str) -> Locator:
    """Return a function that turns (field path, message) into a Problem placed in the text."""
    try:
        node = yaml.compose(text, Loader=PolicyLoader)
    except yaml.YAMLError:
        node = None
    marks = _positions(node) if node is not None else {}

    def problem(path: tuple[Any, ...], message: str) -> Problem:
        return Problem(_locate(source, marks, path), _dotted(path), message)

    return problem


def _invalid(problems: list[Problem]) -> PolicyError:
    return PolicyError("invalid policy:\n  " + "\n  ".join(map(str, problems)), problems)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML into a Policy, or raise PolicyError naming every problem."""
    try:
        data = yaml.load(text, Loader=PolicyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = Problem(where, "(document)", f"not valid YAML: {exc}")
        raise PolicyError(f"{source}: not valid YAML: {exc}", [problem]) from exc
    if not isinstance(data, dict):
        message = "a policy is a YAML mapping with pools, slo_classes and routes"
        raise PolicyError(f"{source}: {message}", [Problem(source, "(top level)", message)])
    at = locator(text, source)
    try:
        policy = Policy.model_validate(_name_backends(data))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            if err["type"] == "renamed" and "key" in err.get("ctx", {}):
                loc = (*loc, err["ctx"]["key"])  # placed at the refused key, which it names
            quiet = err["type"] in ("missing", "renamed") or loc[-1:] == ("api_key_env",)
            value = "" if quiet else f" (got {err['input']!r})"
            problems.append(at(loc, f"{err['msg']}{value}"))
        raise _invalid(problems) from exc
    problems = [at(path, message) for path, message in reference_errors(policy)]
    if problems:
        raise _invalid(problems)
    return policy


class _PolicyDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing a block twice where it would write an alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(document: Any) -> str:
    """Write a policy document as YAML the loader takes: keys in order, no aliases."""
    return yaml.dump(document, Dumper=_PolicyDumper, sort_keys=False, width=100)


def render_policy(policy: Policy) -> str:
    """Write a policy as YAML that parses back to an equal policy (defaults left out)."""
    return to_yaml(policy.model_dump(mode="json", exclude_defaults=True))


def json_schema() -> dict[str, Any]:
    """Return the JSON Schema of a policy file, generated from the typed model."""
    schema = Policy.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "shadow-gateway routing policy",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def content_hash(text: str) -> str:
    """Return the SHA-256 of a policy's text, the identity of a stored version."""
    return hashlib.sha256(text.encode()).hexdigest()


def read_text(path: str | Path) -> str:
    """Return a policy file's text, or raise PolicyError saying why it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the policy file: {exc.strerror}") from exc


def load_policy(path: str | Path) -> Policy:
    """Read and validate the policy file at path."""
    return parse_policy(read_text(path), str(path))
