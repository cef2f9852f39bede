"""EAGLE-3 drafters between us and vLLM's `speculators` package, both ways: the same draft logits?

Two environments (speculators pins transformers <= 5.19 and its own torch; ours differ):

    # ours -> speculators: export a drafter (fp32), write its inputs and our logits, then read the
    # export with speculators and compare
    .venv/bin/python scripts/speculators_parity.py prepare OUT [--drafter DIR] [--target DIR]
    /tmp/specenv/bin/python scripts/speculators_parity.py check OUT
    # speculators -> ours: speculators builds and saves a random drafter (its own writer) and its
    # logits on the same inputs; we import it and compare
    /tmp/specenv/bin/python scripts/speculators_parity.py write OUT [--target DIR]
    .venv/bin/python scripts/speculators_parity.py compare OUT [--target DIR]

`check` loads OUT/drafter with `speculators.models.eagle3.Eagle3DraftModel.from_pretrained` (its
own config parsing, weight names, d2t handling and forward), gives it the target's embedding (the
format leaves it to the verifier), runs one training-time-test step over the same sequence and
compares its logits (lm_head outputs, mapped to target ids with its d2t) to ours. It prints the
largest absolute difference and exits 1 above 1e-4.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def prepare(out: Path, drafter_dir: str, target_dir: str, length: int) -> None:
    import jax.numpy as jnp
    from flax import nnx

    import specblock_jax as sbj

    target = sbj.load_target(target_dir, dtype="float32")
    drafter, params = sbj.load_drafter(drafter_dir, target, dtype="float32")
    if drafter.kind != "eagle3":
        raise SystemExit(f"{drafter_dir}: an {drafter.kind} drafter; speculators reads EAGLE-3 drafters")
    sbj.save_drafter(drafter, params, out / "drafter", dtype="float32", format="speculators",
                     max_positions=target.config.max_position_embeddings, verifier=str(Path(target_dir).resolve()),
                     verifier_architectures=(target.config.to_hf()["architectures"][0],))
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    ids = sbj.generate(target, [prompt], max_new_tokens=length)[0]
    tokens = (list(target.tokenizer(prompt)["input_ids"]) + ids.token_ids)[:length + 1]
    tok = jnp.asarray([tokens])
    t = tok.shape[1] - 1
    res = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(t + 1)[None],
                           sbj.models.causal_mask(1, t + 1), hidden_ids=drafter.config.feature_layers)
    model = nnx.merge(drafter.graphdef, params["draft"])
    c = drafter.config
    cache = (jnp.zeros((1, c.num_kv_heads, t, c.head_dim)),) * 2
    hidden, _ = model.step(jnp.take(params["embed"], tok[:, 1:], axis=0), model.fuse(res.hidden[:, :t]),
                           jnp.arange(t)[None], jnp.tril(jnp.ones((t, t), bool))[None], cache,
                           jnp.zeros((1,), jnp.int32), jnp.int32(t))
    logits = np.asarray(model.logits(hidden)[0])  # [t, V'] over our draft ids
    d2t = np.asarray(params["d2t"]) if "d2t" in params else np.arange(c.vocab_size)
    np.savez(out / "io.npz", aux_ids=np.asarray(drafter.config.feature_layers), aux=np.asarray(res.hidden[0, :t]).reshape(t, -1), next_ids=np.asarray(tokens[1:]),
             embed=np.asarray(target.params["embed_tokens"]), logits=logits, d2t=d2t, vocab=c.vocab_size)
    print(f"wrote {out}/drafter (speculators layout) and {out}/io.npz ({t} positions)")


def check(out: Path) -> int:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    io = np.load(out / "io.npz")
    model = Eagle3DraftModel.from_pretrained(str(out / "drafter")).float().eval()
    with torch.no_grad():
        model.embed_tokens.weight.copy_(torch.from_numpy(io["embed"]))
    t = io["aux"].shape[0]
    theirs = _their_logits(model, io)  # [t, V'] over their draft ids
    vocab = int(io["vocab"])
    d2t_theirs = (model.d2t.numpy() + np.arange(theirs.shape[1])) if getattr(model, "d2t", None) is not None \
        else np.arange(vocab)
    a = np.full((t, vocab), np.nan)
    b = np.full((t, vocab), np.nan)
    a[:, io["d2t"]] = io["logits"]
    b[:, d2t_theirs] = theirs
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        print("the draft vocabularies differ")
        return 1
    diff = float(np.nanmax(np.abs(a - b)))
    agree = float(np.mean(np.nanargmax(np.nan_to_num(a, nan=-1e30), 1) == np.nanargmax(np.nan_to_num(b, nan=-1e30), 1)))
    print(json.dumps({"positions": t, "draft_vocab": int(theirs.shape[1]), "max_abs_diff": diff,
                      "max_abs_logit": float(np.nanmax(np.abs(a))), "argmax_agreement": agree,
                      "speculators_aux_layer_ids": list(model.config.eagle_aux_hidden_state_layer_ids or [])}))
    return 0 if diff <= 1e-4 else 1


def _their_logits(model, io) -> np.ndarray:
    """speculators' lm_head output [t, V'] of one training-time-test step over io's sequence."""
    import torch

    captured = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, outp: captured.append(outp.detach()))
    t = io["aux"].shape[0]
    with torch.no_grad():
        model(hidden_states=torch.from_numpy(io["aux"])[None], input_ids=torch.from_numpy(io["next_ids"])[None],
              document_ids=torch.zeros(1, t, dtype=torch.long), ttt_steps=1)
    hook.remove()
    return captured[0][0].numpy()


