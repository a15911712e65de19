"""CadenceRL: a rollout control plane for asynchronous RL post-training of LLMs."""

__version__ = "0.1.0"
