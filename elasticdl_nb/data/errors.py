"""The single exception type the data layer raises for input problems a user can fix.

Every `DataError` message is one paragraph that names the cause (which path,
which array, which value) and the fix, because it is usually read in a job log
far from the code that raised it.
"""

from elasticdl_nb.errors import ElasticDLError


class DataError(ElasticDLError, ValueError):
    """The job's input data cannot be used as given; the message says why and what to do."""
