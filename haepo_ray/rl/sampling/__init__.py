"""The pieces of HAEPO's env runner (:mod:`haepo_ray.rl.env_runner`), one concern each.

- :mod:`~haepo_ray.rl.sampling.seeding`: an independent random stream per sub-env, seeded
  once, and its checkpoint;
- :mod:`~haepo_ray.rl.sampling.lean`: the lean path, complete episodes from a vector env with
  one batched forward pass per step;
- :mod:`~haepo_ray.rl.sampling.rounds`: the round sampler, unbiased episodes through RLlib's
  own loop where the lean path does not fit;
every private RLlib name they use is in :mod:`haepo_ray.upstream.rllib`, with its reason.
"""
