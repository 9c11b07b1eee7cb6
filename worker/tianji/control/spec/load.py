"""Reading a TianJiJob: from a file or a parsed document, `--set` overrides, and validation
errors as one line per field (`job.yaml: spec.algorithm.lr: ...`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from tianji.control.spec.base import API_VERSION, KIND, SpecError, _FieldError
from tianji.control.spec.job import TianJiJob
from tianji.control.spec.suggest import better_message
from tianji.control.spec.yamlload import ManifestYAMLError, UnreadableManifest, read_manifest, safe_yaml, yaml_problem


# ----------------------------------------------------------------- loading
def _path_str(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("ppo", "dqn", "function-before[_shorthand()]"):
            continue  # discriminator / validator tags, not user-visible fields
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def _message(e: ErrorDetails) -> str:
    # Our validators' own words, without pydantic's "Value error, " prefix.
    if e["type"] == "value_error":
        return str(e["ctx"]["error"])
    return e["msg"]


def _where(e: ErrorDetails) -> str:
    path, err = _path_str(e["loc"]), (e.get("ctx") or {}).get("error")
    if isinstance(err, _FieldError) and err.key:
        if path == "(root)":
            return err.key
        return f"{path}{err.key}" if err.key.startswith("[") else f"{path}.{err.key}"
    return path


def _line(e: ErrorDetails, source: str) -> str:
    better = better_message(e, TianJiJob)  # unknown fields and wrong choices: "did you mean"
    if better is not None:
        return f"{source}: {_where(e)}{better[0]}: {better[1]}"
    return f"{source}: {_where(e)}: {_message(e)}"


def format_validation_error(err: ValidationError, source: str) -> str:
    return "\n".join(_line(e, source) for e in err.errors())


def _parse_scalar(key: str, text: str) -> Any:
    if text == "":
        return ""
    try:
        return safe_yaml(text, root=key.strip())
    except ManifestYAMLError as e:
        raise SpecError(f"--set {e.field}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"--set {key}: value {text!r} is not valid YAML: {yaml_problem(e)}") from None
    except RecursionError:
        raise SpecError(f"--set {key}: value nested too deeply") from None


def apply_override(doc: dict, assignment: str) -> None:
    """Apply one `--set spec.algorithm.lr=3e-4` to a manifest dict (camelCase paths)."""
    if "=" not in assignment:
        raise SpecError(f"--set {assignment!r}: expected KEY=VALUE, e.g. spec.algorithm.lr=3e-4")
    key, value = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise SpecError(f"--set {assignment!r}: empty key")
    node = doc
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt == "auto" and p == "topology":
            nxt = node[p] = {"auto": True}
        if nxt is None or not isinstance(nxt, dict):
            if nxt is not None:
                raise SpecError(f"--set {key}: {p} is not a mapping")
            nxt = node[p] = {}
        node = nxt
    node[parts[-1]] = _parse_scalar(key, value)


def parse_job(doc: Any, source: str = "<manifest>") -> TianJiJob:
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: expected a TianJiJob mapping, got {type(doc).__name__}")
    if doc.get("kind") not in (None, KIND):
        raise SpecError(f"{source}: kind: expected {KIND}, got {doc.get('kind')!r}")
    try:
        return TianJiJob.model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from None


def load_job(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TianJiJob:
    """Read, override and validate a manifest. Raises SpecError naming file and field."""
    path = Path(path)
    try:
        doc = read_manifest(path)
    except UnreadableManifest as e:
        raise SpecError(str(e)) from None
    if isinstance(doc, dict):
        if "kind" not in doc:  # what kubectl refuses too; parse_job alone accepts an object without it
            raise SpecError(
                f"{path}: kind: missing: a TianJiJob manifest starts with `apiVersion: {API_VERSION}` "
                f"and `kind: {KIND}`"
            )
        for o in overrides:
            apply_override(doc, o)
    return parse_job(doc, str(path))


def dump_job(job: TianJiJob) -> str:
    return yaml.safe_dump(job.to_manifest(), sort_keys=False)
