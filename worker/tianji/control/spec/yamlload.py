"""Reading a job manifest's YAML: one document, strictly, and every refusal names the field.

PyYAML's SafeLoader builds no objects, but it still lets aliases multiply a document (a
billion-laughs manifest of a few hundred bytes is gigabytes once anything walks it), lets a
repeated key silently win (YAML 1.2 says a mapping's keys are unique), recurses once per
nesting level, and reads `.nan` and `.inf` as numbers. The loader here refuses each of them;
the composer keeps the path of every node (`spec.env.id`, `spec.model.hidden[1]`), so the
refusal names the field like a validation error does, with the line and column.

Aliases themselves are allowed, as kubectl allows them (a manifest kubectl applies must mean
the same to `tianji run`): what is refused is an alias inside its own anchor (a recursive
document) and aliases that together expand to more than MAX_ALIAS_NODES nodes, the way
go-yaml refuses "excessive aliasing".
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Optional

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

MAX_MANIFEST_BYTES = 1 << 20  # refused by size before parsing (a manifest is a few KiB)
MAX_DEPTH = 32
MAX_ALIAS_NODES = 10_000  # nodes all aliases of a document may expand to (a whole manifest is a few hundred)
_SHOWN_PATH_PARTS = 10  # of a too-deep path, the first parts (the field) are enough


class ManifestYAMLError(yaml.MarkedYAMLError):
    """A construct refused at one field of the manifest: `field` is its path, e.g. `spec.env.id`."""

    def __init__(self, field: str, problem: str, mark):
        super().__init__(None, None, problem, mark)
        self.field = field


def _join(parts: list[str]) -> str:
    shown = parts if len(parts) <= _SHOWN_PATH_PARTS else [*parts[:_SHOWN_PATH_PARTS], "..."]
    out = ""
    for p in shown:
        out += p if p.startswith("[") or p == "..." or not out else "." + p
    return out or "(root)"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses recursive or excessive aliases, duplicate keys, nesting deeper
    than MAX_DEPTH and non-finite floats, naming the field of each."""

    def __init__(self, stream, root: Optional[str] = None):
        super().__init__(stream)
        self._parts: list[str] = [root] if root else []
        self._paths: dict[int, str] = {}  # id(node) -> its field path, for the constructor's refusals
        self._nodes: list = []  # keeps the nodes (and so their ids) alive while the document is read
        self._open: set[str] = set()  # anchors whose node is being composed
        self._sizes: dict[int, int] = {}  # id(node) -> nodes in it, once composed
        self._expanded = 0  # nodes the document's aliases stand for so far

    def _part(self, parent, index) -> Optional[str]:
        if isinstance(parent, SequenceNode):
            return f"[{index}]"
        if isinstance(parent, MappingNode) and index is not None:  # a value; index is its key's node
            return str(index.value) if isinstance(index, ScalarNode) else "?"
        return None  # the document, or a mapping's key: the path is its parent's

    def compose_node(self, parent, index):
        part = self._part(parent, index)
        if part is not None:
            self._parts.append(part)
        try:
            if self.check_event(yaml.AliasEvent):
                self._count_alias(self.peek_event())
            if len(self._parts) > MAX_DEPTH:
                raise ManifestYAMLError(
                    _join(self._parts), f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark
                )
            anchor = getattr(self.peek_event(), "anchor", None)
            if anchor is not None:
                self._open.add(anchor)
            try:
                node = super().compose_node(parent, index)
            finally:
                self._open.discard(anchor)
            self._paths[id(node)] = _join(self._parts)
            self._nodes.append(node)
            return node
        finally:
            if part is not None:
                self._parts.pop()

    def _count_alias(self, ev) -> None:
        """Refuses an alias to an anchor still being composed, or one that takes the document's
        aliases past MAX_ALIAS_NODES."""
        if ev.anchor in self._open:
            raise ManifestYAMLError(
                _join(self._parts), f"*{ev.anchor} refers to its own anchor (a recursive document)", ev.start_mark
            )
        node = self.anchors.get(ev.anchor)
        if node is None:
            return  # PyYAML's own "found undefined alias"
        self._expanded += self._size(node)
        if self._expanded > MAX_ALIAS_NODES:
            raise ManifestYAMLError(
                _join(self._parts),
                f"aliases expand to more than {MAX_ALIAS_NODES} values (at *{ev.anchor}; an alias bomb?)",
                ev.start_mark,
            )

    def _size(self, node) -> int:
        """Nodes in a composed node, aliases counted as what they stand for (memoised: a composed
        node holds no open anchor, so no cycle)."""
        got = self._sizes.get(id(node))
        if got is None:
            if isinstance(node, SequenceNode):
                got = 1 + sum(self._size(n) for n in node.value)
            elif isinstance(node, MappingNode):
                got = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            else:
                got = 1
            self._sizes[id(node)] = got
        return got

    def _path(self, node) -> str:
        return self._paths.get(id(node), "(root)")

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                dup = key in seen
            except TypeError:
                raise ManifestYAMLError(
                    self._path(node), "a mapping key must be a scalar", key_node.start_mark
                ) from None
            if dup:
                base = self._path(node)
                field = str(key) if base == "(root)" else f"{base}.{key}"
                raise ManifestYAMLError(
                    field,
                    f"duplicate key {key!r} (a mapping's keys are unique; the second would silently win)",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_float(self, node):
        v = super().construct_yaml_float(node)
        if not math.isfinite(v):
            raise ManifestYAMLError(
                self._path(node), f"non-finite number {node.value!r} (a number must be finite)", node.start_mark
            )
        return v


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)
# YAML 1.2 (and kubectl) read `3e-4` as a number; PyYAML's 1.1 rules need a dot and make it a string.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)
# The stubs bind a constructor to a whole Loader; PyYAML registers SafeConstructor's own method the same way.
_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)  # type: ignore[type-var]


