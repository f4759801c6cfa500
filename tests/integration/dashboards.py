"""The job dashboard as a test reads it: built from the whole journal, rendered once."""

from __future__ import annotations


def rendered_dashboard(job) -> tuple[str, str]:
    """(header, instance table and event log) of the job's dashboard, as HTML."""
    from elasticdl_nb.widgets.dashboard import Dashboard

    board = Dashboard(job)
    assert board.join(60), "the dashboard did not read the whole journal"
    board.render(final=True)
    return board.status.value, board.details.value
