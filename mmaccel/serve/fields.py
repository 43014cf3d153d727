"""Reading a request's JSON fields: each wrong field is one line naming the field and what it takes."""

from __future__ import annotations

import json
import math
from typing import Any

from mmaccel.errors import InputError, check


def check_fields(body: Any, allowed: set[str], *required: str) -> None:
    """`body` is a JSON object with only `allowed` fields, `required` among them."""
    check(isinstance(body, dict), "the request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    check(not unknown, f"unknown field(s) {', '.join(unknown)}; this endpoint takes {', '.join(sorted(allowed))}")
    missing = [name for name in required if body.get(name) in (None, "")]
    check(not missing, f"the request needs {' and '.join(repr(m) for m in missing)}")


def optional_str(body: dict, name: str) -> str | None:
    """Field `name` of `body` as a string; None when it is absent, null or empty."""
    value = body.get(name)
    check(value is None or isinstance(value, str), f"{name} must be a string, got {json.dumps(value)[:40]}")
    return value or None


def optional_int(body: dict, name: str) -> int | None:
    """Field `name` of `body` as an integer (a boolean is not one); None when it is absent or null."""
    value = body.get(name)
    check(value is None or (isinstance(value, int) and not isinstance(value, bool)),
          f"{name} must be an integer, got {json.dumps(value)[:40]}")
    return value


def positive_int(body: dict, name: str, default: int) -> int:
    """Field `name` of `body` as an integer of at least 1; `default` when it is absent or null."""
    value = optional_int(body, name)
    value = default if value is None else value
    check(value >= 1, f"{name} must be at least 1, got {value}")
    return value


def number(body: dict, name: str, default: float | None = None, low: float = -math.inf,
           high: float = math.inf) -> float:
    """Field `name` of `body` as a finite number in [`low`, `high`], as a float; `default` when it is absent or null
    (a None `default` makes the field required)."""
    value = body.get(name, default)
    value = default if value is None else value
    check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
          f"{name} must be a number, got {json.dumps(value)[:40]}")
    check(low <= value <= high, f"{name} must be in [{low:g}, {high:g}], got {value:g}")
    return float(value)


def parse_params(raw: Any) -> dict:
    """`method_params`: a JSON object, or (from a form) its text."""
    if raw in (None, ""):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            raise InputError(f"method_params is not valid JSON ({err.msg} at character {err.pos})") from None
    check(isinstance(raw, dict), "method_params must be a JSON object, e.g. {\"k\": 4}")
    return raw


def method_params(body: dict) -> dict:
    """The body's `method_params` (`parse_params`): {} when it is absent."""
    return parse_params(body.get("method_params"))


def params_of(params: dict) -> tuple[tuple[str, Any], ...]:
    """A request's method parameters as a key part (sorted, hashable)."""
    try:
        key = tuple(sorted(params.items()))
        hash(key)
    except TypeError:
        raise InputError("method_params values must be numbers, strings or booleans") from None
    return key
