"""Sweep-spec errors in the spec's own terms: pydantic's validation errors turned into lines
that name the file, the key path as written in the YAML and what is allowed there."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ValidationError


def _annotation_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional/Union/Annotated)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _annotation_models(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        out: list[type[BaseModel]] = []
        for arg in typing.get_args(annotation):
            out += _annotation_models(arg)
        return out
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _allowed_keys(root: type[BaseModel], loc: tuple) -> list[str] | None:
    """Field names allowed at ``loc`` (the location of the parent mapping of a bad key)."""
    model: type[BaseModel] = root
    i = 0
    while i < len(loc):
        part = loc[i]
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
            i += 1  # skip the dict key
        models = _annotation_models(annotation)
        if not models:
            return None
        if len(models) > 1:  # a discriminated union: the next loc element is the tag
            if i + 1 >= len(loc):
                return None
            tag = loc[i + 1]
            models = [m for m in models if m.model_fields.get("type") is not None
                      and m.model_fields["type"].annotation == Literal[tag]]
            if not models:
                return None
            i += 1
        model = models[0]
        i += 1
    return [k for k in model.model_fields if k != "source"]


def _format_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def format_validation_error(err: ValidationError, source: str, root: type[BaseModel]) -> str:
    """pydantic's errors as lines ``<source>: <key path>: <what is wrong>`` (unknown keys with
    the allowed ones of that mapping, found from ``root``, the spec's model)."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        # The scheduler's discriminator tag (fifo/asha/pbt) is in pydantic's loc, not in the file.
        shown = loc[:1] + loc[2:] if len(loc) >= 2 and loc[0] == "scheduler" and loc[1] in (
            "fifo", "asha", "pbt") else loc
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(root, loc[:-1])
            msg = f"unknown key {loc[-1]!r}"
            if allowed is not None:
                close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
                msg += (f" (did you mean {close[0]!r}?)" if close else "") + f"; allowed: {', '.join(allowed)}"
        elif e["type"] == "missing":
            msg = "required key missing"
        elif e["type"] == "union_tag_invalid":
            msg = f"unknown type {e.get('input', {}).get('type')!r}; allowed: fifo, asha, pbt"
        elif e["type"] == "union_tag_not_found":
            msg = "needs a type: fifo, asha or pbt"
        else:
            msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {_format_loc(shown)}: {msg}")
    return "\n".join(lines)
