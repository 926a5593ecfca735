"""A kind of trial is one folder plus one line of ``KINDS``: a toy kind, written into a temporary
package here, is read, checked, resolved and dry-run like the RL and language-model kinds, and
those two still read their own specs."""

from __future__ import annotations

import io
import sys
import textwrap

import pytest
from helpers import REPO, SMOKE

from haepo_ray.sweep import kinds
from haepo_ray.sweep.dry_run import dry_run
from haepo_ray.sweep.kinds import load_spec, parse_plan, parse_spec
from haepo_ray.sweep.spec import SpecError


TOY_SPEC = '''
from pydantic import Field

from haepo_ray.sweep.spec import SpecModel, SweepSpec


class Toy(SpecModel):
    width: int = Field(ge=1)


class ToySweepSpec(SweepSpec):
    toy: Toy
    metric: str = "loss"
    mode: str = "min"


SPEC = ToySweepSpec


def claims(data):
    return "toy" in data
'''

TOY_PLAN = '''
from dataclasses import dataclass
from typing import Any

from haepo_ray.sweep.plan_base import Plan
from haepo_ray.sweep.spec import SpecError



def train(config):
    return {"loss": config["lr"] * config["width"]}


@dataclass(frozen=True)
class ToyPlan(Plan):
    spec: Any
    base_config: dict
    search_keys: dict
    mutations: dict

    step_key = "training_iteration"
    step_name = "epochs"
    default_metrics = ("loss",)
    progress_metrics = {"loss": "loss"}
    tune_checkpoints = False

    @classmethod
    def resolve(cls, spec):
        return cls(spec, {"width": spec.toy.width, "lr": 0.1}, {k: k for k in spec.search_space}, {})

    title = property(lambda self: f"a toy of width {self.spec.toy.width}")
    label = property(lambda self: "toy")
    subject = property(lambda self: ({"width": self.spec.toy.width}, {}))

    def base_space(self):
        return dict(self.base_config)

    def trial_config(self, values, *, validate=True):
        config = {**self.base_config, **values}
        if config["lr"] <= 0:
            raise SpecError(f"lr must be > 0, got {config['lr']}")
        return config

    def trial_resources(self, values=None):
        return {"CPU": 1}

    def trainable(self):
        return train

    def fitted(self, cluster):
        return self


PLAN = ToyPlan
'''


@pytest.fixture
def toy_kind(tmp_path, monkeypatch):
    """A third kind, ``toy_kind``, as a folder on sys.path listed first in KINDS."""
    package = tmp_path / "toy_kind"
    package.mkdir()
    (package / "__init__.py").write_text('"""A toy kind of trial."""\n')
    (package / "spec.py").write_text(textwrap.dedent(TOY_SPEC))
    (package / "plan.py").write_text(textwrap.dedent(TOY_PLAN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kinds, "KINDS", ("toy_kind", *kinds.KINDS))
    yield "toy_kind"
    for name in [m for m in sys.modules if m.split(".")[0] == "toy_kind"]:
        del sys.modules[name]


def test_a_new_kind_is_a_folder_and_a_line(toy_kind):
    data = {"name": "toys", "toy": {"width": 3}, "search_space": {"lr": {"grid": [0.1, 0.2, 0.3]}}}
    plan = parse_plan(data, "toys.yaml")
    assert type(plan).__module__ == "toy_kind.plan"
    assert plan.spec.metric == "loss" and plan.spec.mode == "min"  # the kind's own defaults
    out = io.StringIO()
    trials = dry_run(plan, out=out, tracking_uri="sqlite:///unused.db")
    assert [t.values for t in trials] == [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}]
    assert "a toy of width 3" in out.getvalue() and "checkpoint every - epochs" in out.getvalue()
    assert plan.trainable()(plan.trial_config(trials[1].values)) == {"loss": pytest.approx(0.6)}


def test_a_new_kinds_errors_name_its_keys(toy_kind):
    with pytest.raises(SpecError, match=r"toys.yaml: toy.width: .*greater than or equal to 1"):
        parse_spec({"toy": {"width": 0}}, "toys.yaml")
    with pytest.raises(SpecError, match=r"toys.yaml: trial 0 \{'lr': -1\}: lr must be > 0"):
        dry_run(parse_plan({"toy": {"width": 1}, "search_space": {"lr": {"grid": [-1]}}}, "toys.yaml"),
                out=io.StringIO(), tracking_uri="sqlite:///unused.db")


def test_the_shipped_kinds_read_their_own_specs(toy_kind):
    assert type(load_spec(SMOKE)).__name__ == "RLSweepSpec"
    assert type(load_spec(REPO / "tune_configs" / "llm_cpu_ranked.yaml")).__name__ == "LLMSweepSpec"


def test_a_spec_no_kind_claims_is_an_error(monkeypatch):
    monkeypatch.setattr(kinds, "KINDS", ("haepo_ray.sweep.kinds.llm",))
    with pytest.raises(SpecError, match=r"s.yaml: no kind of trial takes this spec; kinds: haepo_ray.sweep.kinds.llm"):
        parse_spec({"algorithm": "HAEPO", "env": "CartPole-v1"}, "s.yaml")
