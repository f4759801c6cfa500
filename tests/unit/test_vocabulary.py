"""The vocabulary is the one place its words are defined: the README says the same."""

import json
from pathlib import Path

from elasticdl_nb.vocabulary import FINAL_STATES, EventKind, JobState, event_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_event_table_is_the_vocabulary_s():
    assert event_table() in README.read_text(), (
        "README.md's event table differs from elasticdl_nb.vocabulary.EventKind: paste "
        "the output of `python -c 'from elasticdl_nb.vocabulary import event_table; "
        "print(event_table())'` over it"
    )


def test_every_event_kind_says_what_its_data_holds():
    assert all(kind.fields for kind in EventKind)
    assert len({kind.value for kind in EventKind}) == len(EventKind)


def test_words_travel_as_plain_strings():
    assert json.loads(json.dumps({"state": JobState.FAILED})) == {"state": "failed"}
    assert EventKind("loss") is EventKind.LOSS and "stopped" in FINAL_STATES
