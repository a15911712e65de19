"""A tiny random-init Qwen2-style model that vLLM can serve, built locally.

No weights can be downloaded on the project's machines, yet the engine layer needs a real model
folder for vLLM to load. The model's outputs are meaningless; only its shape matters (KV bytes per
token, decode cost), and `TINY_ARCH` exposes that shape to the simulator without importing torch.

torch, transformers and tokenizers are imported lazily, inside `build_tiny_model`, so that this
module (and `TINY_ARCH`) can be imported from an environment without them.

Run as a script to build into a folder: `python -m cadencerl.devpool.tiny_model OUT_DIR [--seed N]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from cadencerl.engine.prompts import VOCAB

MARKER = "cadencerl-tiny-model.json"
"""Written last, so its presence means the folder is complete."""

FORMAT_VERSION = 2
"""Bumped whenever the build changes, so that older folders are rebuilt (2: the chat template)."""
_CORPUS_BYTES = 4_000_000
"""How much local text trains the tokenizer: enough for a 4k vocab, small enough to stay fast."""

EOS_TOKEN = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- message['role'] + ': ' + (message['content'] if message['content'] is string else '') + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
)
"""A plain `role: text` chat template: without one, transformers (and so vLLM) refuses every chat
request, `/v1/chat/completions` and the Responses API alike ("As of transformers v4.44, default chat
template is no longer allowed, so you must provide a chat template if the tokenizer does not define
one."). Plain text, no new special tokens: the vocabulary and the weights stay as they were. Content
is read as a string, so vLLM joins a message's text parts before rendering it."""

_INIT_STD = 0.1
"""Wider than the usual 0.02: at 0.02 a random tiny model repeats one token greedily, which would
make resume-equality checks vacuous; at 0.1 greedy outputs vary from token to token."""


@dataclass(frozen=True)
class ModelArch:
    """The numbers of a decoder-only transformer that set its KV footprint and decode cost."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype_bytes: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: what one resident token costs in the KV cache."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def num_params(self) -> int:
        """Exact parameter count of a Qwen2 decoder (q/k/v biases, no o bias, RMSNorm)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        q_dim = self.num_heads * self.head_dim
        attn = (h * q_dim + q_dim) + 2 * (h * kv + kv) + q_dim * h
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_layers * per_layer + h + head


TINY_ARCH = ModelArch(
    name="cadencerl-tiny-qwen2",
    num_layers=4,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=512,
    vocab_size=VOCAB,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def _corpus_files(limit_bytes: int = _CORPUS_BYTES) -> list[Path]:
    """Python's own stdlib sources, in a fixed order: local, plentiful, code-like text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        rel = path.relative_to(stdlib).as_posix()
        if "test" in rel or rel.startswith("site-packages/"):
            continue  # tests are bulky and repetitive; site-packages differs per machine
        size = path.stat().st_size
        if size == 0:
            continue
        files.append(path)
        total += size
        if total >= limit_bytes:
            break
    if not files:
        raise RuntimeError(f"no Python sources found under {stdlib} to train the tokenizer")
    return files


def _corpus_digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _read_marker(out_dir: Path) -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data


def is_built(out_dir: Path, *, seed: int = 0) -> bool:
    """Whether `out_dir` holds a complete tiny model built with `seed` by this code version."""
    marker = _read_marker(Path(out_dir))
    return (
        marker is not None and marker.get("seed") == seed and marker.get("format") == FORMAT_VERSION
    )


def _train_tokenizer(out_dir: Path, files: list[Path], vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(p) for p in files], trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=TINY_ARCH.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def _save_model(out_dir: Path, arch: ModelArch, seed: int, eos_id: int) -> int:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(  # type: ignore[call-arg]  # head_dim is accepted at runtime
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        initializer_range=_INIT_STD,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)  # type: ignore[no-untyped-call]
    model.config.dtype = "bfloat16"
    model.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Build the tiny model and tokenizer into `out_dir` unless already there; return `out_dir`.

    Idempotent: a marker written last records the seed, so a complete folder built with the same
    seed is reused as is. The build happens in a temporary sibling folder renamed into place, so
    an interrupted or concurrent build never leaves a half-written model behind.
    """
    out_dir = Path(out_dir)
    if is_built(out_dir, seed=seed):
        return out_dir

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    tmp.chmod(0o755)
    try:
        files = _corpus_files()
        _train_tokenizer(tmp, files, TINY_ARCH.vocab_size)
        from transformers import PreTrainedTokenizerFast

        eos_id = PreTrainedTokenizerFast.from_pretrained(tmp).eos_token_id
        num_params = _save_model(tmp, TINY_ARCH, seed, eos_id)
        info = {
            "format": FORMAT_VERSION,
            "seed": seed,
            "arch": asdict(TINY_ARCH),
            "num_params": num_params,
            "kv_bytes_per_token": TINY_ARCH.kv_bytes_per_token,
            "corpus_files": len(files),
            "corpus_sha256_16": _corpus_digest(files),
        }
        (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
