"""`specblock-bench`: several decoding methods on one prompt set, in one process, side by side.

Follows the measurement protocol of DESIGN.md: target-only autoregressive decoding (`ar`) is the
speedup baseline; every method decodes the same prompts with the same batch size, budget and
temperature; compilation is excluded from throughput and reported apart. Before the first timed
run, an untimed warm-up decodes the first --warmup-prompts prompts target-only (the first run in a
process measured up to ~12% slower than a repeat on the 2-core CPU); its time is in results.json
("warmup"), and the executables it compiled are not compiled again by `ar`.
Interleaved: the prompts split into --rounds (default 3) contiguous chunks; every method decodes
chunk 1, then every method chunk 2, ..., round r in the methods' order rotated by r (round 1: ar,
m1, m2; round 2: m1, m2, ar; ...), so a slow spell of a shared machine falls on all methods alike
and no method always runs first (each prompt keeps its own key stream: outputs do not depend on
the rounds).
  tau       tokens committed per decoding forward of the target, bonus token included
            (the prefill's first token is not counted); per prompt, median [min, max]
  tokens/s  new tokens / decode-loop wall time, summed over batches and rounds
  speedup   pooled: the method's tokens/s over all rounds / `ar`'s, with [min-max] of the
            per-round ratios (each round's tokens/s of the method / of `ar`; results.json
            "round_speedups", "round_new_tokens", "round_wall_s")
Step profile (decoding/step_profile.py): every phase of a decoding step compiled alone at the
batch's exact loop shapes (batch, prompt bucket, cache length, node budget N) and timed at a
mid-decode length (max_new_tokens // 2 committed tokens), median of 7 calls; a method's phase
time is the mean over its batches weighted by each batch's decoding steps (results.json keeps
each distinct shape's profile under "step_profiles"):
  draft ms/token   drafting time per committed token: (propose + update) of one batched step x
                   the steps each row ran (its batch waits for its longest row), over new tokens;
                   `draft share` = that time / decode-loop wall time; `draft fwd/token` = drafter
                   network forwards per committed token
  verify ms/step   the target's forward over the N tree nodes + verification and commit (the
                   cache compaction, stop/budget bookkeeping, output and history writes)
  1-token fwd ms   one target-only decoding step (a one-token forward, sampling, the writes),
                   measured at the method's own cache length
  (results.json also keeps `ideal_speedup` = tau of the run x (1-token fwd ms) / (verify ms/step)
  and `achieved_over_ideal`; the table leaves them out: the step profiles they divide are timed
  apart from the run, and identical decodes showed 1.02x and 1.15x)
  same      fraction of prompts whose tokens equal `ar`'s (must be 1.0 at temperature 0; n/a when
            sampling, whose losslessness is a distribution property tested in the test suite)
Tree-shape calibration: a drafter method with ':calibrate=true' first calibrates its tree shape
on this machine (serving/calibrate.py: the kind's knobs, e.g. EAGLE-3 num_nodes x depth, over
its default candidates or those of --calibrate-grid) by decoding --calibrate-prompts prompts
(default 4) disjoint from the measured ones: the first of --prompts (after --skip), which the
measurement then leaves out, or the first of --calibrate-from FILE; at the run's batch size,
temperature and budget at every setting, separately for every (temperature, batch size), then
runs at the fastest. results.md says which prompts calibrated (results.json
"meta.calibration_prompts"); the chosen setting and the calibration's wall time (compilation
included) are reported apart ("calibrated (s)" column; results.json "calibrated", "calibrate_s"
and "calibration", the whole table), not counted in tokens/s.
Serving-time adaptation: a drafter method with ':adapt=true' or ':adapt.KEY=VALUE' settings (or
every drafter method, with `--adapt`, next to its plain run) adapts between batches
(docs/adaptation.md; `--adapt-settings` applies to all, method keys override); its tokens/s
then counts the adaptation time (compilation excluded, as for decoding), and the run also writes
its decisions (adapt_<method>_T<t>_b<b>.jsonl) and tau per batch over the run (adapt_tau.png).
Writes results.json, results.md, speedup.png and every method's completions
(outputs_<method>_T<temperature>.jsonl) into --out-dir, the first two after every finished (batch
size, temperature) group (results.json "meta.complete" says whether the run got to the end; a
group whose summary or report fails leaves its decoding in unreported_T<t>_b<b>.json.gz);
`specblock-bench --replot DIR` redraws the plots of a finished run. After the table the run prints
three lines: where the outputs went, the fastest method (pooled speedup [round min-max]), and the
command that runs the same comparison on one's own checkpoint and drafter.
Priced columns (`--price TOPO,PRESET`, needs the `tpu` extra; infer/bench_price.py): each method's
decoding step compiled ahead of time for a TPU topology at a target preset's shapes (or an HF
folder's; prompt bucket --price-context + --max-new-tokens, the group's batch size), after its
rounds and outside every timing, beside the measured columns: priced_step_ms, priced_speedup
(tau_run of this run x priced target-only step / priced speculative step) and
priced_draft_ms_per_token. Acceptance from this run, step costs from the TPU compiler's cost model:
an estimate, not a measurement (the table's header says so). Each (method, size, batch) compiles
once.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

import specblock_jax as sbj
from specblock_jax import checks, read_prompts
from specblock_jax import overrides as kv
from specblock_jax.decoding.compiled import cached_count, release
from specblock_jax.decoding.sizing import summed_sizing
from specblock_jax.decoding.step_profile import PHASES, ideal_speedup
from specblock_jax.drafters import registry
from specblock_jax.serving.calibrate import calibrate, default_grid, with_setting
from specblock_jax.serving.methods import Method, split_adapt, weightless_kinds

from .bench_price import PriceSpec, Pricer, price_all, summed_commit_hist
from .bench_report import closing_lines, compare, replot, sizing_table, table, write_results
from .decode import (DEFAULT_TARGET, add_cache_flags, at_least, check_flags, cli_method, load_target, make_adapter,
                     shipped_method, shipped_prompts, show_compiles, usage_error, use_cache_flags)
from .labels import method_label


PROG = "specblock-bench"


def drafter_forwards_per_step(served: Method) -> int:
    """Drafter forwards per decoding step (0 for ar and prompt lookup; an auto method's drafter's)."""
    return 0 if served.loaded is None else int(getattr(served.loaded.drafter, "forwards_per_step", 0))


def split_calibrate(method: str) -> tuple[str, bool]:
    """Strips ':calibrate=true|false' from a method: (the method without it, whether to calibrate)."""
    rest, taken = kv.take(method, {"calibrate"})
    on = False
    for _, value in taken:
        try:
            on = kv.boolean(value, "calibrate")
        except ValueError:
            raise SystemExit(f"--methods: {method!r}: calibrate takes true or false, got {value!r}") from None
    if on and rest.split(":")[0] == "ar":
        raise SystemExit(f"--methods: {method!r}: target-only decoding has no tree to calibrate")
    return rest, on


def split_host_settings(method: str) -> tuple[str, dict[str, str]]:
    """Strips a method's host-side settings (a kind's `DrafterKind.method_settings`, e.g.
    BlockPilot's ':oracle=LABELS_DIR'): (the method without them, {key: value})."""
    rest, taken = kv.take(method, registry.method_setting_names())
    return rest, dict(taken)


