"""The words every part of a job speaks: job states, phases, roles, strategies, instance
states (words.py), and the journal's events, each kind with its typed payload
(events.py).

This package sits below everything (it imports nothing of ours), so the runtime, the
backends, the SDK and every front end can share it: `from elasticdl_nb.vocabulary import
JobState, EventKind, Event`.
"""

from elasticdl_nb.vocabulary.events import (
    OPEN_KINDS,
    Event,
    EventKind,
    event_table,
    payload,
    payload_problems,
)
from elasticdl_nb.vocabulary.words import (
    FINAL_STATES,
    INSTANCE_ENDED,
    MASTER_END_STATES,
    GroupChange,
    InstanceState,
    JobState,
    Phase,
    Role,
    Strategy,
)

__all__ = [
    "FINAL_STATES",
    "INSTANCE_ENDED",
    "MASTER_END_STATES",
    "OPEN_KINDS",
    "Event",
    "EventKind",
    "GroupChange",
    "InstanceState",
    "JobState",
    "Phase",
    "Role",
    "Strategy",
    "event_table",
    "payload",
    "payload_problems",
]
