#!/bin/bash
# Runs a command with the machine's CPU first, and says how much CPU it took:
#
#   sudo bench/prioritised.sh make test
#
# The command and every process it starts (Ray's daemons and workers, MLflow servers) go into
# the cgroup-v1 groups cpu/haepo-bench (cpu.shares 262144: other jobs on the machine, at
# 1024 or less, yield to it) and cpuacct/haepo-bench (its CPU seconds). Needs root and
# cgroup v1's cpu and cpuacct controllers. Timings of a shared machine are still noisy
# (caches, memory bandwidth); the CPU seconds much less so.
set -euo pipefail
for c in cpu cpuacct; do
  mkdir -p "/sys/fs/cgroup/$c/haepo-bench"
  echo $$ > "/sys/fs/cgroup/$c/haepo-bench/tasks"
done
echo 262144 > /sys/fs/cgroup/cpu/haepo-bench/cpu.shares
echo 0 > /sys/fs/cgroup/cpuacct/haepo-bench/cpuacct.usage
start=$(date +%s.%N)
rc=0
"$@" || rc=$?
end=$(date +%s.%N)
cpu_ns=$(cat /sys/fs/cgroup/cpuacct/haepo-bench/cpuacct.usage)
python3 -c "print(f'wall {$end - $start:.1f} s, CPU {$cpu_ns / 1e9:.0f} s, exit status $rc')"
exit $rc
