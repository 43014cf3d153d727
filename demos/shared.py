"""What every tab shares: models loaded once per process, lazily, behind a lock; errors shown on the page;
method menus and parameter help read from the method registries; method parameters typed as text."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import gradio as gr

from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.stats import DecodeStats, counters
from mmaccel.errors import InputError, MMAccelError, ModelNotFoundError

logger = logging.getLogger("demos")
MAX_MESSAGE = 400     # characters of an unexpected error shown on the page (the traceback goes to the log)


class SharedModel:
    """A model loaded on first use and shared by every session of this process.

    `use()` holds a lock for a whole request, so two sessions never interleave calls on one pipeline
    (nothing per request is kept on it: every request passes its inputs and gets its own outputs)."""

    def __init__(self, name: str, load: Callable[[], Any]):
        self.name, self._load = name, load
        self._value: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._value is not None

    @contextmanager
    def use(self) -> Iterator[Any]:
        with self._lock:
            if self._value is None:
                logger.info("loading the %s model", self.name)
                self._value = self._load()
            yield self._value


def page_error(err: Exception) -> gr.Error:
    """The message the page shows for an error of a handler."""
    if isinstance(err, gr.Error):
        return err
    if isinstance(err, ModelNotFoundError):
        return gr.Error(str(err), title="Model not available", print_exception=False)
    if isinstance(err, MMAccelError):
        return gr.Error(str(err), title="Invalid input", print_exception=False)
    logger.error("request failed", exc_info=err)     # an unexpected failure still gets a message, the log the rest
    return gr.Error(f"{type(err).__name__}: {str(err)[:MAX_MESSAGE]}", title="Something went wrong")


def shown_on_page(fn: Callable) -> Callable:
    """Errors of a handler reach the page as a short message (gr.Error), never as a traceback. A generator
    handler (live updates) stays a generator, so Gradio streams it and its errors are caught too."""

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def updates(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - every error becomes a page message
                raise page_error(err) from None

        return updates

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - every error becomes a page message
            raise page_error(err) from None

    return wrapper


def method_menu(registry: dict[str, MethodPlugin], loaded: Iterable[str] | None = None,
                skip: Iterable[str] = ()) -> tuple[str, ...]:
    """The methods of `registry` a tab offers, in its order: those whose needs are all in `loaded` (what the tab's
    model has; None: every method), less `skip` (the baseline shown beside them)."""
    return tuple(name for name, plugin in registry.items()
                 if name not in set(skip) and (loaded is None or set(plugin.needs) <= set(loaded)))


def method_help(plugin: MethodPlugin) -> str:
    """A method's summary, exactness and parameters (type, default, range, one line of help) as Markdown."""
    exact = f"relaxed (budget: `{plugin.budget}`)" if plugin.exactness == "relaxed" else plugin.exactness
    lines = [f"**{plugin.name}**: {plugin.summary}; {exact}."]
    for row in plugin.parameters():
        bounds = f", {row['range']}" if row["range"] else ""
        lines.append(f"- `{row['name']}` ({row['type']}, default `{row['default']}`{bounds}): {row['help']}")
    return "\n".join(lines)


def parse_params(text: str | None) -> dict[str, Any]:
    """'k=8, stop_below=0.5' (commas or spaces between pairs) -> {'k': 8, 'stop_below': 0.5}; values are
    JSON where they parse (numbers, true/false), else strings."""
    params: dict[str, Any] = {}
    for item in re.split(r"[,\s]+", (text or "").strip()):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"method parameters are KEY=VALUE pairs (e.g. k=4 stop_below=0.5), got {item!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def number(value: Any, name: str, low: float, high: float, integer: bool = False) -> float | int:
    """A slider or number box value as the API may send it, checked against the control's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise InputError(f"{name} must be in [{low}, {high}], got {value}")
    if integer:
        if int(value) != value:
            raise InputError(f"{name} must be a whole number, got {value}")
        return int(value)
    return float(value)


def choice(value: Any, name: str, options) -> str:
    if value not in options:
        raise InputError(f"unknown {name} {value!r}; choose from {', '.join(map(str, options))}")
    return value


def ratio(base: float, fast: float) -> str:
    return f"{base / fast:.2f}×" if fast > 0 else "–"


def reported_rows(base: DecodeStats, fast: DecodeStats) -> list[tuple[str, str, str]]:
    """Table rows (label, AR, method) for the number counters only some methods report (declared `omit_empty`: the
    KV cache size, a method's own such as CSpD's fallbacks) where either side reported one."""
    rows = []
    for spec in counters():
        a, b = getattr(base, spec.name), getattr(fast, spec.name)
        if spec.omit_empty and spec.scalar and (a or b):
            show = (lambda v: f"{v:.2f}") if isinstance(spec.default, float) else str
            rows.append((spec.label or spec.name, show(a), show(b)))
    return rows
