"""Every example in the README and the docs is checked against the code, so none can drift.

The documents: README.md, docs/*.md and bench/README.md. Every fenced code block in them
must say what it is, and is checked by its kind:

- ```python: compiles (after IPython turns its magics into calls). Every `%%elasticdl` /
  `%elasticdl` line parses with the magic's own parser; a `train` line's options then make
  a valid JobSpec, and `config` settings name real defaults. Every `edl.train(...)`,
  `JobSpec(...)` and `JobSpec.from_options(...)` call passes only SDK arguments and JobSpec
  options, and its literal values pass `JobSpec.from_options` (data the block does not
  have is replaced by a file name). Every `edl.X` exists and its call binds to its
  signature; so does every `job.X` on `Job`. `ElasticDL.<option>` names a real default.
- ```bash / ```sh / ```shell: `make` names Makefile targets; `elasticdl-nb ...` and
  `python -m elasticdl_nb ...` parse with the CLI's parser (and `train` makes a valid
  JobSpec); `python -m MODULE` names a module that exists; `python script.py` and other
  repository paths exist.
- ```yaml: parses.
- ```text: output, diagrams, formulas. Exempt, and the one way to say so.

A fence with no language, or another one, fails: say what the block is. Inline code that
is a command (`%elasticdl ...`, `python -m elasticdl_nb ...`, `make ...`,
`edl.train(...)`) is checked the same way; every relative link (and its #anchor) must
lead somewhere; every file named in inline code (`runtime/master/goodput.py`, a test's
`file.py::test_name`) exists; and the user guide's table of options names every JobSpec
option.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fnmatch
import importlib.util
import inspect
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

import elasticdl_nb
from elasticdl_nb.cli import build_parser as cli_parser
from elasticdl_nb.magics.config import ElasticDL, assign
from elasticdl_nb.magics.elasticdl_magic import build_parser as magic_parser
from elasticdl_nb.sdk.job import Job
from elasticdl_nb.spec import JobSpec

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "bench" / "README.md",
]
SPEC_FIELDS = {f.name for f in dataclasses.fields(JobSpec)}
EXEMPT = "text"
CHECKED = {"python", "bash", "sh", "shell", "yaml"}
PLACEHOLDER_DATA = ["train.csv"]  # for a call whose data the example does not have


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[^`\s]*)\s*$")


def _blocks_and_prose(path: Path) -> tuple[list[Block], str]:
    """The fenced blocks of a Markdown file, and its text outside them (fences blanked)."""
    blocks, prose = [], []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            prose.append(lines[i])
            i += 1
            continue
        indent, start, body = len(opening["indent"]), i, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        assert i < len(lines), f"{path.relative_to(REPO)}:{start + 1}: unclosed code fence"
        blocks.append(Block(path, start + 1, opening["lang"].lower(), "\n".join(body) + "\n"))
        prose.append("")
        i += 1
    return blocks, "\n".join(prose)


BLOCKS = [block for path in DOCUMENTS for block in _blocks_and_prose(path)[0]]


# ---------------------------------------------------------------------- the checks


def _did_you_mean(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(SPEC_FIELDS), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _valid_spec(options: dict, where: str) -> None:
    """The options make a JobSpec (SpecError, naming the option, otherwise)."""
    options = dict(options)
    if not options.get("data"):
        options["data"] = PLACEHOLDER_DATA
    try:
        JobSpec.from_options(**options)
    except elasticdl_nb.SpecError as exc:
        pytest.fail(f"{where}: {exc}")


def _parse(parser, argv: list[str], what: str, where: str) -> dict:
    """Parse a command line as the front end does; its own message on failure."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            return vars(parser.parse_args(argv))
    except BaseException as exc:  # argparse exits (the CLI), the magic raises its own
        if isinstance(exc, KeyboardInterrupt):
            raise
        pytest.fail(
            f"{where}: {what} {shlex.join(argv)!r} does not parse: {exc}\n{said.getvalue()}"
        )


