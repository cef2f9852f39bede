"""`specblock-train`: train the target or any registered drafter kind from a YAML config.

    specblock-train target --config configs/target/reference.yaml [key=value ...]
    specblock-train <kind> --config configs/drafters/<kind>.yaml [key=value ...]
    specblock-train blockpilot {labels,train} [--config configs/drafters/blockpilot.yaml] [...]

Every run goes through the one trainer (`specblock_jax.trainer.trainer.train`). `target` runs
`train.train_target` (the target's task, `specblock_jax.trainer.target_task`); a kind that names
its own training command (`DrafterKind.train_command`: `blockpilot` runs its package's `_command.main`, its
labels and its policy's registered task) runs it with its options as they are.
Any other kind is a drafter kind with a training task in the drafter registry
(`specblock_jax.drafters.registry`). For a drafter kind the config is the YAML
merged over `CLI_DEFAULTS`, `trainer.TRAINER_DEFAULTS` (configs/drafters/README.md lists them) and
the kind's settings dataclass (`Task.Settings`), then the `key=value` overrides, each typed like
the value it replaces; an unknown key is refused. The run:
  1. loads the target from `target_dir`;
  2. builds the `specblock_regen` TFDS dataset of `regen_dir` into `tfds_dir` and batches its
     train split with `BatchIterator(batch_size, max_len, seed)`;
  3. takes the first `eval_num_prompts` evaluation prompts: from the prompt JSONL `eval_prompts`
     ({"id", "prompt"} per line) if set, else the distinct prompts of the regen validation split;
  4. builds the task from the kind's own keys (`registry.get(kind).task(settings, target)`, which
     parses them into its frozen settings dataclass) and runs `trainer.train` with the tau
     evaluation (`trainer.tau_evaluator`; resumable: rerun the same command after an interruption).

`--mesh data=4,model=2` runs the drafter's train step sharded (FSDP + tensor parallel, batch over
"data"); checkpoints restore onto any mesh shape. Multi-host: `--coordinator/--num-processes/
--process-id` (or SBJ_* environment, or `--distributed` for auto-detection); `batch_size` is then
the global batch and each host reads every process_count-th training example
(docs/scale_out.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

import jax

import specblock_jax as sbj
from specblock_jax import parallel, read_prompts
from specblock_jax.training.regen_dataset import BatchIterator, build_tfds
from specblock_jax.drafters import draft_vocab, registry
from specblock_jax.drafters.io import record_chat
from specblock_jax.trainer.trainer import TRAINER_DEFAULTS, OutDirError, check_out_dir, tau_evaluator, train

from . import train_target

# Keys the command line reads for a drafter run, with their defaults.
CLI_DEFAULTS: dict[str, Any] = {
    "name": "",  # "" = the kind; names the default run_dir
    "target_dir": "assets/target",
    "target_dtype": "",  # "" = float32 on CPU, the checkpoint's dtype on accelerators
    "regen_dir": "data/regen/train",
    "tfds_dir": "",  # "" = <regen_dir>/tfds
    "batch_size": 8,
    "max_len": 512,
    "eval_prompts": "",  # "" = the regen validation split's prompts
    "eval_num_prompts": 16,
    "init_from": "",  # a drafter folder (ours or a serving engine's layout) to fine-tune; "" = random init
}


def kind_defaults(kind: str) -> dict[str, Any]:
    """The defaults of drafter kind `kind`'s own settings ({} for a task without `Settings`)."""
    settings = getattr(registry.get(kind).task, "Settings", None)
    if settings is None:
        return {}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings()).items()}


