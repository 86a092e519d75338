"""The README and docs/ name only commands and options the CLI has: an operator's first day is read from them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from flare_diag.daemon.cli.commands import build_parser
from flare_diag.daemon.cli.completion import command_tree
from flare_diag.daemon.service.server import build_parser as build_daemon_parser

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# code as markdown writes it: fenced blocks, then inline spans (an operator copies these, not the prose)
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# an indented code block's command line (an indented line elsewhere is a list's continuation: prose)
INDENTED = re.compile(r"^ {4,}((?:\$ )?flare-diagd? .*)$", re.M)
SPAN = re.compile(r"`((?:[^`\n]|\n(?![ \t]*\n))+)`")  # a span may wrap onto the next line, never past a blank one
COMMAND = re.compile(r"(?<![\w/.-])(flare-diagd?) ([^\n|;&]*)")
# what may stand before a command in a shell line (else `flare-diag` is a group, a path or a user's name)
LEADS = ("", "$", "&&", "||", ";", "|", "(", "sudo", "exec", "time")
OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def _code(text: str) -> list[tuple[int, str]]:
    """(line, code) of every fenced block's lines, every indented command line and every inline span
    outside them."""
    out, rest = [], text
    for m in FENCED.finditer(text):
        first = text.count("\n", 0, m.start(1)) + 1
        out += [(first + i, line) for i, line in enumerate(m.group(1).splitlines())]
        rest = rest.replace(m.group(0), "\n" * m.group(0).count("\n"), 1)  # keeps the line numbers
    out += [(rest.count("\n", 0, m.start()) + 1, m.group(1)) for m in INDENTED.finditer(rest)]
    rest = INDENTED.sub("", rest)
    out += [(rest.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split("\n"))) for m in SPAN.finditer(rest)]
    return out


def misnamed(text: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Each `flare-diag ...` (or `flare-diagd ...`) in the text's code whose subcommand or option its parser
    lacks, as 'line N: why' (read from the command tree shell completion is written from)."""
    trees = {program: command_tree(p) for program, p in parsers.items()}
    found = []
    for line, code in _code(text):
        code = code.replace("\\", " ")
        for m in COMMAND.finditer(code):
            before = code[:m.start()].split()
            if before and before[-1] not in LEADS and "=" not in before[-1]:  # not a command: `usermod -aG flare-diag alice`
                continue
            program, tree = m.group(1), trees[m.group(1)]
            words, path = m.group(2).split(), ()
            while words and (*path, words[0]) in tree:
                path = (*path, words.pop(0))
            named = " ".join((program, *path))
            if any(not w.startswith("-") for w in tree[path]) and words and re.fullmatch(r"[a-z][a-z-]*", words[0]):
                found.append(f"line {line}: `{named}` has no subcommand {words[0]!r}")
                continue
            known = {*tree[path], *tree[()]}
            found += [f"line {line}: `{named}` has no option {o}"
                      for w in words if (o := OPTION.match(w)) and (o := o.group(0)) not in known]
    return found


def _parsers() -> dict[str, argparse.ArgumentParser]:
    return {"flare-diag": build_parser(), "flare-diagd": build_daemon_parser()}


def test_every_command_the_docs_give_names_a_subcommand_and_options_the_cli_has():
    parsers = _parsers()
    wrong = [f"{doc.relative_to(ROOT)} {why}" for doc in DOCUMENTS for why in misnamed(doc.read_text(), parsers)]
    assert not wrong, "\n".join(wrong)


def test_the_docs_check_names_a_subcommand_or_an_option_the_cli_lacks():
    text = ("Run `flare-diag log verifyy out/log.db`, then:\n\n```\nflare-diag report out/ --format md --colour\n"
            "flare-diagd --fleet f.toml --metrics-port 9464\n```\n\n    flare-diag plan follow-on w1 --polcy marconi\n")
    assert misnamed(text, _parsers()) == ["line 4: `flare-diag report` has no option --colour",
                                          "line 5: `flare-diagd` has no option --metrics-port",
                                          "line 8: `flare-diag plan follow-on` has no option --polcy",
                                          "line 1: `flare-diag log` has no subcommand 'verifyy'"]


# a path in this repository as the docs write one: a folder of it, then more; in prose only with a file's
# extension (`33,333 events/s` is a rate), in code also as a module (`window/runner.Runner`)
REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:docs|tests|bench|fixtures|daemon|events|policies|systemd|flare_diag)/[\w./-]*\w)")


def missing_paths(text: str, root: Path) -> list[str]:
    """Each repository path the text names that is neither a file, a folder nor a module (MODULE.attr) there."""
    code = [range(m.start(), m.end()) for m in (*FENCED.finditer(text), *SPAN.finditer(text))]
    found = []
    for m in REPO_PATH.finditer(text):
        path = m.group(1)
        in_code = any(m.start() in r for r in code)
        if not in_code and "." not in path.rsplit("/", 1)[-1]:
            continue
        module = path.rsplit(".", 1)[0] if "." in path.rsplit("/", 1)[-1] else path
        if not any((root / p).exists() for p in (path, f"{path}.py", f"{module}.py")):
            found.append(f"line {text.count(chr(10), 0, m.start()) + 1}: {path}")
    return found


def test_every_repository_path_the_docs_name_exists():
    wrong = [f"{doc.relative_to(ROOT)} {why}" for doc in DOCUMENTS for why in missing_paths(doc.read_text(), ROOT)]
    assert not wrong, "\n".join(wrong)


def test_the_path_check_names_a_path_that_is_not_there(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "guards.py").write_text("")
    text = "`policies/guards.judge` applies it; `policies/actions` checks it; 9 events/s; see docs/gone.md\n"
    assert missing_paths(text, tmp_path) == ["line 1: policies/actions", "line 1: docs/gone.md"]


def test_the_event_reference_is_what_the_schema_renders():
    from flare_diag.events.reference import render
    assert (ROOT / "docs" / "events.md").read_text() == render(), \
        "docs/events.md is stale: python -m flare_diag.events.reference > docs/events.md"


def test_every_event_and_action_type_says_what_it_is():
    from flare_diag.events.reference import undocumented
    assert undocumented() == []


def test_the_plan_ranges_page_is_what_the_table_renders():
    from flare_diag.policies.ranges import render
    assert (ROOT / "docs" / "plan-ranges.md").read_text() == render(), \
        "docs/plan-ranges.md is stale: python -m flare_diag.policies.ranges > docs/plan-ranges.md"
