#!/usr/bin/env bash
# Reproduce the paper's experiments: run every spec of an experiment in tune_configs/paper/
# (one per algorithm) into one MLflow store, then `haepo report` compares them.
#
#   bench/reproduce.sh chain_mdp newsvendor cartpole random_walk_n10 bandit_k10 ...
#   bench/reproduce.sh                      # all: chain_mdp newsvendor cartpole
#                                           #      random_walk_n10 random_walk_n20
#                                           #      bandit_k10 bandit_k20 bandit_k30
#
# Output (REPRO_DIR, default .haepo/reproduction): mlflow.db, ray_results/, and per
# experiment report-<experiment>/ (index.html, results.md/.csv, provenance.csv, figures).
# Each spec's wall time is printed and appended to times.tsv (columns: spec, ok/failed, seconds,
# UTC start, the 1-minute load average at its start and at its end). A spec whose sweep fails is
# reported and the others still run; the exit code is then 1. REPORT_ONLY=1 skips the
# sweeps and reports what the store holds.
#
# Every run records the commit that made it; the report refuses (exit code 1) runs that
# another commit than this checkout's made (an older store: use a new REPRO_DIR), and this
# script warns when the checkout has uncommitted changes or is no git checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
haepo=${HAEPO:-.venv/bin/haepo}
out=${REPRO_DIR:-.haepo/reproduction}
mkdir -p "$out"
uri="sqlite:///$(cd "$out" && pwd)/mlflow.db"
if commit=$(git rev-parse HEAD 2>/dev/null); then
    require=(--require-commit "$commit")
    if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
        echo "WARNING: this checkout has uncommitted changes: its runs are tagged dirty, and no commit" \
             "reproduces them" >&2
    fi
else
    require=()
    echo "WARNING: not a git checkout: the report cannot check which code made its runs" >&2
fi
experiments=("$@")
[ ${#experiments[@]} -gt 0 ] || experiments=(chain_mdp newsvendor cartpole random_walk_n10
                                             random_walk_n20 bandit_k10 bandit_k20 bandit_k30)
for experiment in "${experiments[@]}"; do  # every name first: a typo after hours of sweeps loses them
    specs=(tune_configs/paper/"${experiment}"_*.yaml)
    if [ ! -e "${specs[0]}" ]; then
        echo "no specs tune_configs/paper/${experiment}_*.yaml: nothing run" >&2
        exit 2
    fi
done
status=0
for experiment in "${experiments[@]}"; do
    specs=(tune_configs/paper/"${experiment}"_*.yaml)
    names=()
    for spec in "${specs[@]}"; do
        name=$(basename "$spec" .yaml)
        names+=(--experiment "$name")
        [ -z "${REPORT_ONLY:-}" ] || continue
        start=$SECONDS
        started=$(date -u +%FT%TZ)
        load_start=$(cut -d' ' -f1 /proc/loadavg)
        if "$haepo" sweep "$spec" --tracking-uri "$uri" --storage-path "$out/ray_results" --quiet; then
            result=ok
        else
            result=failed
            status=1
        fi
        printf '%s\t%s\t%d\t%s\t%s\t%s\n' "$name" "$result" $((SECONDS - start)) "$started" \
            "$load_start" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/times.tsv"
    done
    "$haepo" report --tracking-uri "$uri" "${names[@]}" --out "$out/report-$experiment" "${require[@]}" || status=1
done
exit $status
