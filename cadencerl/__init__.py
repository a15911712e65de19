"""CadenceRL: a rollout control plane for asynchronous RL post-training of LLMs."""

from cadencerl.native import guard as _use_compiled_simulator_if_current

_use_compiled_simulator_if_current()

__version__ = "0.1.0"