def apply_host_settings(served: Method, settings: dict[str, str], target, method: str) -> Method:
    """`served` with each host-side setting applied by its drafter's kind; a clear exit for a
    setting the kind does not have or a value it refuses."""
    if served.loaded is None or served.auto is not None:
        raise SystemExit(f"--methods: {method!r}: {', '.join(settings)}= needs a plain drafter method")
    kind = registry.get(served.loaded.drafter.kind)
    loaded = served.loaded
    for key, value in settings.items():
        if key not in kind.method_settings:
            raise SystemExit(f"--methods: {method!r}: {key}= is not a setting of the {kind.name} kind")
        try:
            loaded = kind.method_settings[key](loaded, value, target)
        except ValueError as e:
            raise SystemExit(f"--methods: {method!r}: {key}: {e}") from None
    return Method(method, loaded)


def profile_summary(results) -> dict:
    """Per-phase ms of a method's step (each batch's profile weighted by its decoding steps) and
    every distinct profiled shape with its step count."""
    batches: dict[int, tuple[int, dict]] = {}
    for r in results:
        steps = r.stats.target_forwards - 1
        prev = batches.get(r.stats.batch, (0, None))[0]
        batches[r.stats.batch] = (max(steps, prev), r.stats.step_profile or {})
    shapes: dict[tuple, dict] = {}
    for steps, prof in batches.values():
        key = tuple(sorted((k, v) for k, v in prof.items() if not k.endswith("_ms")))
        entry = shapes.setdefault(key, {**prof, "steps": 0, "batches": 0})
        entry["steps"] += steps
        entry["batches"] += 1
    out: dict = {}
    for ph in PHASES:
        have = [(e["steps"] or e["batches"], e[f"{ph}_ms"]) for e in shapes.values() if f"{ph}_ms" in e]
        out[f"{ph}_ms"] = (sum(w * v for w, v in have) / sum(w for w, _ in have)) if have else None
    out["step_profiles"] = list(shapes.values())
    return out


