"""Methods in a language-model spec: a value of ``search_space.algorithm`` is an algorithm
(``GRPO``) or an algorithm with settings of its own, a one-key map (``{HAEPO: {length_normalize:
true}}``): a method, which the report shows as ``HAEPO (length_normalize=True)``. Read and
checked here (:func:`unread_errors`: a setting the trials of a method would not read);
:mod:`haepo_ray.sweep.kinds.llm.plan` turns them into the trials' configs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from haepo_ray.sweep.kinds.llm.config import RENAMES
from haepo_ray.sweep.kinds.llm.spec import LLMSweepSpec
from haepo_ray.sweep.spec import SpecError

__all__ = ["method_errors", "method_of", "methods", "unread_errors"]


def method_of(value: Any) -> dict[str, Any]:
    """A value of ``search_space.algorithm`` (or ``algorithm``) as a method: ``{"algo": name,
    **settings}``; a resolved method (the trial config's ``method``) is returned as it is."""
    if isinstance(value, Mapping):
        if "algo" in value:
            return dict(value)
        (name, settings), = value.items()
        return {"algo": name, **settings}
    return {"algo": value}


def methods(spec: LLMSweepSpec) -> list[dict[str, Any]] | None:
    """The methods of ``search_space.algorithm`` when one has settings of its own, else None."""
    dim = spec.search_space.get("algorithm")
    if dim is None or not any(isinstance(v, Mapping) for v in dim.values):
        return None
    return [method_of(v) for v in dim.values]


def method_errors(spec: LLMSweepSpec, allowed: list[str]) -> list[str]:
    """What is wrong with the methods of ``search_space.algorithm``: a map that is not one
    algorithm with a map of settings, a setting that is not one or that the spec also sets."""
    from haepo_ray.llm.settings import ALGORITHMS

    dim = spec.search_space.get("algorithm")
    where = f"{spec.source or '<spec>'}: search_space.algorithm"
    errors = []
    for value in dim.values if dim is not None else ():
        if not isinstance(value, Mapping):
            continue
        name, settings = next(iter(value.items()), (None, None))
        if len(value) != 1 or name not in ALGORITHMS or not isinstance(settings, Mapping):
            errors.append(f"{where}: {value!r}: a method is one algorithm ({', '.join(ALGORITHMS)}) with a map of "
                          "its settings, e.g. {HAEPO: {length_normalize: true}}")
            continue
        for key in settings:
            if key not in allowed or key == "seed":
                errors.append(f"{where}.{name}.{key}: not a setting a method can set; allowed: "
                              f"{', '.join(k for k in allowed if k != 'seed')}")
            elif key in spec.settings or key in spec.search_space:
                section = "settings" if key in spec.settings else "search_space"
                errors.append(f"{where}.{name}.{key}: also in {section}; keep one")
    if not errors and spec.search.algorithm == "optuna" and methods(spec) is not None:
        errors.append(f"{where}: methods with settings of their own need search.algorithm grid or random, "
                      "not optuna")
    return errors


def unread_errors(spec: LLMSweepSpec, settings_of: Callable[[Any, dict[str, Any]], Any]) -> list[str]:
    """A setting the spec gives trials that would not read it
    (:func:`~haepo_ray.llm.settings.unread`; MLflow would log a value they ignore), per algorithm
    or method of the trials. ``settings_of(value, values)`` is the settings of a trial of that
    algorithm or method with these search values (spec name -> value); each setting is judged with
    every combination of the values the trials give what else decides it
    (:meth:`~haepo_ray.sweep.spec.SweepSpec.value_combinations`; not judged when those are many)."""
    from haepo_ray.llm.settings import READ_WHEN, unread

    searched = spec.algorithm is None
    errors: dict[str, None] = {}  # in order, once
    for value in spec.search_space["algorithm"].values if searched else [spec.algorithm]:
        method = method_of(value)
        algo = method["algo"]
        try:
            settings = settings_of(value, {})
        except SpecError:
            continue  # a method whose settings are wrong: the planned trials' check names it
        own = f"search_space.algorithm.{algo}"
        for section, mapping in (("settings", spec.settings), ("search_space", spec.search_space), (own, method)):
            given = {RENAMES.get(name, name): name for name in mapping if name not in ("algo", "algorithm")}
            for field in [field for field in given if field in READ_WHEN]:
                runs = _trials(spec, lambda values: settings_of(value, values), settings, READ_WHEN[field][0])
                if runs is None:
                    continue
                for why in unread(runs, [field]).values():
                    # the sweep's other algorithms may read it
                    hint = searched and section != own and "algo" in READ_WHEN[field][0]
                    errors[f"{spec.source or '<spec>'}: {section}.{given[field]}: {algo} trials would ignore it: "
                           f"{why}; remove {given[field]}" + (f", or sweep {algo} in a spec of its own" if hint else "")
                           ] = None
    return list(errors)


def _trials(spec: LLMSweepSpec, settings_of: Callable[[dict[str, Any]], Any], settings: Any,
            deciders: tuple[str, ...]) -> list[Any] | None:
    """The settings of an algorithm's or method's trials (``settings``: before the search values)
    with each combination of the values the spec gives ``deciders`` but ``algo`` (one value at a
    time, the caller's); None where that is not judged: they take many values, or a trial's
    settings are wrong (the planned trials' check names it)."""
    spec_name = {field: name for name, field in RENAMES.items()}
    combinations = spec.value_combinations({spec_name.get(d, d): getattr(settings, d) for d in deciders if d != "algo"})
    try:
        return None if combinations is None else [settings_of(values) for values in combinations]
    except SpecError:
        return None