def check_magic(line: str, cell: bool, where: str) -> None:
    """`%elasticdl LINE` or `%%elasticdl LINE` parses with the magic's parser, and means
    what it would in a notebook."""
    argv = [a for a in shlex.split(line) if a not in ("-h", "--help")]
    asked_help = len(argv) < len(shlex.split(line))
    args = _parse(magic_parser(), argv, "%%elasticdl" if cell else "%elasticdl", where)
    command = args.pop("command")
    assert (command == "train") == cell, f"{where}: {command} is " + (
        "a cell magic (%%elasticdl)"
        if command == "train"
        else "a line magic (%elasticdl), not a cell magic"
    )
    if command == "train" and not asked_help:
        _valid_spec({k: v for k, v in args.items() if k in SPEC_FIELDS}, where)
    if command == "config":
        try:
            assign(ElasticDL(), args["settings"])
        except elasticdl_nb.SpecError as exc:
            pytest.fail(f"{where}: %elasticdl config: {exc}")


def check_cli(argv: list[str], where: str) -> None:
    args = _parse(cli_parser(), argv, "elasticdl-nb", where)
    if args.pop("command") == "train":
        _valid_spec({k: v for k, v in args.items() if k in SPEC_FIELDS}, where)


def check_config_name(text: str, where: str) -> None:
    for name in re.findall(r"\bElasticDL\.(\w+)", text):
        assert name in ElasticDL.class_trait_names(config=True), (
            f"{where}: ElasticDL.{name} is not a notebook default; they are "
            f"{', '.join(sorted(ElasticDL.class_trait_names(config=True)))}"
        )


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return False, None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _sdk_arguments() -> set[str]:
    """The arguments of `elasticdl_nb.train` that are not JobSpec options."""
    return {
        p.name
        for p in inspect.signature(elasticdl_nb.train).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    }


def check_job_call(call: ast.Call, sdk: bool, where: str) -> None:
    """`edl.train(...)` (sdk) or `JobSpec(...)`: real options, valid literal values."""
    options = {}
    if sdk and call.args:
        known, value = _literal(call.args[0])
        if known and isinstance(value, str):
            options["model_def"] = value  # train("mnist.custom_model", ...)
    allowed = _sdk_arguments() if sdk else set()
    for keyword in call.keywords:
        if keyword.arg is None:  # **options: nothing to see
            continue
        if keyword.arg in SPEC_FIELDS:
            known, value = _literal(keyword.value)
            if known:
                options[keyword.arg] = value
        elif keyword.arg not in allowed:
            pytest.fail(
                f"{where}: {keyword.arg}= is not a JobSpec option{_did_you_mean(keyword.arg)}"
            )
    _valid_spec(options, where)


class _Any:
    """A stand-in for an argument whose value an example does not have."""


def _binds(target, call: ast.Call, method: bool, where: str, name: str) -> None:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    args = [_Any()] * (len(call.args) + (1 if method else 0))
    try:
        signature.bind(*args, **{k.arg: _Any() for k in call.keywords})
    except TypeError as exc:
        pytest.fail(f"{where}: {name}{signature}: {exc}")


def check_python_calls(tree: ast.AST, where: str) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = node.value.id
            if owner in ("edl", "elasticdl_nb"):
                assert hasattr(elasticdl_nb, node.attr), f"{where}: elasticdl_nb has no {node.attr}"
            elif owner == "job":
                assert hasattr(Job, node.attr), f"{where}: Job has no {node.attr}"
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in ("edl.train", "elasticdl_nb.train"):
            check_job_call(node, sdk=True, where=where)
        elif name.split(".")[-1] == "JobSpec" or name.endswith("JobSpec.from_options"):
            check_job_call(node, sdk=False, where=where)
        elif name.startswith(("edl.", "elasticdl_nb.")) and name.count(".") == 1:
            target = getattr(elasticdl_nb, name.split(".")[1], None)
            assert target is not None, f"{where}: elasticdl_nb has no {name.split('.')[1]}"
            _binds(target, node, False, where, name)
        elif name.startswith("job.") and name.count(".") == 1:
            target = getattr(Job, name.split(".")[1], None)
            assert target is not None, f"{where}: Job has no {name.split('.')[1]}"
            if callable(target):
                _binds(target, node, True, where, name)


LINE_MAGIC = re.compile(r"^\s*(?:[\w.]+\s*=\s*)?%(?!%)(?P<magic>\w+)(?P<line>.*)$")


