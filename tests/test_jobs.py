"""``haepo submit``, ``jobs``, ``logs`` and ``stop`` without a cluster (:mod:`haepo_ray.jobs`): the
errors a user must understand (a missing spec, an unreachable head, no address, a Ray Client
address), where the token comes from, and what a submission packages. Submitting to a real
3-node cluster is tests/test_multinode.py's."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers import CLIENT_ENV_DROP, free_port, run_jobs_main, write_spec

from haepo_ray import jobs, uris
from haepo_ray.cli import jobs as jobs_cli
from haepo_ray.sweep.interrupt import SIGTERM_GRACE_S

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "tune_configs" / "smoke.yaml"


def test_a_language_model_sweeps_relative_data_must_travel_with_the_job(tmp_path, monkeypatch):
    """The job starts its sweep in its working directory, which holds only the spec unless
    --working-dir says otherwise: a relative tldr: file (or model folder) is refused before
    anything is made, unless it is inside --working-dir; an absolute one is the nodes' business."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "posts.jsonl").write_text('{"post": "a post", "summary": "a tl;dr"}\n')
    text = (REPO / "tune_configs" / "llm_smoke.yaml").read_text()
    spec = tmp_path / "llm.yaml"
    spec.write_text(text.replace("data: aclsum", "data: tldr:data/posts.jsonl"))
    made = set(Path(tempfile.gettempdir()).glob("haepo-submit-*"))
    with pytest.raises(jobs.JobError) as err:
        jobs.build_submission(_submit_args(spec))
    assert str(err.value) == ("llm.data 'data/posts.jsonl' is a path relative to where the sweep starts, which is "
                              "the job's working directory: give --working-dir DIR with it inside (or an absolute "
                              "path every node reaches)")
    assert set(Path(tempfile.gettempdir()).glob("haepo-submit-*")) == made
    sub = jobs.build_submission(_submit_args(spec, "--working-dir", str(tmp_path)))
    assert not sub.temporary and sub.entrypoint.startswith("haepo sweep llm.yaml ")
    (tmp_path / "sub").mkdir()
    shutil.move(spec, tmp_path / "sub" / "llm.yaml")
    with pytest.raises(jobs.JobError, match=r"^llm\.data 'data/posts\.jsonl' .*: it is not inside --working-dir "):
        jobs.build_submission(_submit_args(tmp_path / "sub" / "llm.yaml", "--working-dir", str(tmp_path / "sub")))
    (tmp_path / "mymodel").mkdir()
    spec.write_text(text.replace("model: tiny", "model: mymodel"))
    with pytest.raises(jobs.JobError, match=r"^llm\.model 'mymodel' is a path relative to where the sweep starts"):
        jobs.build_submission(_submit_args(spec))
    spec.write_text(text.replace("data: aclsum", f"data: tldr:{tmp_path / 'elsewhere.jsonl'}"))
    shutil.rmtree(jobs.build_submission(_submit_args(spec)).working_dir)


def test_submit_missing_spec_is_a_clear_error(capsys, tmp_path):
    code, _, err = run_jobs_main(["submit", str(tmp_path / "nope.yaml"),
                                  "--address", "http://127.0.0.1:1"], capsys)
    assert code == 2
    assert f"haepo submit: error: spec not found: {tmp_path / 'nope.yaml'}" in err
    assert "Traceback" not in err


def test_submit_unreachable_head_is_a_clear_error(capsys, monkeypatch):
    """An unreachable head fails at once: one TCP connect, refused, and Ray's Jobs client (which
    retries its connection for minutes) is never made."""
    for key in CLIENT_ENV_DROP:
        monkeypatch.delenv(key, raising=False)
    connects, ray_clients = [], []
    connect, make = uris.socket.create_connection, jobs.JobsClient._make

    def counted_connect(address, *args, **kwargs):
        connects.append(address)
        return connect(address, *args, **kwargs)

    def counted_make(self, headers):
        ray_clients.append(self.address)
        return make(self, headers)

    monkeypatch.setattr(uris.socket, "create_connection", counted_connect)  # both still run for real
    monkeypatch.setattr(jobs.JobsClient, "_make", counted_make)
    port = free_port()  # nothing listens there
    code, _, err = run_jobs_main(["submit", str(SMOKE), "--no-check",
                                  "--address", f"127.0.0.1:{port}"], capsys)
    assert code == 2
    assert f"cannot reach the Ray head at http://127.0.0.1:{port} (Connection refused)" in err
    assert "Traceback" not in err
    assert connects == [("127.0.0.1", port)] and ray_clients == []


def test_jobs_without_an_address_says_which_flag(capsys, monkeypatch):
    for key in CLIENT_ENV_DROP:
        monkeypatch.delenv(key, raising=False)
    code, _, err = run_jobs_main(["jobs"], capsys)
    assert code == 2 and "--address http://HEAD:8265" in err


