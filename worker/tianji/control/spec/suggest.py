""" "Did you mean" for a job spec: an unknown field or a wrong choice, in the user's words.

Pydantic reports an unknown field as "Extra inputs are not permitted" and a wrong algorithm
name as "Input tag 'PPO' found using 'name' does not match any of the expected tags". This
module rewrites those errors: it finds the model at the error's location, and offers the
closest field name or choice (difflib), case differences first.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel


def closest(word: str, choices: list[str]) -> Optional[str]:
    """The choice `word` most likely meant: the same but for case, else difflib's closest match."""
    for c in choices:
        if c.lower() == word.lower():
            return c
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's annotation holds (through Optional, unions, Annotated, lists, dicts)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _models(args[0])
    if origin in (Union, types.UnionType, list, dict):
        return [m for a in (args[-1:] if origin is dict else args) for m in _models(a)]
    return [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _field(model: type[BaseModel], key: Any):
    for name, f in model.model_fields.items():
        if key in (name, f.alias):
            return f
    return None


def _tag(model: type[BaseModel]) -> Optional[str]:
    """A discriminated variant's tag (the default of its `name` Literal), e.g. 'ppo'."""
    f = model.model_fields.get("name")
    return f.default if f is not None and typing.get_origin(f.annotation) is typing.Literal else None


def models_at(root: type[BaseModel], loc: tuple) -> tuple[list[type[BaseModel]], list[type[BaseModel]]]:
    """(the models at `loc`, the other variants of a discriminated union there)."""
    models, others = [root], []
    for part in loc:
        tagged = [m for m in models if _tag(m) == part]
        if tagged:  # pydantic puts the variant's tag in the location
            models, others = tagged, [m for m in models if m not in tagged]
            continue
        nxt = [m for model in models if (f := _field(model, part)) is not None for m in _models(f.annotation)]
        if nxt:  # else a list index, a map key or a validator's tag: the same models
            models, others = nxt, []
    return models, others


def _names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def unknown_field(root: type[BaseModel], loc: tuple) -> str:
    key = str(loc[-1])
    models, others = models_at(root, loc[:-1])
    for other in others:  # e.g. replayCapacity under algorithm name: ppo
        if _field(other, key) is not None:
            return (
                f"unknown field for {_tag(models[0])}: {key} is a field of {_tag(other)} "
                f"(algorithm.name: {_tag(other)})"
            )
    names = sorted({n for m in models for n in _names(m)})
    best = closest(key, names)
    if best is not None:
        return f"unknown field; did you mean {best}?"
    return f"unknown field (the fields here: {', '.join(names)})" if names else "unknown field"


def _quoted(text: str) -> list[str]:
    return re.findall(r"'([^']*)'", text)


def better_message(e: Mapping[str, Any], root: type[BaseModel]) -> Optional[tuple[str, str]]:
    """(path suffix, message) for the errors this module words better; None for the rest."""
    ctx = e.get("ctx") or {}
    if e["type"] == "extra_forbidden":
        return "", unknown_field(root, e["loc"])
    if e["type"] == "literal_error" and isinstance(e.get("input"), str):
        best = closest(e["input"], _quoted(ctx.get("expected", "")))
        return ("", f"{e['msg']}; did you mean {best!r}?") if best else None
    if e["type"] == "union_tag_invalid":
        tags, tag = _quoted(ctx.get("expected_tags", "")), str(ctx.get("tag"))
        best = closest(tag, tags)
        said = f"{tag!r} is not one of {', '.join(repr(t) for t in tags)}"
        return "." + ctx.get("discriminator", "").strip("'"), said + (f"; did you mean {best!r}?" if best else "")
    return None
