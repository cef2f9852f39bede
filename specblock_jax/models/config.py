"""Target model configuration: one frozen dataclass for the Qwen3 and Llama-3 families.

`ModelConfig` is hashable (usable as a static jit argument), converts to and from a Hugging Face
`config.json` dict, and has presets for real sizes (shape tests) and a tiny size (unit tests).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# HF `architectures` entry -> our family name. Anything else is refused with a clear error.
ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
MODEL_TYPES = {"qwen3": "qwen3", "llama": "llama"}
_FAMILY_TO_ARCH = {v: k for k, v in ARCHITECTURES.items()}

DTYPES = ("float32", "bfloat16")
ATTENTION = ("bucketed", "full", "cascade")  # models/attention.py


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options is not implemented."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (HF `rope_parameters`).

    kind: "default", "linear" or "llama3". The llama3 fields are used only by "llama3";
    `factor` by "linear" and "llama3".
    """

    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def to_hf(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rope_type": self.kind, "rope_theta": self.theta}
        if self.kind in ("linear", "llama3"):
            out["factor"] = self.factor
        if self.kind == "llama3":
            out.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return out

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "RopeConfig":
        """Reads transformers-5 `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
        params = dict(hf.get("rope_parameters") or {})
        if not params:
            params = dict(hf.get("rope_scaling") or {})
            params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ("default", "linear", "llama3"):
            raise UnsupportedModelError(
                f"rope_type={kind!r} is not supported (supported: default, linear, llama3)"
            )
        return cls(
            theta=float(params.get("rope_theta", 10000.0)),
            kind=kind,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", 8192)
            ),
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer hyperparameters. HF field names are given in comments."""

    family: str  # "qwen3" | "llama"  (architectures / model_type)
    vocab_size: int  # vocab_size
    hidden_size: int  # hidden_size
    intermediate_size: int  # intermediate_size
    num_layers: int  # num_hidden_layers
    num_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim (Llama: hidden_size // num_attention_heads when absent)
    rms_norm_eps: float = 1e-6  # rms_norm_eps
    rope: RopeConfig = RopeConfig()  # rope_parameters
    tie_word_embeddings: bool = False  # tie_word_embeddings
    attention_bias: bool = False  # attention_bias (q/k/v/o biases)
    max_position_embeddings: int = 32768  # max_position_embeddings
    dtype: str = "float32"  # parameter and compute dtype: "float32" | "bfloat16"
    bos_token_id: int | None = None  # bos_token_id
    eos_token_ids: tuple[int, ...] = ()  # eos_token_id (int or list in HF)
    pad_token_id: int | None = None  # pad_token_id
    # engine setting, never in config.json: "bucketed" = cache attention costs what the sequence is
    # long (models/attention.py), "full" = it always spans the static cache (the reference path)
    attention: str = "bucketed"
    # engine settings, never in config.json: layers the `lax.scan` over layers runs per iteration
    # (models/transformer.py; 1 = a rolled loop, compile time flat in depth; num_layers = fully
    # unrolled), in forwards without a KV cache (training: the target trainer unrolls fully) and in
    # forwards with one (decoding: 1; only specblock_jax/aot unrolls them, to price the layer loop,
    # whose body XLA's cost analysis counts once)
    scan_unroll: int = 1
    cache_scan_unroll: int = 1

    def __post_init__(self):
        if self.family not in _FAMILY_TO_ARCH:
            raise UnsupportedModelError(f"unknown model family {self.family!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if min(self.scan_unroll, self.cache_scan_unroll) < 1:
            raise ValueError(f"scan_unroll and cache_scan_unroll must be >= 1, got "
                             f"{self.scan_unroll} and {self.cache_scan_unroll}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def qk_norm(self) -> bool:
        """Qwen3 applies a per-head RMSNorm to q and k before RoPE."""
        return self.family == "qwen3"

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Exact parameter count, computed from the shapes (no arrays)."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attn = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attn += q + 2 * kv + h
        norms = 2 * h + (2 * d if self.qk_norm else 0)
        layer = attn + 3 * h * self.intermediate_size + norms
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * layer + embed + head + h

    # ---------------------------------------------------------------- HF round trip

    @classmethod
    def from_hf(cls, hf: dict[str, Any], dtype: str | None = None) -> "ModelConfig":
        """Builds a config from an HF `config.json` dict; refuses what we do not implement."""
        archs = hf.get("architectures") or []
        family = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if family is None:
            family = MODEL_TYPES.get(hf.get("model_type", ""))
        if family is None:
            raise UnsupportedModelError(
                f"unsupported model: architectures={archs!r}, model_type={hf.get('model_type')!r}; "
                f"supported: {sorted(ARCHITECTURES)}"
            )
        if hf.get("use_sliding_window"):
            raise UnsupportedModelError("use_sliding_window=True is not supported")
        if hf.get("mlp_bias"):
            raise UnsupportedModelError("mlp_bias=True is not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act={hf.get('hidden_act')!r} is not supported")
        missing = [
            k
            for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads")
            if k not in hf
        ]
        if missing:
            raise ValueError(f"config.json lacks required fields {missing}")
        heads = int(hf["num_attention_heads"])
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        if dtype is None:
            dtype = "bfloat16" if str(hf.get("dtype") or hf.get("torch_dtype")) == "bfloat16" else "float32"
        return cls(
            family=family,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(hf),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            dtype=dtype,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=hf.get("pad_token_id"),
        )

    def to_hf(self) -> dict[str, Any]:
        """The HF `config.json` dict for this config (readable by transformers 4.x and 5.x)."""
        eos: Any = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else (
            self.eos_token_ids[0] if self.eos_token_ids else None
        )
        out: dict[str, Any] = {
            "architectures": [_FAMILY_TO_ARCH[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": self.rope.to_hf(),
            "rope_theta": self.rope.theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "max_position_embeddings": self.max_position_embeddings,
            "dtype": self.dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
        }
        if self.family == "llama":
            out["mlp_bias"] = False
        else:
            out["use_sliding_window"] = False
        return out


# ---------------------------------------------------------------------- presets


def qwen3_4b() -> ModelConfig:
    return ModelConfig("qwen3", 151936, 2560, 9728, 36, 32, 8, 128, rope=RopeConfig(1e6),
                       tie_word_embeddings=True, max_position_embeddings=40960, dtype="bfloat16",
                       eos_token_ids=(151645,))


def qwen3_8b() -> ModelConfig:
    return ModelConfig("qwen3", 151936, 4096, 12288, 36, 32, 8, 128, rope=RopeConfig(1e6),
                       max_position_embeddings=40960, dtype="bfloat16", eos_token_ids=(151645,))


def llama3_1_8b() -> ModelConfig:
    rope = RopeConfig(500000.0, "llama3", 8.0, 1.0, 4.0, 8192)
    return ModelConfig("llama", 128256, 4096, 14336, 32, 32, 8, 128, rms_norm_eps=1e-5, rope=rope,
                       max_position_embeddings=131072, dtype="bfloat16", bos_token_id=128000,
                       eos_token_ids=(128001, 128008, 128009))


def tiny(family: str = "qwen3", **changes) -> ModelConfig:
    """A tiny config for unit tests (random weights)."""
    base = ModelConfig(family, 128, 64, 128, 2, 4, 2, 16, rope=RopeConfig(10000.0),
                       max_position_embeddings=512, eos_token_ids=(1,))
    return base.replace(**changes)


PRESETS = {"qwen3-4b": qwen3_4b, "qwen3-8b": qwen3_8b, "llama3.1-8b": llama3_1_8b, "tiny": tiny}