def load_drafter_config(path: str | Path, overrides: Sequence[str] = (),
                        defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The YAML at `path` over the CLI, trainer and `defaults` (the kind's settings), with
    `key=value` overrides applied.

    Raises ValueError naming the bad item for a non-mapping YAML, an override without '=', an
    unknown key or a value of the wrong type.
    """
    loaded = yaml.safe_load(Path(path).read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    cfg = {**CLI_DEFAULTS, **TRAINER_DEFAULTS, **(defaults or {}), **loaded}
    return train_target.apply_overrides(cfg, overrides)


def resolve_paths(cfg: dict[str, Any], kind: str) -> dict[str, Any]:
    """Fills name, run_dir (runs/<kind>/<name>), out_dir (<run_dir>/export), tfds_dir and kind."""
    out = {**cfg, "kind": kind, "name": cfg["name"] or kind}
    out["run_dir"] = cfg["run_dir"] or f"runs/{kind}/{out['name']}"
    out["out_dir"] = cfg["out_dir"] or str(Path(out["run_dir"]) / "export")
    out["tfds_dir"] = cfg["tfds_dir"] or str(Path(cfg["regen_dir"]) / "tfds")
    return out


def eval_prompt_list(cfg: dict[str, Any], sources: dict[str, Any]) -> list[str | list[int]]:
    """The first `eval_num_prompts` evaluation prompts: texts from the JSONL `eval_prompts`, or
    token ids (BOS first) of the distinct ids of the regen validation split."""
    n = cfg["eval_num_prompts"]
    if n <= 0:
        return []
    if cfg["eval_prompts"]:
        path = Path(cfg["eval_prompts"])
        if not path.exists():
            raise FileNotFoundError(f"eval_prompts: {path} does not exist")
        records, errors = read_prompts(path)
        for err in errors:
            print(f"eval_prompts {path} {err['key']}: skipped, {err['error']}", file=sys.stderr)
        return [r["prompt"] for r in records[:n]]
    if "validation" not in sources:
        raise ValueError(f"regen_dir {cfg['regen_dir']}: the data has no validation split (too few "
                         "records); set eval_prompts to a prompt JSONL or eval_num_prompts=0")
    source, prompts, seen = sources["validation"], [], set()
    for i in range(len(source)):
        ex = source[i]
        if ex["id"] not in seen:
            seen.add(ex["id"])
            prompts.append([int(t) for t in ex["prompt_ids"]])
            if len(prompts) == n:
                break
    return prompts


def count_draft_vocab(source, vocab_size: int, size: int, run_dir: str) -> str:
    """The `size` most frequent target tokens (prompt and response) of the training examples as a
    draft vocabulary, written to <run_dir>/draft_vocab.safetensors (process 0); its path."""
    counts = draft_vocab.count_tokens(
        (list(ex["prompt_ids"]) + list(ex["response_ids"]) for ex in (source[i] for i in range(len(source)))),
        vocab_size)
    vocab = draft_vocab.from_counts(counts, size)
    covered = counts[vocab.d2t].sum() / max(counts.sum(), 1)
    print(f"draft vocabulary: {size} of {vocab_size} target tokens, {covered:.1%} of the training tokens")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        draft_vocab.save(run_dir, vocab)
    parallel.sync("specblock-train-draft-vocab")
    return str(Path(run_dir) / draft_vocab.FILE)


def train_drafter(kind: str, cfg: dict[str, Any], mesh: Any = None) -> dict[str, Any]:
    """Loads the target and data of `cfg`, builds the kind's task from its own keys (those that
    are not run or trainer keys) and trains it; the summary.
    mesh: None (one device) or a `jax.sharding.Mesh` (see `specblock_jax.parallel`)."""
    builder = registry.get(kind).task
    if builder is None:
        raise ValueError(f"drafter kind {kind!r} has no training task (trainable: {registry.kinds(trainable=True)})")
    cfg = resolve_paths(cfg, kind)
    check_out_dir(cfg["out_dir"], cfg["run_dir"], bool(cfg.get("overwrite")))  # before loading anything
    run_keys = {*CLI_DEFAULTS, *TRAINER_DEFAULTS, "kind", "run_dir", "out_dir"}
    settings = {k: v for k, v in cfg.items() if k not in run_keys}
    target = sbj.load_target(cfg["target_dir"], dtype=cfg["target_dtype"] or None)
    hosts = jax.process_count()
    if hosts > 1 and cfg["batch_size"] % hosts:
        raise ValueError(f"batch_size={cfg['batch_size']} (the global batch) does not split over "
                         f"{hosts} processes")
    if jax.process_index() != 0:  # process 0 builds the TFDS data first (shared file systems)
        parallel.sync("specblock-train-tfds")
    sources = build_tfds(cfg["regen_dir"], cfg["tfds_dir"]).as_data_source()
    if jax.process_index() == 0:
        parallel.sync("specblock-train-tfds")
    if "train" not in sources:
        raise ValueError(f"regen_dir {cfg['regen_dir']}: the data has no train split")
    train_source = sources["train"] if hosts == 1 else parallel.HostShard(sources["train"])
    prompts = eval_prompt_list(cfg, sources)

    def data_iter_factory(state: dict[str, int] | None) -> BatchIterator:
        return BatchIterator(train_source, batch_size=cfg["batch_size"] // hosts,
                             max_len=cfg["max_len"], seed=cfg["seed"], state=state)

    initial = start_from_drafter(kind, cfg, settings, target) if cfg["init_from"] else None
    if settings.get("draft_vocab_size") and not settings.get("draft_vocab"):
        settings["draft_vocab"] = cfg["draft_vocab"] = count_draft_vocab(
            sources["train"], target.config.vocab_size, settings["draft_vocab_size"], cfg["run_dir"])
    print(json.dumps(cfg))
    print(f"{kind}: {len(train_source):,} training examples, {len(prompts)} evaluation prompts, "
          f"run dir {cfg['run_dir']}")
    task = builder(settings, target)
    if initial is not None:
        initial = check_initial(task, *initial)
        task.init_params = lambda key: initial  # a fresh run starts from it; a resumed one from its checkpoint
    summary = train(task, cfg, data_iter_factory, tau_evaluator(task, target, prompts, cfg, mesh), mesh=mesh)
    chat = regen_chat_format(cfg["regen_dir"])
    if chat and jax.process_index() == 0:  # serving checks it (sbj.load_drafter(..., chat=...))
        record_chat(cfg["out_dir"], chat)
    return summary


def start_from_drafter(kind: str, cfg: dict[str, Any], settings: dict[str, Any], target) -> tuple:
    """Loads the `init_from` drafter (any layout `sbj.load_drafter` reads) for fine-tuning: its
    feature layers and reduced draft vocabulary become this run's settings. Returns (drafter,
    decoding params)."""
    drafter, params = sbj.load_drafter(cfg["init_from"], target, dtype="float32")
    if drafter.kind != kind:
        raise ValueError(f"init_from {cfg['init_from']}: a {drafter.kind} drafter, not {kind}")
    if hasattr(drafter.config, "feature_layers"):
        settings["feature_layers"] = list(drafter.config.feature_layers)
    if "d2t" in params:
        vocab = draft_vocab.DraftVocab(np.asarray(params["d2t"]), np.asarray(params["t2d"]))
        Path(cfg["run_dir"]).mkdir(parents=True, exist_ok=True)
        draft_vocab.save(cfg["run_dir"], vocab)
        settings["draft_vocab_size"] = int(vocab.d2t.shape[0])
        settings["draft_vocab"] = cfg["draft_vocab"] = str(Path(cfg["run_dir"]) / draft_vocab.FILE)
    return drafter, params


def check_initial(task, drafter, params) -> dict:
    """The trainable params of `drafter` when its architecture is the task's, else a ValueError
    naming the fields that differ."""
    mine = dataclasses.asdict(task.config)
    theirs = dataclasses.asdict(drafter.config)
    diff = {k: (theirs.get(k), v) for k, v in mine.items() if k != "dtype" and theirs.get(k) != v}
    if diff:
        raise ValueError(f"init_from: the drafter differs from this run's architecture in "
                         f"{', '.join(f'{k} (drafter {a!r}, run {b!r})' for k, (a, b) in diff.items())}")
    return jax.tree.map(lambda x: x.astype(task.config.dtype), params["draft"])


def regen_chat_format(regen_dir: str) -> dict[str, Any] | None:
    """The chat format recorded by `train.regenerate --conversations` in regen_dir, or None."""
    path = Path(regen_dir) / "settings.json"
    return json.loads(path.read_text()).get("chat") if path.exists() else None


def own_command(name: str):
    """The `main(argv, prog)` that trains kind `name` (its `DrafterKind.train_command`), or None
    for the target, an unknown name or a kind trained from a YAML config."""
    if name not in registry.kinds():
        return None
    return registry.get(name).train_command


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = own_command(argv[0]) if argv else None
    if command is not None:  # a kind trained by its own command (BlockPilot's, in its package)
        command(argv[1:], prog=f"specblock-train {argv[0]}")
        return
    kinds = ["target", *registry.kinds(trainable=True)]
    parser = argparse.ArgumentParser(
        prog="specblock-train", description=__doc__.split("\n\n")[0],
        epilog=f"kinds: {', '.join(kinds)}")
    parser.add_argument("kind", help=f"what to train: {' | '.join(kinds)}")
    parser.add_argument("--config", required=True, help="YAML config (configs/<...>/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value settings overriding the config")
    parser.add_argument("--mesh", default=None,
                        help="device mesh for a drafter run, e.g. data=4,model=2 (default: one "
                             "device; several processes: data=-1 over all devices)")
    parallel.distributed.add_flags(parser)
    args = parser.parse_intermixed_args(argv)
    if args.kind not in kinds:
        parser.error(f"unknown kind {args.kind!r}: choose from {', '.join(kinds)}")
    parallel.distributed.initialize_from_args(args)  # before any other JAX call
    if args.kind == "target" and (args.mesh or jax.process_count() > 1):
        parser.error("--mesh and multi-host runs apply to drafter kinds; the target trainer "
                     "runs on one device")
    mesh = None
    if args.mesh or jax.process_count() > 1:
        try:
            mesh = parallel.make_mesh(args.mesh or "data=-1,model=1")
        except ValueError as e:
            parser.error(f"--mesh: {e}")
    if args.kind == "target":
        train_target.main(["--config", args.config, *args.overrides])
        return
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config}: no such file")
    try:
        cfg = load_drafter_config(args.config, args.overrides, kind_defaults(args.kind))
    except ValueError as e:
        parser.error(str(e))
    try:
        summary = train_drafter(args.kind, cfg, mesh=mesh)
    except OutDirError as e:
        print(f"specblock-train: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps({k: summary.get(k) for k in ("steps", "stop_reason", "eval_tau_mean",
                                                  "eval_tau_median", "out_dir")}))


if __name__ == "__main__":
    main()
