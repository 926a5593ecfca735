"""A language-model trial's GPU memory and time, simulated on a CPU before it is launched.

Rooms: :mod:`~.model_configs` (a model's architecture by name, offline; ``configs/``),
:mod:`~.steps` (a trial's phases, the script both sides run), :mod:`~.simulate` (the step on
fake tensors) with :mod:`~.tracker` (live bytes by category, FLOPs) and :mod:`~.replay`
(repeated micro-batch passes), :mod:`~.allocator` (CUDA's caching allocator replayed over the
step's allocations: reserved memory), :mod:`~.measure` (the real step on this CPU, under
PyTorch's profiler: what the simulator is validated against; on a GPU, ``bench/gpu_check.py``),
:mod:`~.estimate` (a trial's estimate with the CUDA context, cuBLAS and NCCL buffers, cached
in the process and, by :mod:`~.stored`, on disk),
:mod:`~.accelerators` (GPUs and a time model), :mod:`~.trl_grpo` (TRL's own GRPO step,
simulated and measured: the anchor for this project's). The command line is ``haepo llm
memory`` (:mod:`haepo_ray.cli.llm_memory`).
"""
