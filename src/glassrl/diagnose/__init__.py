"""Every "is this run right?" tool, as one concept (DESIGN §2). The training loop calls them; they
never drive it.

- :mod:`glassrl.diagnose.diff`: where two runs part, to the token (``glassrl diff``; torch-free),
  with :mod:`glassrl.diagnose.checkpoint_diff` comparing checkpoints tensor by tensor;
- :mod:`glassrl.diagnose.episode_audit`: the token convention's invariants on multi-turn episodes
  (``glassrl audit``);
- :mod:`glassrl.diagnose.watch`: the reward-hacking watch's rules on metrics, and
  :mod:`glassrl.diagnose.training_watch`: the same rules applied during a run.

Importing this package imports none of them (``glassrl diff`` stays free of torch).
"""
