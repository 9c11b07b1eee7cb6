"""The README and docs/ show commands that exist: every `tianji SUBCOMMAND --flag` they
quote is one the CLI parses, every `make TARGET` a Makefile target, every relative link a file."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tianji.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "images" / "README.md"]
# Written on other branches of the same change (the lead's local cluster, the planner's page);
# remove an entry once its file is in the tree.
PENDING: set[str] = set()

COMMAND = re.compile(r"(?<![\w.-])(?<!install )tianji ([a-z][a-z-]*)([^\n`#|]*)")  # not a Helm release
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
MAKE = re.compile(r"(?<![\w-])make ([a-z][a-z0-9-]*)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")


def code(text: str) -> str:
    """What a doc shows as code (fenced blocks, then inline spans): the commands, not the prose."""
    blocks = FENCED.findall(text)
    return "\n".join(blocks + INLINE.findall(FENCED.sub("", text)))


def subcommands() -> dict[str, set[str]]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "cmd"]
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}


def quoted_commands(text: str) -> list[tuple[str, list[str]]]:
    return [(m.group(1), FLAG.findall(m.group(2))) for m in COMMAND.finditer(text)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_tianji_command_and_flag_exists(doc):
    known = subcommands()
    wrong = []
    for cmd, flags in quoted_commands(code(doc.read_text())):
        if cmd not in known:
            wrong.append(f"tianji {cmd}")
        wrong += [f"tianji {cmd} {f}" for f in flags if cmd in known and f not in known[cmd]]
    assert not wrong, f"{doc.name} quotes what the CLI does not have: {sorted(set(wrong))}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_and_relative_link_exists(doc):
    text = doc.read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))
    missing = [f"make {t}" for t in MAKE.findall(code(text)) if t not in targets and t not in PENDING]
    for link in LINK.findall(text):
        if "://" in link or link.startswith("mailto:"):
            continue
        path = (doc.parent / link).resolve()
        if not path.exists() and str(path.relative_to(ROOT)) not in PENDING:
            missing.append(link)
    assert not missing, f"{doc.name}: {missing}"


def test_the_check_sees_a_wrong_command_and_flag():
    """The probe itself works: a made-up flag and sub-command are caught, real ones are not."""
    got = quoted_commands("run `tianji evaluate x` or\n  tianji run JOB.yaml --set a=1 --no-such-flag  # c --x\n"
                          "helm install tianji charts/tianji-operator")
    assert got == [("evaluate", []), ("run", ["--set", "--no-such-flag"])]
    # blocks, then spans
    assert MAKE.findall(code("make the most of it; `make train`\n```sh\nmake test  # x\n```\n")) == ["test", "train"]
    known = subcommands()
    assert "--set" in known["run"] and "--no-such-flag" not in known["run"] and "evaluate" not in known
