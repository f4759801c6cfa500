"""The client's view of a job: its event journal folded once (`JobView`, job_view.py),
phrased once (text.py), with bounded curves (series.py) and the workers over time
(timeline.py). Every front end (text progress, dashboard, server extension, sidebar)
reads a `JobView`; none folds the journal itself."""

from elasticdl_nb.sdk.view.job_view import InstanceRow, JobLike, JobView, LogLine
from elasticdl_nb.sdk.view.series import Series
from elasticdl_nb.sdk.view.timeline import Mark, Timeline

__all__ = ["InstanceRow", "JobLike", "JobView", "LogLine", "Mark", "Series", "Timeline"]