def step_figures(prof: dict, tau_run: float, is_ar: bool) -> tuple:
    """(drafting ms per step, tree forward + verification ms per step, ideal speedup) from a
    method's profile_summary; None where the phases they need were never profiled (an auto: run
    whose profiled chunks all went to target-only: not a free draft), and (None, None, 1.0) for
    target-only."""
    if is_ar:
        return None, None, 1.0
    phases = [prof["propose_ms"], prof["update_ms"]]
    draft = None if phases == [None, None] else sum(v or 0.0 for v in phases)
    if prof["tree_forward_ms"] is None or prof["verify_ms"] is None:
        return draft, None, None
    verify = prof["tree_forward_ms"] + prof["verify_ms"]
    ideal = ideal_speedup(tau_run, prof["forward_1_ms"], prof["tree_forward_ms"], prof["verify_ms"]) \
        if prof["forward_1_ms"] is not None else None
    return draft, verify, ideal


def batch_taus(results) -> list[float]:
    """tau of every batch in decoding order (tokens committed per target forward, bonus included)."""
    per: dict[int, list[int]] = {}
    for r in results:
        acc = per.setdefault(r.stats.batch, [0, 0])
        acc[0] += len(r.token_ids) - 1
        acc[1] += r.stats.target_forwards - 1
    return [t / f if f else 1.0 for t, f in (per[b] for b in sorted(per))]


def prepare_method(target, method, temperature, batch_size, args, cal_prompts: list | None) -> dict:
    """A method ready to decode: its drafter (calibrated first when asked, on `cal_prompts`: prompts
    held out from the measurement, `calibration_split`) and its adapter."""
    base, calib = split_calibrate(method)
    base, adapt = split_adapt(base)
    base, host = split_host_settings(base)
    served = cli_method(base, target, prog=PROG, flag="--methods")
    if host:
        if calib or adapt is not None:
            raise SystemExit(f"--methods: {method!r}: a method with {', '.join(host)}= neither calibrates nor adapts")
        served = apply_host_settings(served, host, target, method)
    calibration = None
    if served.auto is not None and (calib or adapt is not None):
        raise SystemExit(f"--methods: {method!r}: an auto: method neither calibrates nor adapts")
    if calib:
        print(f"calibrating {method_label(method)} on {len(cal_prompts)} prompts "
              f"(T={temperature:g}, batch {batch_size})", flush=True)
        try:
            own = default_grid(served.loaded.drafter)
            grid = {k: args.calibrate_grid.get(k, v) for k, v in own.items()}
            calibration = calibrate(target, served.loaded, cal_prompts, grid, max_new_tokens=args.max_new_tokens,
                                    batch_size=batch_size, temperature=temperature, seed=args.seed,
                                    verify_timing=False)
        except ValueError as e:
            raise SystemExit(f"--methods: {method!r}: {e}") from None
        calibration["prompts"] = len(cal_prompts)
        served = Method(served.name, with_setting(served.loaded, calibration["best"]))
    adapter = None
    if adapt is not None:
        adapter = make_adapter(method, served, ",".join(filter(None, [args.adapt_settings, adapt])))
    return {"method": method, "served": served, "calibration": calibration, "adapter": adapter}


