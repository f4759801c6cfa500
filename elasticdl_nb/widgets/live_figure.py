"""`LiveFigure`: a plotly FigureWidget that costs the front end one message per update.

plotly sends an update (and an added trace) as four state messages: the trace edit id,
the layout edit id, the payload, then None in the payload's place. Here the ids and the
payload travel in one `hold_sync` message; the payload is left in place rather than reset
(every payload carries new edit ids, so the next one is still a change).

The browser answers every update with the defaults Plotly.js computed (trace and layout
deltas); plotly stores them and resets the two traits to None, and ipywidgets echoes each
incoming value back: four more messages to the front end per update, for defaults the
dashboard never reads. Here they are neither echoed nor reset.

This leans on private parts of plotly's `BaseFigureWidget` (plotly/basewidget.py), which
is why pyproject.toml caps plotly below its next major version:

- `_send_update_msg` and `_send_addTraces_msg`: what plotly calls to send an update or
  new traces; overridden to send one message;
- the traits `_py2js_update` and `_py2js_addTraces` (payloads) and the counters
  `_last_trace_edit_id` and `_last_layout_edit_id`, which the front end matches against
  its replies; and `_normalize_trace_indexes`;
- the traits `_js2py_traceDeltas` and `_js2py_layoutDelta` (the browser's replies),
  redeclared with `echo_update=False`, and their observers `_handler_js2py_traceDeltas`
  and `_handler_js2py_layoutDelta`, overridden to do nothing.

tests/unit/test_dashboard_widget.py counts the messages of a stock FigureWidget and of
this one: it is what fails when a plotly release changes any of these.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.serializers import custom_serializers
from traitlets import Dict


class LiveFigure(go.FigureWidget):
    """A FigureWidget that sends each update as one message and does not echo the
    browser's replies (see the module docstring)."""

    _js2py_traceDeltas = Dict(allow_none=True).tag(
        sync=True, echo_update=False, **custom_serializers
    )
    _js2py_layoutDelta = Dict(allow_none=True).tag(
        sync=True, echo_update=False, **custom_serializers
    )

    def _handler_js2py_traceDeltas(self, change: Any) -> None:  # the replies are not read
        pass

    def _handler_js2py_layoutDelta(self, change: Any) -> None:
        pass

    def _send_in_one(self, trait: str, msg: dict[str, Any]) -> None:
        with self.hold_sync():
            self._last_trace_edit_id += 1
            self._last_layout_edit_id += 1
            msg["trace_edit_id"] = self._last_trace_edit_id
            msg["layout_edit_id"] = self._last_layout_edit_id
            setattr(self, trait, msg)

    def _send_update_msg(
        self, restyle_data, relayout_data, trace_indexes=None, source_view_id=None
    ) -> None:
        msg = {
            "style_data": restyle_data,
            "layout_data": relayout_data,
            "style_traces": self._normalize_trace_indexes(trace_indexes),
            "source_view_id": source_view_id,
        }
        self._send_in_one("_py2js_update", msg)

    def _send_addTraces_msg(self, new_traces_data) -> None:  # noqa: N802 (plotly's name)
        self._send_in_one("_py2js_addTraces", {"trace_data": new_traces_data})
