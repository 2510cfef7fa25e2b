"""Supervised trainers: SFT and the reward model, on one loop."""