def decode_prompts(target, prep: dict, prompts, temperature, batch_size, args, start: int = 0,
                   results: list | None = None, note: str = "") -> list:
    """Decodes `prompts` (positions start.. of the whole prompt list: their key streams are those
    of the whole job) with a prepared method and appends the results to `results`, their batch
    indices continuing after the batches already there. An adapter or auto method learns only
    what a server would: the prompts of this call, not how many the job decodes after them."""
    results = [] if results is None else results
    offset = 1 + max((r.stats.batch for r in results), default=-1)
    label = f"T={temperature:g} b={batch_size} {method_label(prep['method'])}{note}"
    keys = None if prep["served"].auto is not None else range(start, start + len(prompts))
    with tqdm(total=len(prompts), desc=label, unit="prompt", file=sys.stdout, leave=True) as bar, show_compiles(bar):
        done = {"tokens": 0, "wall": 0.0, "batches": set()}

        def on_batch(batch):  # prompts done and the decode loop's tokens/s so far
            done["tokens"] += sum(len(r.token_ids) for r in batch)
            if batch[0].stats.batch not in done["batches"]:
                done["batches"].add(batch[0].stats.batch)
                done["wall"] += batch[0].stats.total_time_s
            bar.update(len(batch))
            bar.set_postfix_str(f"{done['tokens'] / max(done['wall'], 1e-9):.0f} tok/s")

        options = sbj.DecodeOptions(batch_size=batch_size, profile="all", refill=False if args.no_refill else None,
                                    key_index=keys, queue=args.queue)
        new = prep["served"].generate(target, prompts, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                      adapter=prep["adapter"], on_batch=on_batch, sampling=sbj.Sampling(temperature),
                                      options=options)
    for r in new:
        r.stats.batch += offset
    results += new
    return results


def rotation(items: list, r: int) -> list:
    """Round r's order: `items` rotated left by r (round 0 as given, round 1 from the second, ...),
    so over len(items) rounds every item runs once in every position."""
    k = r % len(items)
    return items[k:] + items[:k]


def loop_time(results) -> tuple[int, float]:
    """(new tokens, decode-loop wall seconds) of results: each batch's (or refill segment's) wall
    time counted once."""
    walls = {r.stats.batch: r.stats.total_time_s for r in results}
    return sum(len(r.token_ids) for r in results), float(sum(walls.values()))


def run_rounds(target, prompts, methods, temperature, batch_size, args,
               cal_prompts: list | None = None, pricer: Pricer | None = None) -> list[dict]:
    """Every method on all prompts, interleaved: the prompts in --rounds contiguous chunks, each
    chunk decoded by every method in turn, round r's order `rotation(methods, r)`. Returns every
    method's results.json row (`summarise`), in `methods` order, with its new tokens and seconds
    (adaptation included) per round, and with a `pricer`, its priced columns."""
    preps = [prepare_method(target, m, temperature, batch_size, args, cal_prompts) for m in methods]
    results: list[list] = [[] for _ in methods]
    rounds: list[list[tuple[int, float]]] = [[] for _ in methods]
    bounds = np.linspace(0, len(prompts), args.rounds + 1).round().astype(int)
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if a == b:  # more rounds than prompts
            continue
        for i in rotation(list(range(len(methods))), k):
            prep, res, before, adapt_before = preps[i], results[i], len(results[i]), adapt_time(preps[i])
            decode_prompts(target, prep, prompts[a:b], temperature, batch_size, args, start=int(a),
                           results=res, note=f" [round {k + 1}/{args.rounds}]")
            tokens, wall = loop_time(res[before:])
            rounds[i].append((tokens, wall + adapt_time(prep) - adapt_before))
    try:
        rows = [summarise(p, r, temperature, batch_size, n) for p, r, n in zip(preps, results, rounds)]
    except Exception:
        keep_unreported(args, f"T{temperature:g}_b{batch_size}", [
            {"method": p["method"], "rounds": n, "results": [{"token_ids": x.token_ids, **x.stats.to_dict()} for x in r]}
            for p, r, n in zip(preps, results, rounds)])
        raise
    if pricer is not None:
        for prep, row in zip(preps, rows):
            commits = None if row["commit_hist"] is None else np.asarray(row["commit_hist"])
            row.update(pricer.row(prep["served"], row["tau_run"], batch_size, commits))
    return rows


