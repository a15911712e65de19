"""Adapters that let other RL frameworks send their rollouts through CadenceRL (verl)."""