def check_python(block: Block) -> None:
    from IPython.core.inputtransformer2 import TransformerManager

    text = block.text
    first, _, rest = text.partition("\n")
    if first.startswith("%%"):  # a cell magic, then the cell
        magic, _, line = first[2:].partition(" ")
        if magic == "elasticdl":
            check_magic(line, cell=True, where=block.where)
        text = rest
    for number, line in enumerate(text.splitlines(), 1):
        found = LINE_MAGIC.match(line)
        if found and found["magic"] == "elasticdl":
            check_magic(found["line"], cell=False, where=f"{block.where}+{number}")
    check_config_name(text, block.where)
    code = TransformerManager().transform_cell(text)
    try:
        tree = compile(code, block.where, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: does not compile: {exc}")
    check_python_calls(tree, block.where)


def _makefile_targets() -> set[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        rule = re.match(r"^([A-Za-z0-9_.\-/ ]+?)\s*&?::?(?!=)", line)
        if rule and not line.startswith(("\t", "#")):
            targets.update(rule[1].split())
    return targets - {".PHONY"}


def _is_python(word: str) -> bool:
    return re.fullmatch(r"(\S*/)?python(3(\.\d+)?)?", word) is not None


REPO_PATH = re.compile(r"^[\w.-]+/[\w./*-]*$")


def check_command(words: list[str], where: str) -> None:
    """One shell command: its make targets, CLI, modules and repository paths exist."""
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # VAR=value command
        words = words[1:]
    if not words:
        return
    if words[0] == "make":
        targets = _makefile_targets()
        for word in words[1:]:
            if not word.startswith("-") and "=" not in word:
                assert word in targets, (
                    f"{where}: make {word}: no such target in the Makefile "
                    f"({', '.join(sorted(targets))})"
                )
        return
    if words[0] == "elasticdl-nb":
        check_cli(words[1:], where)
        return
    if _is_python(words[0]) and len(words) > 2 and words[1] == "-m":
        if words[2] == "elasticdl_nb":
            check_cli(words[3:], where)
        else:
            assert importlib.util.find_spec(words[2]) is not None, (
                f"{where}: python -m {words[2]}: no such module"
            )
        return
    for word in words[1:]:
        if REPO_PATH.match(word) and "<" not in word and (REPO / word.split("/")[0]).exists():
            matches = list(REPO.glob(word)) if "*" in word else [REPO / word]
            assert matches and all(m.exists() for m in matches), f"{where}: {word} does not exist"


def _commands(text: str) -> list[list[str]]:
    """A shell text's commands, as words (comments dropped; split at && ; || |)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words, command = shlex.split(line, comments=True), []
        for word in words:
            if word in ("&&", "||", ";", "|"):
                out.append(command)
                command = []
            else:
                command.append(word)
        out.append(command)
    return [c for c in out if c]


def check_shell(block: Block) -> None:
    for words in _commands(block.text):
        check_command(words, block.where)


def check_yaml(block: Block) -> None:
    import yaml

    try:
        list(yaml.safe_load_all(block.text))
    except yaml.YAMLError as exc:
        pytest.fail(f"{block.where}: not YAML: {exc}")


def check_block(block: Block) -> None:
    if block.lang == EXEMPT:
        return
    assert block.lang in CHECKED, (
        f"{block.where}: a ```{block.lang} block cannot be checked: mark it ```python, "
        "```bash or ```yaml, or ```text if it is output or a diagram"
    )
    if block.lang == "python":
        check_python(block)
    elif block.lang == "yaml":
        check_yaml(block)
    else:
        check_shell(block)


# ---------------------------------------------------------------------- inline code


INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def check_inline(text: str, where: str) -> None:
    text = text.strip()
    magic = re.match(r"^(?:[\w.]+\s*=\s*)?(%%?)elasticdl\s+(.*)$", text)
    if magic:
        check_magic(magic[2], cell=magic[1] == "%%", where=where)
    elif text.startswith(("elasticdl-nb ", "python -m elasticdl_nb ", "make ")):
        for words in _commands(text):
            check_command(words, where)
    elif re.match(r"^(edl|elasticdl_nb)\.\w+\(|^JobSpec", text):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            pytest.fail(f"{where}: `{text}` is not Python")
        check_python_calls(tree, where)
    if "ElasticDL." in text:
        check_config_name(text, where)


# ---------------------------------------------------------------------- links


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    _, prose = _blocks_and_prose(path)
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*)$", prose, re.M):
        slug, n = _slug(heading), 0
        while (slug if n == 0 else f"{slug}-{n}") in anchors:
            n += 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    anchors.update(re.findall(r'<a (?:name|id)="([^"]+)"', prose))
    return anchors


LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img [^>]*src=\"([^\"]+)\"")


def broken_links(path: Path) -> list[str]:
    _, prose = _blocks_and_prose(path)
    prose = INLINE.sub("", prose)
    broken = []
    for found in LINK.finditer(prose):
        target = found[1] or found[2]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no such heading in {linked.name}")
    return broken


# ---------------------------------------------------------------------- the tests


def test_the_documents_have_code_to_check():
    assert len(DOCUMENTS) >= 6 and len(BLOCKS) >= 10, [str(p) for p in DOCUMENTS]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.where)
def test_every_code_block_is_checked_and_holds(block):
    check_block(block)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_inline_commands_hold(path):
    _, prose = _blocks_and_prose(path)
    for number, line in enumerate(prose.splitlines(), 1):
        for span in INLINE.findall(line):
            check_inline(span, f"{path.relative_to(REPO)}:{number}")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_leads_somewhere(path):
    assert broken_links(path) == []


def test_the_user_guide_names_every_option():
    """Its table of options by topic lists every JobSpec field (`*_resources` covers
    three), so a new option cannot go undocumented."""
    guide = (REPO / "docs" / "user-guide.md").read_text()
    table = guide.split("\n## Options\n")[1].split("\n## ")[0]
    named = re.findall(r"`([\w*]+)`", table)
    assert sorted(f for f in SPEC_FIELDS if not any(fnmatch.fnmatch(f, n) for n in named)) == []


# Paths a job or a run writes, named in the docs but not in the repository.
WRITTEN = {
    "examples/quickstart.executed.ipynb",
    "ratios.png",
    "scaling.png",
    "embeddings/",
    "replicas/",
    "tls/",
    "bundle/source/captured_model.py",
    ".written.json",
}
# Where a doc's short paths start: the repository, the package, tests/, bench/, ...
PATH_ROOTS = [
    REPO,
    REPO / "elasticdl_nb",
    REPO / "elasticdl_nb" / "runtime" / "protocol",
    REPO / "tests",
    REPO / "tests" / "integration",
    REPO / "tests" / "kubernetes",
    REPO / "bench",
]
CODE_PATH = re.compile(r"[\w./*-]+\.(py|proto|yaml|ipynb|md|json|toml|png)|[\w.-]+/([\w.-]+/)*")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_file_named_in_code_exists(path):
    """`runtime/master/goodput.py`, `tests/integration/test_faults.py::test_...`: a module
    that moves or a test that is renamed must take its docs along."""
    _, prose = _blocks_and_prose(path)
    missing = []
    for span in sorted(set(INLINE.findall(prose))):
        name = span.split("::")[0].split("[")[0]
        if not CODE_PATH.fullmatch(name) or name in WRITTEN:
            continue
        found = [root / name for root in PATH_ROOTS if (root / name).is_file()]
        if not found and not any(
            (root / name).exists() or any(root.glob(name)) for root in PATH_ROOTS
        ):
            missing.append(span)
        elif "::" in span and not any(
            f"def {span.split('::')[1]}(" in file.read_text() for file in found
        ):
            missing.append(span)
    assert missing == []


# ---------------------------------------------------------------------- the checks can fail


@pytest.mark.parametrize(
    "lang, text",
    [
        (
            "python",
            "import elasticdl_nb as edl\n"
            'job = edl.train(m, data=(x, y), backend="kubernetes_node")\n',
        ),
        ("python", "job = edl.train(m, data=(x, y), batch_size=32)\n"),
        ("python", "job = edl.train(m, data=(x, y), workers=0)\n"),
        ("python", "%%elasticdl train --batch-size 32 --data x y\nmodel = 1\n"),
        ("python", "%%elasticdl train --strategy ring --data x y\nmodel = 1\n"),
        ("python", "%elasticdl scale NAME\n"),
        ("python", "%elasticdl config workerz=3\n"),
        ("python", "job.restart()\n"),
        ("python", "def broken(:\n"),
        ("bash", "make demo tests\n"),
        ("bash", "python -m elasticdl_nb train --workers many --data a.csv\n"),
        ("bash", "kubectl apply -f deploy/no-such.yaml\n"),
        ("", "some text\n"),
    ],
)
def test_a_drifted_example_fails(lang, text):
    with pytest.raises((pytest.fail.Exception, AssertionError)):
        check_block(Block(REPO / "README.md", 1, lang, text))


def test_a_broken_link_is_found(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\n[a](missing.md) [b](#title) [c](#nowhere) [d](doc.md#title)\n")
    assert broken_links(doc) == ["missing.md: no such file", "#nowhere: no such heading in doc.md"]