def write(out: Path, target_dir: str) -> None:
    """speculators' own writer: a random Eagle3DraftModel for the target's widths with a reduced
    draft vocabulary, saved with save_pretrained, and its logits on io.npz's inputs."""
    import torch
    from transformers import AutoConfig, LlamaConfig
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    io = np.load(out / "io.npz")
    tc = AutoConfig.from_pretrained(target_dir)
    vocab, keep = tc.vocab_size, 1024
    ids = np.sort(np.random.default_rng(0).choice(vocab, keep, replace=False))
    layer = LlamaConfig(vocab_size=vocab, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                        num_hidden_layers=1, num_attention_heads=tc.num_attention_heads,
                        num_key_value_heads=tc.num_key_value_heads, head_dim=tc.head_dim,
                        rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_parameters["rope_theta"],
                        max_position_embeddings=tc.max_position_embeddings, tie_word_embeddings=False)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=keep, norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=list(map(int, io["aux_ids"])),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(Path(target_dir).resolve()), architectures=tc.architectures)))
    torch.manual_seed(0)
    model = Eagle3DraftModel(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "embed_tokens.weight":
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if p.ndim == 1 else 0.1 * torch.randn_like(p))
        model.embed_tokens.weight.copy_(torch.from_numpy(io["embed"]))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.from_numpy(ids)] = True
    model.load_vocab_mappings(t2d, torch.from_numpy(ids - np.arange(keep)).long())
    model.save_pretrained(str(out / "theirs"))
    np.savez(out / "theirs_logits.npz", logits=_their_logits(model, io), d2t=ids)
    print(f"speculators wrote {out}/theirs and its logits ({keep}-token draft vocabulary)")


def compare(out: Path, target_dir: str) -> int:
    """Imports speculators' checkpoint and compares our draft logits with its own."""
    import jax.numpy as jnp
    from flax import nnx

    import specblock_jax as sbj

    target = sbj.load_target(target_dir, dtype="float32")
    drafter, params = sbj.load_drafter(out / "theirs", target, dtype="float32")
    io, ref = np.load(out / "io.npz"), np.load(out / "theirs_logits.npz")
    t = io["aux"].shape[0]
    model = nnx.merge(drafter.graphdef, params["draft"])
    c = drafter.config
    tok = jnp.asarray(io["next_ids"])[None]
    cache = (jnp.zeros((1, c.num_kv_heads, t, c.head_dim)),) * 2
    hidden, _ = model.step(jnp.take(params["embed"], tok, axis=0), model.fuse(jnp.asarray(io["aux"]).reshape(1, t, -1, c.hidden_size)),
                           jnp.arange(t)[None], jnp.tril(jnp.ones((t, t), bool))[None], cache,
                           jnp.zeros((1,), jnp.int32), jnp.int32(t))
    ours = np.asarray(model.logits(hidden)[0])
    same_vocab = np.array_equal(np.asarray(params["d2t"]), ref["d2t"])
    diff = float(np.max(np.abs(ours - ref["logits"]))) if same_vocab else float("inf")
    print(json.dumps({"positions": t, "draft_vocab": int(ours.shape[1]), "same_d2t": same_vocab,
                      "max_abs_diff": diff, "max_abs_logit": float(np.max(np.abs(ref["logits"]))),
                      "feature_layers": list(c.feature_layers)}))
    return 0 if diff <= 1e-4 else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("prepare", "check", "write", "compare"))
    p.add_argument("out", type=Path)
    p.add_argument("--drafter", default="assets/drafters/eagle3")
    p.add_argument("--target", default="assets/target")
    p.add_argument("--length", type=int, default=48)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "prepare":
        prepare(args.out, args.drafter, args.target, args.length)
        return 0
    if args.step == "write":
        write(args.out, args.target)
        return 0
    return compare(args.out, args.target) if args.step == "compare" else check(args.out)


if __name__ == "__main__":
    sys.exit(main())
