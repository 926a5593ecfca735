"""The fence's patches are checked against the versions they were tested for, the optional ones
can be left out, and a resume's analysis is left out only within its patch."""

from __future__ import annotations

import importlib.metadata

import pytest

from haepo_ray.upstream import PATCHES_SETTING, UpstreamVersionError, patches
from haepo_ray.upstream import tune as tune_internals


def test_every_patch_was_tested_with_the_installed_version():
    assert patches()
    for patch in patches():
        patch.check()  # raises on another version


def test_another_version_is_refused_with_the_patch_the_versions_and_the_setting(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.61.0")
    with pytest.raises(UpstreamVersionError) as refused:
        tune_internals.ACTORS_KEPT.apply()
    message = str(refused.value)
    assert "'keep launching actors'" in message and "ray 2.60.0" in message and "ray 2.61.0 is installed" in message
    assert f"{PATCHES_SETTING}=required" in message
    with pytest.raises(UpstreamVersionError, match="required for a correct sweep"):
        tune_internals.FILES_COPIED_WHOLE.apply()


def test_the_setting_leaves_out_only_the_optional_patches(monkeypatch):
    monkeypatch.setenv(PATCHES_SETTING, "required")
    with monkeypatch.context() as faked:
        faked.setattr(importlib.metadata, "version", lambda name: "2.61.0")
        assert tune_internals.ACTORS_KEPT.apply() is False  # left out, so not checked
        assert tune_internals.sweep_callbacks() == []
        with pytest.raises(UpstreamVersionError):
            tune_internals.apply()  # the required ones are still checked
    monkeypatch.setenv(PATCHES_SETTING, "release")  # the required ones and the one named
    assert [type(c).__name__ for c in tune_internals.sweep_callbacks()] == ["ReleaseFinishedTrials"]
    assert tune_internals.ACTORS_KEPT.wanted() is False
    monkeypatch.setenv(PATCHES_SETTING, "release,some")
    with pytest.raises(ValueError, match=r"\['some'\] unknown; it takes 'all', 'required' or optional patches by key"):
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
