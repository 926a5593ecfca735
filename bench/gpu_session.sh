#!/usr/bin/env bash
# A GPU session in two commands: prepare here, run there (the device tool's machine: Python 3.12,
# PyTorch, transformers, peft; no Ray, MLflow, gymnasium or package index; 64 MiB travels).
#
#   bench/gpu_session.sh prepare           # here, at the repository root, ../shared beside it
#   bash bench/gpu_session.sh run OUT [S]  # there, as the device command, .whl and .gpu carried
#   bench/gpu_session.sh calls             # the two device calls (prepare ends with them)
#
# prepare: the wheelhouse in .whl (../shared/gpu/build-wheelhouse.sh, PYVER default 3.12); in
#   .gpu the LM assets (bench/gpu_assets.py pack), the LM metrics' wheels at requirements/gpu.txt's
#   versions (bench/gpu_image.py pins) and the commit; both folders in .git/info/exclude. Then what
#   travels (the files git does not ignore, .whl, .gpu) is summed and refused over 64 MiB, and
#   the device call is printed.
# run: installs the wheels into SITE (default /tmp/site; skipped where this was done before on
#   the machine), makes the encoder's random weights, then, each step cut at the S seconds
#   (default 540) that the whole run may take, in order:
#   - decode: bench/gpu_check.py, HAEPO "as given", "static decoding" and "static, batch
#     generation" (eager against static decoding; at most DECODE_S seconds, default 240; 0 skips);
#   - sweep: bench/gpu_sweep_check.py, its rows (ROWS="lm_packed ray_gpu_assignment" for some),
#     its sweeps in WORK (default /tmp/gsc: a second call on the same machine adds to them).
#   OUT gets session.log, decode/gpu_check.{md,json} and sweep/gpu_sweep_check.{md,json}.
#   DEVICE=cpu PY=... rehearses it here (the tiny model, the check's --device cpu).
# 15 minutes of device time hold a start, a call of 450 s and a shorter second call on the warm
# machine (DECODE_S=0 and the rows the first did not reach; sent within the 30 s it stays warm,
# else a bare machine installs again), not one call that runs everything.
set -uo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || dirname "$(dirname "$(readlink -f "$0")")")" || exit 1
LIMIT_BYTES=$((64 * 1024 * 1024))
# The session's device calls: the LM rows after decoding, then the RL rows on the warm machine
FIRST_CALL='ROWS="lm_refused lm_packed ray_gpu_assignment" bash bench/gpu_session.sh run $OUT 420'
SECOND_CALL='DECODE_S=0 ROWS="rl_learners rl_iteration_time loss_cuda_vs_cpu ray_gpu_assignment"'\
' bash bench/gpu_session.sh run $OUT 240'

calls() {
  echo 'device call (run): carry [".whl", ".gpu"], timeout_s 450, command:'
  echo "  $FIRST_CALL"
  echo 'then, within 30 s on the warm machine (timeout_s 270):'
  echo "  $SECOND_CALL"
}

prepare() {
  set -e
  local py=${PY:-.venv/bin/python} exclude
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  for path in /.whl/ /.gpu/; do grep -qxF "$path" "$exclude" 2>/dev/null || echo "$path" >>"$exclude"; done
  rm -rf .whl .gpu
  PYVER=${PYVER:-3.12} "${SHARED:-../shared}/gpu/build-wheelhouse.sh" .whl
  "$py" bench/gpu_assets.py pack .gpu
  # shellcheck disable=SC2046  # one argument per pin
  "$py" -m pip wheel -q --no-deps -w .gpu/wheels $("$py" bench/gpu_image.py pins)
  git describe --always --dirty >.gpu/COMMIT
  local bytes
  bytes=$({ git ls-files -z -co --exclude-standard; find .whl .gpu -type f -print0; } |
    du -cb --files0-from=- | tail -1 | cut -f1)
  echo "travels: $((bytes / 1024 / 1024)) MiB of the device's 64 (the checkout, .whl, .gpu), at $(cat .gpu/COMMIT)"
  if ((bytes > LIMIT_BYTES)); then
    echo "over the device's limit: ignore or carry less" >&2
    return 1
  fi
  calls
}

run() {
  local out=${1:?usage: gpu_session.sh run OUT [SECONDS]} budget=${2:-540}
  local py=${PY:-python3} site=${SITE:-/tmp/site} device=${DEVICE:-cuda}
  mkdir -p "$out"
  exec > >(tee -a "$out/session.log") 2>&1
  echo "gpu session at $(cat .gpu/COMMIT 2>/dev/null || echo 'an unknown commit'), $(date -u +%FT%TZ)," \
    "$budget s; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no GPU')"
  if [[ ! -f $site/.installed ]]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .whl/*.whl .gpu/wheels/*.whl && touch "$site/.installed" || return 1
  fi
  export PYTHONPATH=$site:$PWD/.gpu/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH
  export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
  "$py" bench/gpu_assets.py finish .gpu || return 1
  echo "set up in $SECONDS s"
  local model=() rc=0 left cap=${DECODE_S:-240}
  [[ $device == cpu ]] && model=(--device cpu --model tiny)
  left=$((budget - SECONDS))
  if ((cap > 0)); then
    echo "--- decode ($((left < cap ? left : cap)) s at most)"
    timeout -k 10 $((left < cap ? left : cap)) "$py" bench/gpu_check.py "$out/decode" \
      "${model[@]}" --algo HAEPO --config "as given" "static decoding" "static, batch generation" || rc=1
  fi
  left=$((budget - SECONDS))
  echo "--- sweep ($left s at most)"
  # shellcheck disable=SC2086  # ROWS: names separated by spaces
  timeout -k 10 "$left" "$py" bench/gpu_sweep_check.py "$out/sweep" --device "$device" \
    --data "tldr:$PWD/.gpu/aclsum.jsonl" --work "${WORK:-/tmp/gsc}" ${ROWS:+--rows $ROWS} || rc=1
  echo "gpu session ended after $SECONDS s, status $rc"
  return $rc
}

case ${1:-} in
  prepare) prepare ;;
  run) shift && run "$@" ;;
  calls) calls ;;
  *) sed -n '2,7p' "$0" >&2 && exit 2 ;;
esac