def keep_unreported(args, name: str, payload) -> None:
    """A finished group's decoding that its summary or report failed on, kept as
    unreported_<name>.json.gz in --out-dir (a reporting bug must not cost a long run its work)."""
    out_dir = getattr(args, "out_dir", None)
    if out_dir is not None:
        path = Path(out_dir) / f"unreported_{name}.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump(payload, f, default=str)
        print(f"the group's decoding is kept in {path}", file=sys.stderr, flush=True)


def adapt_time(prep: dict) -> float:
    """Seconds the method's adapter has spent so far (compilation excluded); 0 without one."""
    return prep["adapter"].time_s if prep["adapter"] is not None else 0.0


def summarise(prep: dict, results: list, temperature: float, batch_size: int,
              rounds: list[tuple[int, float]]) -> dict:
    """A method's results.json row from all its results (in prompt order) and its (new tokens,
    seconds) per round."""
    method, served, calibration, adapter = prep["method"], prep["served"], prep["calibration"], prep["adapter"]
    batches: dict[int, dict] = {}  # per batch: loop wall time, tokens, drafting time, compile time
    for r in results:
        b = batches.setdefault(r.stats.batch, {"wall": r.stats.total_time_s, "tokens": 0,
                                                  "draft": 0.0, "compile": r.stats.compile_s})
        b["tokens"] += len(r.token_ids)
        b["draft"] = r.stats.batch_draft_time_s  # the batch's (or refill segment's) steps x one step
    decode_wall = sum(b["wall"] for b in batches.values())
    adapt_s = adapter.time_s if adapter is not None else 0.0
    wall = decode_wall + adapt_s  # end to end: adaptation time counts
    tokens = sum(b["tokens"] for b in batches.values())
    # drafting time over the batches whose step was profiled (an auto: run profiles each option once
    # per call: profiling every 2-request chunk cost more than decoding it)
    timed = [b for b in batches.values() if b["draft"] is not None]
    draft, draft_tokens = sum(b["draft"] for b in timed), sum(b["tokens"] for b in timed)
    draft_wall = sum(b["wall"] for b in timed)
    taus = [r.stats.tau for r in results if r.stats.tau is not None]
    prof = profile_summary(results)
    tau_median = float(np.median(taus))
    tau_run = sum(len(r.token_ids) - 1 for r in results) / max(sum(r.stats.target_forwards - 1 for r in results), 1)
    is_ar = served.auto is None and served.loaded is None
    draft_step, verify_step, ideal = step_figures(prof, tau_run, is_ar)
    return {
        "method": method, "temperature": temperature, "batch_size": batch_size, "prompts": len(results), "new_tokens": tokens,
        "wall_s": wall, "tokens_per_s": tokens / wall,
        "round_new_tokens": [t for t, _ in rounds], "round_wall_s": [w for _, w in rounds],
        "batch_tokens_per_s": [b["tokens"] / b["wall"] for b in batches.values()],
        "tau_median": tau_median, "tau_min": float(np.min(taus)), "tau_max": float(np.max(taus)),
        "tau_mean": float(np.mean(taus)), "tau_run": tau_run,
        "target_forwards": int(sum(r.stats.target_forwards for r in results)),
        "draft_s_per_token": draft / draft_tokens if draft_tokens else None,  # None: no batch profiled
        "draft_forwards_per_token": drafter_forwards_per_step(served) * sum(
            r.stats.target_forwards for r in results) / tokens,
        "draft_share": draft / draft_wall if draft_wall else None,
        "compile_s": float(sum(b["compile"] for b in batches.values()))
        + (adapter.compile_s if adapter is not None else 0.0),
        "decode_s": decode_wall, "adapt_s": adapt_s, "batch_taus": batch_taus(results),
        "commit_hist": summed_commit_hist(results),
        "sizing": summed_sizing([r.stats.sizing for r in results], batch_size),
        **{k: v for k, v in prof.items() if k != "step_profiles"},
        "draft_ms_per_step": draft_step, "verify_ms_per_step": verify_step, "ideal_speedup": ideal,
        "step_profiles": prof["step_profiles"],
        "calibrated": calibration["best"] if calibration else None,
        "calibrate_s": calibration["calibrate_s"] if calibration else 0.0,
        "calibration": calibration,
        "adapt": adapter.summary() if adapter is not None else None,
        "adapt_events": adapter.events if adapter is not None else None,
        "auto": served.auto.summary() if served.auto is not None else None,
        "auto_events": served.auto.events if served.auto is not None else None,
        "token_ids": [r.token_ids for r in results],
        "texts": [r.text for r in results],
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="specblock-bench", description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=Path, required=True,
                   help="JSONL prompt file, or a shipped set's name (humaneval: assets/prompts/humaneval.jsonl)")
    p.add_argument("--methods", default=",".join(("ar", *weightless_kinds())),
                   help="comma list of ar, drafter kinds with no folder, drafter folders and shipped drafters' "
                        "names (a folder name under assets/drafters; default "
                        "%(default)s); ar (target-only, the speedup baseline) is always added")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--temperatures", default="0", help="comma list, e.g. 0,1")
    p.add_argument("--batch-size", default="1", help="comma list, e.g. 1,8; each has its own ar baseline")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--skip", type=int, default=0, help="skip the first K records")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3,
                   help="split the prompts into this many contiguous chunks and run every method on each "
                        "chunk, the methods' order rotated by one each round, so a slow spell of a shared "
                        "machine falls on every method alike; calibration runs before the first round")
    p.add_argument("--queue", type=int, default=0, metavar="N",
                   help="the adapter and auto count as work still to do only the rows in flight and the next "
                        "N waiting requests, as a server holding N requests would (0: every request of the round)")
    p.add_argument("--warmup-prompts", type=int, default=8,
                   help="prompts decoded target-only, untimed, before the first timed run (0 = no warm-up)")
    p.add_argument("--no-refill", action="store_true",
                   help="fixed batches instead of continuous batching (a finished row takes the next prompt)")
    p.add_argument("--adapt", action="store_true",
                   help="also run every drafter method with serving-time adaptation (':adapt=true')")
    p.add_argument("--adapt-settings", default="", help="AdaptConfig keys, e.g. subset=layer,cost_scale=1")
    p.add_argument("--calibrate-prompts", type=int, default=4,
                   help="prompts a ':calibrate=true' method calibrates its tree shape on: the first K of "
                        "--prompts (after --skip), then left out of the measurement, or of --calibrate-from")
    p.add_argument("--calibrate-from", type=Path, default=None, metavar="FILE",
                   help="a JSONL prompt file to calibrate on instead (its first --calibrate-prompts "
                        "prompts; none may be a measured prompt)")
    p.add_argument("--calibrate-grid", action="append", default=[], metavar="KNOB=V,V,...",
                   help="candidates of one knob for ':calibrate=true' methods (repeatable; each kind uses "
                        "its own knobs, the others keep serving/calibrate.py's defaults), e.g. num_nodes=8,16")
    p.add_argument("--price", default=None, metavar="TOPO,PRESET",
                   help="also price every method's decoding step with the TPU compiler (needs the tpu extra) "
                        "at a preset's (or HF folder's) shapes, e.g. v5p:2x2x1,qwen3-8b: columns "
                        "priced_step_ms, priced_speedup (this run's tau x "
                        "priced target-only step / priced speculative step), priced_draft_ms_per_token; "
                        "an estimate, not a measurement")
    p.add_argument("--price-cache", type=Path, default=None, metavar="DIR",
                   help="keep the priced milliseconds in DIR and reuse them in later runs on the same "
                        "library code, jax and libtpu (bench_price.py); meta['price']['sources'] says which "
                        "were compiled and which read")
    p.add_argument("--price-only", action="store_true",
                   help="with --price and --price-cache: price every method's step at every --batch-size into "
                        "the cache and exit without decoding (fill the cache beside other work; the "
                        "measured run then compiles nothing)")
    p.add_argument("--price-context", type=int, default=2048, metavar="C",
                   help="prompt bucket of the priced steps; their cache holds it + --max-new-tokens "
                        "(default %(default)s)")
    add_cache_flags(p)
    return p.parse_args(argv)