def test_ray_client_address_is_refused(capsys):
    code, _, err = run_jobs_main(["stop", "x", "--address", "ray://10.0.0.1:10001"], capsys)
    assert code == 2 and "dashboard" in err and "not to a Ray Client" in err


def test_token_sources_in_order(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    path_token = tmp_path / "t"
    path_token.write_text("from-path")
    flag_token = tmp_path / "f"
    flag_token.write_text("from-flag\n")
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(path_token)}
    assert jobs.find_token(str(flag_token), env, home).value == "from-flag"
    assert jobs.find_token(None, env, home).value == "from-env"
    assert jobs.find_token(None, {"RAY_AUTH_TOKEN_PATH": str(path_token)}, home).value == "from-path"
    assert jobs.find_token(None, {}, home).value == "from-home"
    assert jobs.find_token(None, {}, tmp_path / "nobody") is None
    with pytest.raises(jobs.JobError, match="cannot read the Ray auth token"):
        jobs.find_token(None, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}, home)
    (tmp_path / "empty").write_text("")
    with pytest.raises(jobs.JobError, match="is empty"):
        jobs.find_token(str(tmp_path / "empty"), {}, home)


def _submit_args(spec: Path, *extra: str) -> jobs.SubmitOptions:
    parser = argparse.ArgumentParser()
    jobs_cli.add_parsers(parser.add_subparsers(dest="command"))
    return jobs_cli.submit_options(parser.parse_args(["submit", str(spec), "--no-check", *extra]))


def test_submission_packages_the_spec_and_routes_tracking_and_storage(tmp_path, monkeypatch):
    for key in CLIENT_ENV_DROP:
        monkeypatch.delenv(key, raising=False)
    spec = write_spec(tmp_path / "s.yaml", "unit", iterations=2)
    monkeypatch.setenv("MY_FLAG", "on")
    sub = jobs.build_submission(_submit_args(
        spec, "--tracking-uri", "http://mlflow:5000", "--storage-path", "/mnt/shared/r",
        "--env", "MY_FLAG", "--env", "OTHER=1", "--pip", "rich"))
    try:
        assert sub.temporary and sorted(p.name for p in sub.working_dir.iterdir()) == ["s.yaml"]
        assert sub.entrypoint == ("haepo sweep s.yaml --address auto --quiet --tracking-uri "
                                  "http://mlflow:5000 --storage-path /mnt/shared/r")
        env = sub.runtime_env["env_vars"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["MY_FLAG"] == "on" and env["OTHER"] == "1"
        # haepo stop: Ray waits for the sweep to end itself after SIGTERM, which it does within its grace
        assert int(env["RAY_JOB_STOP_WAIT_TIME_S"]) == jobs.STOP_WAIT_S > SIGTERM_GRACE_S
        assert sub.runtime_env["pip"] == ["rich"]
        assert sub.metadata["haepo.experiment"] == "unit"
        assert sub.submission_id.startswith("haepo-unit-")
    finally:
        shutil.rmtree(sub.working_dir)

    # Nothing given here: the head decides (its MLFLOW_TRACKING_URI / HAEPO_STORAGE_PATH);
    # this shell's patch setting is the job's, its driver's and its actors'.
    monkeypatch.setenv("HAEPO_PATCHES", "required,untested")
    sub = jobs.build_submission(_submit_args(spec, "--py-modules"))
    shutil.rmtree(sub.working_dir)
    assert sub.runtime_env["env_vars"]["HAEPO_PATCHES"] == "required,untested"
    assert sub.entrypoint.startswith("python -m haepo_ray.cli sweep s.yaml --address auto")
    assert sub.entrypoint.endswith(' ${HAEPO_STORAGE_PATH:+--storage-path "$HAEPO_STORAGE_PATH"}')
    assert "MLFLOW_TRACKING_URI" not in sub.runtime_env["env_vars"]
    assert sub.runtime_env["py_modules"] == [str(Path(jobs.__file__).parent)]
    assert any("MLflow" in n for n in sub.notes) and any("storage" in n for n in sub.notes)

    # --working-dir: the spec must be inside; Ray's excludes keep the venv and stores out.
    sub = jobs.build_submission(_submit_args(spec, "--working-dir", str(tmp_path)))
    assert not sub.temporary and sub.entrypoint.startswith("haepo sweep s.yaml ")
    assert ".venv" in sub.runtime_env["excludes"]
    with pytest.raises(jobs.JobError, match="not inside --working-dir"):
        jobs.build_submission(_submit_args(spec, "--working-dir", str(REPO / "tune_configs")))
    made = set(Path(tempfile.gettempdir()).glob("haepo-submit-*"))
    with pytest.raises(jobs.JobError, match="--env OTHER_UNSET"):
        jobs.build_submission(_submit_args(spec, "--env", "OTHER_UNSET"))
    assert set(Path(tempfile.gettempdir()).glob("haepo-submit-*")) == made  # refused before the folder
