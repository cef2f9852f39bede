"""A real two-process `jax.distributed` run on one machine (CPU backend, gloo collectives):
`specblock-train eagle3` for a few steps and a `specblock-decode` job with the trained drafter,
each as two local processes with 2 CPU devices apiece on a data=2,model=2 mesh.

    .venv/bin/python scripts/two_process_demo.py [--workdir DIR] [--steps 6] [--prompts 9]

Steps (the output of each is printed):
  1. regenerate a small training set with the embedded target (assets/target), one process;
  2. train: two processes of `specblock-train eagle3 ... --mesh data=2,model=2
     --coordinator localhost:PORT --num-processes 2 --process-id I` (each host reads every other
     training example; global batch 8; orbax checkpoints written jointly; process 0 exports);
  3. decode: two processes of `specblock-decode ... --method <trained drafter> --mesh
     data=2,model=2 ...` on an odd number of prompts (hosts get 5 and 4: the lighter host runs a
     padding batch to keep step), one result file per host;
  4. reference: the same decode in one process on one device; the per-host files must hold every
     record exactly once, token-identical to the reference.
Exit status 0 only if all of that holds.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specblock_jax import jsonl  # (imports no backend: the processes below choose theirs)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the console scripts are installed beside this Python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def program(name: str) -> str:
    """The path of console script `name` beside this Python (specblock-train, specblock-decode)."""
    path = BIN / name
    if not path.exists():
        raise SystemExit(f"{path} not found: run this script with the Python of the environment "
                         "where specblock-jax is installed (e.g. .venv/bin/python)")
    return str(path)


def launch_pair(name_of_program: str, args: list[str], logs: Path, name: str) -> float:
    """Runs `program args` as processes 0 and 1 of one jax.distributed job."""
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}
    env.pop("XLA_FLAGS", None)
    procs, start = [], time.perf_counter()
    for pid in range(2):
        cmd = [program(name_of_program), *args, "--coordinator", f"localhost:{port}",
               "--num-processes", "2", "--process-id", str(pid)]
        log = open(logs / f"{name}.process{pid}.log", "w")
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        if pid == 0:
            print("$", name_of_program, " ".join(cmd[1:]), flush=True)
    codes = []
    for proc, log in procs:
        codes.append(proc.wait(timeout=900))
        log.close()
    seconds = time.perf_counter() - start
    for pid in range(2):
        lines = (logs / f"{name}.process{pid}.log").read_text().splitlines()
        keep = [ln for ln in lines if ln.strip() and not any(s in ln for s in ("%|", "Gloo"))]
        print(f"--- {name} process {pid} (exit {codes[pid]}), last lines (progress bars left out):")
        print("\n".join("    " + ln[:160] for ln in keep[-4:]))
    if any(codes):
        raise SystemExit(f"{name}: a process failed; logs in {logs}")
    return seconds


def regenerate(work: Path, n_prompts: int) -> None:
    import specblock_jax as sbj

    target = sbj.load_target(ROOT / "assets" / "target")
    records = jsonl.read_rows(ROOT / "assets/prompts/humaneval.jsonl", torn="raise")
    records = sorted(records, key=lambda r: len(r["prompt"]))[:64]
    prompts = [r["prompt"] for r in records]
    results = sbj.generate(target, prompts, max_new_tokens=48, options=sbj.DecodeOptions(batch_size=16))
    regen = work / "regen"
    regen.mkdir(parents=True, exist_ok=True)
    jsonl.replace_rows(regen / "greedy.jsonl", (
        {"id": rec["id"], "mode": "greedy", "prompt_ids": list(target.tokenizer(rec["prompt"])["input_ids"]),
         "response_ids": res.token_ids} for rec, res in zip(records, results)))
    jsonl.replace_rows(work / "prompts.jsonl", ({"id": rec["id"], "prompt": rec["prompt"]} for rec in records[:n_prompts]))
    print(f"regenerated {len(records)} training records; {n_prompts} decode prompts", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=9)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="sbj_two_process_"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    regenerate(work, args.prompts)

    train_s = launch_pair("specblock-train", [
        "eagle3", "--config", "configs/drafters/eagle3.yaml", "--mesh", "data=2,model=2",
        "target_dir=assets/target", f"regen_dir={work / 'regen'}", f"tfds_dir={work / 'tfds'}",
        f"run_dir={work / 'run'}", f"out_dir={work / 'drafter'}", f"max_steps={args.steps}",
        "batch_size=8", "max_len=96", "warmup_steps=2", "log_every=1", "ckpt_every=3",
        "eval_every=0", f"eval_prompts={work / 'prompts.jsonl'}", "eval_num_prompts=4",
        "eval_max_new_tokens=16", "ttt_steps=2"], logs, "train")
    metrics = jsonl.read_rows(work / "run" / "metrics.jsonl", torn="raise")
    losses = [round(m["loss"], 4) for m in metrics if "loss" in m]
    evals = [m for m in metrics if "eval_tau_mean" in m]
    print(f"train: {len(losses)} steps in {train_s:.0f} s, losses {losses}, final eval "
          f"{ {k: evals[-1][k] for k in ('eval_tau_mean', 'eval_prompts')} if evals else None}")
    ckpts = sorted(p.name for p in (work / "run" / "checkpoints").iterdir() if p.name.isdigit())
    print(f"train: checkpoints {ckpts}; exported drafter files "
          f"{sorted(p.name for p in (work / 'drafter').iterdir())}")

    decode_args = ["--prompts", str(work / "prompts.jsonl"), "--target", "assets/target",
                   "--method", str(work / "drafter"), "--batch-size", "2",
                   "--max-new-tokens", str(args.max_new_tokens)]
    decode_s = launch_pair("specblock-decode", [*decode_args, "--out", str(work / "out.jsonl"),
                                            "--mesh", "data=2,model=2"], logs, "decode")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    ref = subprocess.run([program("specblock-decode"), *decode_args, "--out", str(work / "ref.jsonl")],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    if ref.returncode:
        raise SystemExit(ref.stderr[-3000:])
    per_host = {}
    for pid in range(2):
        path = work / f"out.process{pid:03d}-of-002.jsonl"
        per_host[pid] = jsonl.read_rows(path, torn="raise")
    reference = {r["id"]: r["token_ids"] for r in jsonl.read_rows(work / "ref.jsonl", torn="raise")}
    got = [r for recs in per_host.values() for r in recs]
    ids = [r["id"] for r in got]
    identical = sum(reference[r["id"]] == r["token_ids"] for r in got)
    taus = [r["stats"]["tau"] for r in got]
    print(f"decode: {decode_s:.0f} s; records per host { {p: len(v) for p, v in per_host.items()} }; "
          f"{len(set(ids))} distinct ids of {len(reference)} (duplicates: {len(ids) - len(set(ids))}); "
          f"{identical}/{len(reference)} token-identical to the one-device decode; "
          f"tau per record {[round(t, 2) if t else t for t in taus]}")
    ok = sorted(ids) == sorted(reference) and identical == len(reference)
    print("OK" if ok else "MISMATCH", f"(work dir {work})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