def safe_yaml(text: str, root: Optional[str] = None) -> Any:
    """One YAML document with the strict loader; raises yaml.YAMLError (ManifestYAMLError naming
    the field, under `root` when the text is one field's value, as in `--set`)."""
    loader = _StrictLoader(text, root)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_problem(err: yaml.YAMLError) -> str:
    """One line for a YAML error: where and what (PyYAML's own text spans several lines)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or "cannot parse"
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else str(problem)


def refusal(err: yaml.YAMLError, source: str) -> str:
    """`source: field: problem (line, column)` for a refused construct; `source: not valid YAML: ...`
    for text that is no YAML."""
    if isinstance(err, ManifestYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"{source}: {err.field}: {err.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return f"{source}: not valid YAML: {yaml_problem(err)}"


class UnreadableManifest(ValueError):
    """A manifest file that cannot be read as one YAML document; the message is one line naming it."""


def read_manifest(path: Path) -> Any:
    """The one YAML document in `path`, read strictly; a file over MAX_MANIFEST_BYTES is refused
    by its size before any of it is parsed. Every way this fails is an UnreadableManifest."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(MAX_MANIFEST_BYTES + 1)  # a pipe or device has no size: read one byte past the limit
        if len(raw) > MAX_MANIFEST_BYTES:
            what = f"{size / 2**20:.1f} MiB, " if size > MAX_MANIFEST_BYTES else ""
            raise UnreadableManifest(
                f"{path}: {what}larger than {MAX_MANIFEST_BYTES // 1024} KiB; is it a job manifest?"
            )
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise UnreadableManifest(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UnreadableManifest(f"{path}: is a directory, not a job manifest") from None
    except UnicodeDecodeError as e:
        raise UnreadableManifest(f"{path}: not UTF-8 text (byte {e.start}); is it a YAML manifest?") from None
    except OSError as e:
        raise UnreadableManifest(f"{path}: cannot read: {e.strerror}") from None
    try:
        doc = safe_yaml(text)
    except yaml.YAMLError as e:
        raise UnreadableManifest(refusal(e, str(path))) from None
    except RecursionError:
        raise UnreadableManifest(f"{path}: nested too deeply") from None
    if doc is None:
        raise UnreadableManifest(f"{path}: empty; expected a TianJiJob manifest")
    return doc
