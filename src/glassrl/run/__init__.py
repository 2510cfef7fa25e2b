"""The run directory: checkpoints, their codec, a run's restorable state, atomic files, the lock."""
