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


def test_every_field_a_writer_names_is_in_its_kinds_payload():
    # Each `append(EventKind.X, field=...)` in the package, read from the source: a field
    # named there must be one of X's payload (the journals a job writes are checked too,
    # in the job_home fixture; this catches the writers no test's job reaches).
    import ast

    from elasticdl_nb.vocabulary import OPEN_KINDS

    package = Path(__file__).resolve().parents[2] / "elasticdl_nb"
    strays, writers = [], 0
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            first = node.args[0]
            if not (
                isinstance(first, ast.Attribute) and getattr(first.value, "id", "") == "EventKind"
            ):
                continue
            kind = EventKind[first.attr]
            writers += 1
            named = [k.arg for k in node.keywords if k.arg]
            if kind not in OPEN_KINDS:
                strays += [
                    f"{path.name}:{node.lineno} {kind}.{n}" for n in named if n not in kind.fields
                ]
    assert writers > 30 and strays == []
