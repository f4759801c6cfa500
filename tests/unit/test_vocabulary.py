"""The vocabulary is the one place its words are defined: the docs say the same."""

import json
from pathlib import Path

from elasticdl_nb.vocabulary import FINAL_STATES, EventKind, JobState, event_table

EVENTS_DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_the_docs_event_table_is_the_vocabulary_s():
    assert event_table() in EVENTS_DOC.read_text(), (
        "docs/events.md's event table differs from elasticdl_nb.vocabulary.EventKind: paste "
        "the output of `python -c 'from elasticdl_nb.vocabulary import event_table; "
        "print(event_table())'` over it"
    )


def test_every_event_kind_says_what_its_data_holds():
    assert all(kind.fields for kind in EventKind)
    assert len({kind.value for kind in EventKind}) == len(EventKind)


def test_words_travel_as_plain_strings():
    assert json.loads(json.dumps({"state": JobState.FAILED})) == {"state": "failed"}
    assert EventKind("loss") is EventKind.LOSS and "stopped" in FINAL_STATES
