"""The fence's patches and overrides are checked against the versions they were tested for and
the internals they rely on (another version given by the check's parameter), the optional ones
can be left out, the untested setting runs unchanged ones, and a resume's analysis is left out
only within its patch."""

from __future__ import annotations

import importlib
import re

import pytest

from haepo_ray import upstream
from haepo_ray.upstream import PATCHES_SETTING, Internal, Patch, PatchSettingError, UpstreamVersionError, patches
from haepo_ray.upstream import rllib as rllib_internals
from haepo_ray.upstream import tune as tune_internals
from haepo_ray.upstream.declared import check_patches


def test_every_patch_was_tested_with_the_installed_version():
    assert patches()
    for patch in patches():
        patch.check()  # raises on another version


def test_another_version_is_refused_naming_the_patches_the_versions_and_the_setting(monkeypatch):
    """On an untested Ray whose internals are unchanged: one paragraph naming every patch kept
    and both versions, which offers the untested setting."""
    monkeypatch.delenv(PATCHES_SETTING, raising=False)
    with pytest.raises(UpstreamVersionError) as refused:
        upstream.check(("tune", "rllib"), {"ray": "2.61.0"})
    message = str(refused.value)
    assert "\n" not in message
    for patch in tune_internals.PATCHES + rllib_internals.PATCHES:
        assert f"'{patch.name}'" in message
    assert "tested for ray 2.60.0, and ray 2.61.0 is installed" in message
    assert "internals they rely on are unchanged in ray 2.61.0" in message
    assert f"set {PATCHES_SETTING}=untested to run them untested" in message
    assert "required for a correct sweep" not in message  # the old, garbled hint


def test_a_patch_whose_internals_changed_is_named_and_no_setting_runs_a_required_one(monkeypatch):
    changed = Internal("json:JSONDecoder", "_scan_gone", "probe")
    required = Patch("probe required", "json", ("2.0.9",), None, lambda: None, (changed,))
    optional = Patch("probe optional", "json", ("2.0.9",), "actors", lambda: None, (changed,))
    intact = Patch("probe intact", "json", ("2.0.9",), "release", lambda: None,
                   (Internal("json:JSONDecoder", "decode", "probe"),))
    for value in ("all", "untested"):
        monkeypatch.setenv(PATCHES_SETTING, value)
        with pytest.raises(UpstreamVersionError) as refused:
            check_patches([required, intact], {"json": "2.1.0"})
        message = str(refused.value)
        assert "changed in json 2.1.0 for 'probe required' (json:JSONDecoder._scan_gone is gone)" in message
        assert "unchanged for 'probe intact'" in message
        assert message.endswith("a required patch cannot run on this version.")
    # A changed optional patch: the setting that leaves it out and runs the rest untested.
    monkeypatch.setenv(PATCHES_SETTING, "all")
    with pytest.raises(UpstreamVersionError, match=f"set {PATCHES_SETTING}=release,analysis,connectors,untested "
                                                   "to run without the changed optional patches"):
        check_patches([optional, intact], {"json": "2.1.0"})
    monkeypatch.setenv(PATCHES_SETTING, "untested,release")
    (warning,) = check_patches([optional, intact], {"json": "2.1.0"})
    assert warning.startswith(f"{PATCHES_SETTING}=untested: haepo-ray's patches 'probe intact' run on json 2.1.0")


def test_the_untested_setting_runs_unchanged_patches_with_a_warning(monkeypatch):
    monkeypatch.setenv(PATCHES_SETTING, "untested")
    (warning,) = upstream.check(("tune", "rllib"), {"ray": "2.61.0"})
    assert "run on ray 2.61.0, untested (tested: ray 2.60.0)" in warning
    assert "'keep launching actors'" in warning and "'connectors built without reading source files'" in warning
    assert upstream.check(("tune", "rllib")) == []  # the installed, tested version: no warning


@pytest.mark.parametrize("library, module", [("torch", "torch"), ("trl", "trl"), ("ray", "rllib")])
def test_the_overrides_state_their_tested_versions_and_are_checked_the_same_way(library, module, monkeypatch):
    """TRL's tile swap, torch's memo override and attention swap, RLlib's SamplingHooks."""
    monkeypatch.delenv(PATCHES_SETTING, raising=False)
    overrides = {"torch": ("MEMO_LEFT_OUT", "ATTENTION_SWAPPED"), "trl": ("TILES_FOLDED_IN_PLACE",),
                 "rllib": ("SAMPLING_HOOKS",)}[module]
    fence = importlib.import_module(f"haepo_ray.upstream.{module}")
    for name in overrides:
        override = getattr(fence, name)
        assert override in upstream.patches() and override.internals and not override.optional
        assert override.check() is None  # the installed version is a tested one
        installed = rf"'{re.escape(override.name)}'.* and {library} 99.0 is installed"
        with pytest.raises(UpstreamVersionError, match=installed):
            override.check("99.0")


def test_the_setting_leaves_out_only_the_optional_patches(monkeypatch):
    monkeypatch.setenv(PATCHES_SETTING, "required")
    with pytest.raises(UpstreamVersionError) as refused:
        upstream.check(("tune",), {"ray": "2.61.0"})  # the required ones are still checked
    assert "'copy the experiment folder's files whole'" in str(refused.value)
    assert "'keep launching actors'" not in str(refused.value)  # left out, so not checked
    assert f"set {PATCHES_SETTING}=required,untested to run them untested" in str(refused.value)
    assert tune_internals.ACTORS_KEPT.apply() is False and tune_internals.sweep_callbacks() == []
    monkeypatch.setenv(PATCHES_SETTING, "release")  # the required ones and the one named
    assert [type(c).__name__ for c in tune_internals.sweep_callbacks()] == ["ReleaseFinishedTrials"]
    assert tune_internals.ACTORS_KEPT.wanted() is False
    monkeypatch.setenv(PATCHES_SETTING, "release,some")
    with pytest.raises(PatchSettingError, match=r"\['some'\] unknown; it takes 'all', 'required' or optional "
                                                r"patches by key"):
        tune_internals.ACTORS_KEPT.apply()


def test_a_resume_builds_no_analysis_within_the_patch_and_one_without(ray_session, tmp_path, monkeypatch):
    from ray import tune
    from ray.tune.impl import tuner_internal

    def trainable(config):
        tune.report({"score": config["x"]})

    tune.Tuner(trainable, param_space={"x": tune.grid_search([1, 2])},
               run_config=tune.RunConfig(name="analysis", storage_path=str(tmp_path), verbose=0)).fit()
    built = []
    analysis = tuner_internal.ExperimentAnalysis
    monkeypatch.setattr(tuner_internal, "ExperimentAnalysis", lambda *a, **kw: built.append(1) or analysis(*a, **kw))

    with tune_internals.restoring_without_analysis():
        tune.Tuner.restore(str(tmp_path / "analysis"), trainable=trainable)
    assert built == []
    tune.Tuner.restore(str(tmp_path / "analysis"), trainable=trainable)
    assert built == [1]
    monkeypatch.setenv(PATCHES_SETTING, "required")  # the optional patch left out: Tune's own restore
    with tune_internals.restoring_without_analysis():
        tune.Tuner.restore(str(tmp_path / "analysis"), trainable=trainable)
    assert built == [1, 1]
