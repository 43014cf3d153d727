"""A tab's method menu and its parameter controls, read from the method registries: which controls a method
shows, the help each shows (its parameter's one line), the parameters a handler passes and whether they are
lossless. The tab decides only the layout: which parameters get a slider or a checkbox, and its range."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import gradio as gr

from demos.shared import number
from mmaccel.core.plugin import MethodPlugin
from mmaccel.registries import method_registry


@dataclass(frozen=True)
class Control:
    """A slider over [low, high] in `step`s, or a checkbox (no range). `label` names it on the page and in the
    message for a value out of its range (the API may send anything)."""

    label: str
    value: float | bool
    low: float | None = None
    high: float | None = None
    step: float = 1

    def component(self, info: str | None, visible: bool) -> gr.Slider | gr.Checkbox:
        if self.low is None:
            return gr.Checkbox(bool(self.value), label=self.label, info=info, visible=visible)
        return gr.Slider(self.low, self.high, value=self.value, step=self.step, label=self.label, info=info,
                         visible=visible)

    def read(self, value: Any) -> Any:
        if self.low is None:
            return bool(value)
        return number(value, self.label, self.low, self.high, integer=float(self.step).is_integer())


def _same(value: Any) -> Any:
    return value


class MethodControls:
    """`menu`: the methods offered, each with the pipeline family whose registry declares it. A control sets the
    parameter of its name, or where `bound` says so, (method, parameter) -> control, or (control, how the
    control's value becomes the parameter's: then the control's label says what it means, and no parameter help is
    shown); a parameter without a control keeps its default."""

    def __init__(self, menu: dict[str, str], controls: dict[str, Control],
                 bound: dict[tuple[str, str], str | tuple[str, Callable[[Any], Any]]] | None = None):
        self.menu, self.controls = dict(menu), dict(controls)
        self.bound = {key: entry if isinstance(entry, tuple) else (entry, _same) for key, entry in (bound or {}).items()}

    def plugin(self, method: str) -> MethodPlugin:
        return method_registry(self.menu[method])[method]

    def bindings(self, method: str) -> dict[str, tuple[str, Callable[[Any], Any]]]:
        """control -> (the parameter of `method` it sets, the conversion) for the controls `method` reads."""
        out = {}
        for name in (f.name for f in fields(self.plugin(method).params)):
            control, convert = self.bound.get((method, name), (name, _same))
            if control in self.controls:
                out[control] = (name, convert)
        return out

    def _help(self, method: str) -> dict[str, str | None]:
        """control -> its parameter's help (None for a converted value) for the controls `method` reads."""
        rows = {r["name"]: r["help"] for r in self.plugin(method).parameters()}
        return {control: rows[name] if convert is _same else None
                for control, (name, convert) in self.bindings(method).items()}

    def components(self, method: str) -> dict[str, gr.Slider | gr.Checkbox]:
        """The controls as components (call inside a layout), shown with their help where `method` reads them."""
        helps = self._help(method)
        return {c: control.component(helps.get(c), c in helps) for c, control in self.controls.items()}

    def updates(self, method: str) -> list[dict]:
        """One update per control: shown with its parameter's help where `method` reads it, else hidden."""
        helps = self._help(method) if method in self.menu else {}
        return [gr.update(visible=c in helps, **({"info": helps[c]} if helps.get(c) else {})) for c in self.controls]

    def params(self, method: str, values: dict[str, Any]) -> dict[str, Any]:
        """`method`'s parameters from the controls' values ({control: value}), each checked against its control."""
        return {name: convert(self.controls[c].read(values[c])) for c, (name, convert) in self.bindings(method).items()}

    def lossless(self, method: str, params: dict[str, Any]) -> str:
        """'yes', or 'no (why)' from the plug-in's exactness, for these parameters."""
        plugin = self.plugin(method)
        if plugin.make(params).lossless:
            return "yes"
        if plugin.exactness == "relaxed":
            return f"no (relaxed: {plugin.budget} = {getattr(plugin.configure(params), plugin.budget)})"
        return "no (another model)" if plugin.exactness == "another-model" else "no"