def parse_grid(items: list[str]) -> dict[str, tuple[int, ...]]:
    """['num_nodes=8,16', 'depth=3'] -> {"num_nodes": (8, 16), "depth": (3,)}; SystemExit on a bad item."""
    knobs = {k for kind in registry.kinds() for k in (registry.get(kind).grid or {})}
    grid = {}
    for item in items:
        try:
            key, values = kv.split(item, "--calibrate-grid:")
            grid[key] = tuple(int(v) for v in values.split(","))
        except ValueError:
            raise SystemExit(f"--calibrate-grid: {item!r} is not KNOB=INT,INT,...") from None
        if key not in knobs:
            raise SystemExit(f"--calibrate-grid: unknown knob {key!r} (knobs: {sorted(knobs)})")
    return grid


def calibration_split(records: list[dict], args, calibrating: bool) -> tuple[list[dict], list[dict]]:
    """(calibration records, measured records) from --prompts' records after --skip: when a method
    calibrates, the first --calibrate-prompts records (or --calibrate-from's) calibrate and are not
    measured; the measurement takes --limit of the rest. SystemExit when a calibration prompt is
    also a measured one, or when either set is empty."""
    if not calibrating:
        return [], records[: args.limit] if args.limit else records
    k = max(1, args.calibrate_prompts)
    if args.calibrate_from is None:
        cal, rest, source = records[:k], records[k:], args.prompts
    else:
        cal, rest, source = read_prompts(args.calibrate_from)[0][:k], records, args.calibrate_from
    measured = rest[: args.limit] if args.limit else rest
    if not cal:
        raise SystemExit(f"calibration: no prompt to calibrate on in {source}")
    if not measured:
        raise SystemExit(f"no prompt left to measure once the first {len(cal)} prompts of {source} calibrate "
                         "(lower --calibrate-prompts or give --calibrate-from)")
    texts = {r["prompt"] for r in cal}
    if clash := [r["id"] for r in measured if r["prompt"] in texts]:
        raise SystemExit(f"calibration: measured record(s) {', '.join(map(str, clash[:5]))} repeat a calibration prompt "
                         f"of {source}; calibration prompts must not be measured")
    return cal, measured


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--replot":  # redraw a finished run
        replot(Path(sys.argv[2]))
        return 0
    args = parse_args(argv)
    args.calibrate_grid = parse_grid(args.calibrate_grid)
    check_flags(PROG, args, {"--max-new-tokens": checks.max_new_tokens, "--rounds": at_least(1),
                             "--limit": at_least(0), "--skip": at_least(0), "--warmup-prompts": at_least(0)})
    try:
        [checks.temperature(float(v), "--temperatures") for v in args.temperatures.split(",")]
        [checks.whole(int(v), "--batch-size", 1) for v in str(args.batch_size).split(",")]
    except ValueError as e:
        raise usage_error(PROG, str(e) if str(e).startswith("--") else f"comma lists of numbers: {e}") from None
    args.prompts = shipped_prompts(args.prompts)  # a file, or a shipped set's name (humaneval)
    if args.calibrate_from is not None:
        args.calibrate_from = shipped_prompts(args.calibrate_from)
    if not args.prompts.is_file():
        raise usage_error(PROG, f"--prompts: {args.prompts}: no such prompt file")
    use_cache_flags(args)
    methods = [shipped_method(m) for m in args.methods.split(",") if m]  # (eagle3: the shipped drafter)
    methods = ["ar"] + [m for m in methods if m != "ar"]
    if args.adapt:
        methods = [v for m in methods for v in
                   ([m, m + ":adapt=true"] if split_adapt(m)[0].split(":")[0] not in ("ar", *weightless_kinds())
                    and split_adapt(m)[1] is None else [m])]
    for m in methods:
        cli_method(split_adapt(split_calibrate(m)[0])[0], prog=PROG, flag="--methods")  # fail fast if unknown
    pricer = (Pricer(PriceSpec.parse(args.price, args.price_context, args.max_new_tokens), args.price_cache)
              if args.price else None)
    args.random_target = False
    target = load_target(args, PROG)
    if args.price_only:
        if pricer is None or args.price_cache is None:
            raise SystemExit("--price-only needs --price TOPO,PRESET and --price-cache DIR")
        resolved = [cli_method(split_host_settings(split_adapt(split_calibrate(m)[0])[0])[0], target, prog=PROG, flag="--methods")
                    for m in methods]
        price_all(pricer, resolved, methods, [int(b) for b in str(args.batch_size).split(",")])
        return 0
    records, errors = read_prompts(args.prompts)
    cal_records, records = calibration_split(records[args.skip:], args,
                                             any(split_calibrate(m)[1] for m in methods))
    prompts = [r["prompt"] for r in records]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "specblock-bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]},
        "target": str(args.target), "target_params": sbj.models.count_params(target.params),
        "prompts": str(args.prompts), "num_prompts": len(prompts), "skipped_records": len(errors),
        "batch_sizes": [int(b) for b in str(args.batch_size).split(",")], "max_new_tokens": args.max_new_tokens, "seed": args.seed,
        "rounds": args.rounds, "calibrate_grid": args.calibrate_grid,
        "calibration_prompts": {"source": str(args.calibrate_from or args.prompts), "held_out": args.calibrate_from is None,
                                "ids": [r["id"] for r in cal_records]} if cal_records else None,
        "price": dataclasses.asdict(pricer.spec) | {"note": pricer.spec.header()} if pricer else None,
    }
    rows = []
    mark = cached_count()
    groups = [(int(b), float(t)) for b in str(args.batch_size).split(",") for t in args.temperatures.split(",")]
    if args.warmup_prompts > 0 and prompts:
        t0 = time.perf_counter()
        warm = sbj.generate(target, prompts[:args.warmup_prompts], max_new_tokens=args.max_new_tokens,
                            seed=args.seed, sampling=sbj.Sampling(groups[0][1]),
                            options=sbj.DecodeOptions(batch_size=groups[0][0], refill=False if args.no_refill else None))
        meta["warmup"] = {"prompts": len(warm), "wall_s": time.perf_counter() - t0,
                          "compile_s": sum({r.stats.batch: r.stats.compile_s for r in warm}.values())}
        print(f"warm-up (untimed): target-only on {len(warm)} prompts, {meta['warmup']['wall_s']:.1f} s", flush=True)
    for i, (batch_size, temperature) in enumerate(groups):
        group = run_rounds(target, prompts, methods, temperature, batch_size, args,
                           [r["prompt"] for r in cal_records], pricer)
        try:
            compare(group, temperature)  # group[0] is ar's
            if pricer is not None:
                meta["price"]["sources"] = dict(pricer.sources)
            write_results(args.out_dir, {**meta, "complete": i == len(groups) - 1}, records, group, rows + group)
        except Exception:
            keep_unreported(args, f"T{temperature:g}_b{batch_size}", group)
            raise
        rows += group
        # a group's executables (every method's loops, adapters, auto options) serve no later group:
        # XLA:CPU runs out of code memory when a long run keeps them all (a 4-group run crashed)
        release(mark)
    replot(args.out_dir)
    note = "\n" + meta["price"]["note"] if pricer else ""
    print(note + "\n" + table(rows) + sizing_table(rows) + "\n\n" + "\n".join(closing_lines(rows, args.out_dir, own_command(args))))
    return 0


def own_command(args) -> str:
    """The same comparison on one's own Hugging Face checkpoint, prompts and drafter (this run's
    settings where they differ from the defaults)."""
    defaults = parse_args(["--prompts", "-", "--out-dir", "-"])
    same = [f"--{k.replace('_', '-')} {getattr(args, k)}" for k in ("temperatures", "batch_size", "max_new_tokens")
            if getattr(args, k) != getattr(defaults, k)]
    return " ".join(["specblock-bench --target /path/to/hf_model --prompts your_prompts.jsonl",
                     f"--methods {','.join(('ar', *weightless_kinds()))},/path/to/drafter", *same,
                     "--out-dir your_bench"])


if __name__ == "__main__":
    sys.exit(main())
