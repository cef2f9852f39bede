"""`specblock-decode`: batch decoding of a JSONL prompt file into a JSONL result file.

Input: one `{"id", "prompt"}` per line, optionally with per-record `max_new_tokens` and
`temperature`; or a conversation to answer instead of the prompt (`"messages"` in the OpenAI form or
`"conversations"` in ShareGPT's, ending with a user turn), rendered with the target tokenizer's chat
template and its generation prompt (`--chat-template FILE.jinja` to give one, `--thinking on|off`
for Qwen3's switch). A drafter that recorded the chat format it was trained on is refused when it
differs from the one served (template or thinking switch). `--prompts` and `--method` also take
a shipped asset's name (`--prompts humaneval`, `--method eagle3`) from any working folder; a path
that exists relative to the working folder wins.

Output: one row per record, told apart by an "error" field: a result `{"id", "text", "token_ids",
"stats", "settings"}` (settings: the method and every setting that changes tokens), or an error
`{"id", "line", "error"}` for a record that cannot be decoded (not UTF-8, invalid JSON, missing
fields, empty or overlong prompt, duplicate id: the first record with an id is decoded, every later
one is an error). Ids keep their JSON type. Each row is appended with a single write as soon as its
batch finishes, so a killed job loses only the batch in flight; rerunning the same command skips
every record already written (resume) and cuts off a torn last line; a rerun with other settings
is refused (exit 2) unless `--new-file` starts the file afresh. Once a run finishes, the file is
rewritten in input order. Some failed records: exit 0 (1 with `--strict`); every record failed: 1.

Scale-out: `--mesh data=4,model=2` splits each batch over the data axis and the target (and its
KV cache) over the model axis. Multi-host (`--coordinator/--num-processes/--process-id`, the
SBJ_* environment, or `--distributed` on a TPU pod / SLURM): every host reads the prompt file,
takes its share of the records (every process_count-th), decodes it in lockstep with the others
and writes `<out stem>.process<i>-of-<n><suffix>` (process 0 also writes the error records);
`cat` the per-host files for the whole result (docs/scale_out.md).

Auto serving (`--method auto:METHOD`, e.g. auto:assets/drafters/eagle3): chunks of the job go to
target-only decoding or to METHOD at its tree budget or half of it, whichever measures fastest per
temperature regime, re-checked now and then (specblock_jax/serving/auto.py); each record's stats
carry its chunk's decision and measurement ("auto").

Serving-time adaptation (`--adapt`, a trainable drafter only): the drafter learns from the verified
tokens between batches whenever the cost-aware controller predicts the update pays over the rest of
the job (docs/adaptation.md); outputs are unchanged. `--adapt-settings` tunes it
(`specblock_jax.adaptation.AdaptConfig` keys; or ':adapt.KEY=VALUE' on the method), `--adapt-save
DIR` writes the adapted drafter at the end. The adapter's whole state (weights, optimizer, replay
buffer, controller, events) is saved to `<out>.adapter/` (`--adapt-state`) as the job runs, and a
resumed job loads it and continues adapting. Each record's stats carry its batch's adaptation event.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

import jax
from tqdm import tqdm

import specblock_jax as sbj
from specblock_jax import checks, jsonl, parallel, writing
from specblock_jax.prompts import id_key, prompt_ids
from specblock_jax.serving import methods
from specblock_jax.training import chat

log = logging.getLogger("specblock-decode")
CHECKOUT = writing.ASSETS.parent  # the checkout holding the embedded default (its assets/)
DEFAULT_TARGET = "assets/target"  # relative to the working folder, else to the checkout


def usage_error(prog: str, message: str) -> SystemExit:
    """A bad argument: one line on stderr, exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return SystemExit(2)


def default_path(value: str) -> str:
    """`value` as given when it exists, else the checkout's copy of it (an `assets/...` default
    from outside the checkout), else as given (the caller's error names it)."""
    if Path(value).exists() or Path(value).is_absolute() or not (CHECKOUT / value).exists():
        return value
    return str(CHECKOUT / value)


def shipped(value: str, folder: str, suffix: str = "") -> str:
    """A path argument that may name a shipped asset: `value` as `default_path` finds it, else,
    for a bare name, the checkout's assets/<folder>/<value><suffix> (`--prompts humaneval`,
    `--method eagle3`), else as given. A path that exists relative to the working folder wins."""
    found = default_path(value)
    if found != value or Path(value).exists() or not value or "/" in value or value.startswith("."):
        return found
    named = CHECKOUT / "assets" / folder / f"{value}{suffix}"
    return str(named) if named.exists() else value


def shipped_prompts(value: Path) -> Path:
    """--prompts: a file, or a shipped prompt set's name (assets/prompts/<name>.jsonl)."""
    return Path(shipped(str(value), "prompts", ".jsonl"))


def shipped_method(method: str) -> str:
    """A method whose drafter is a shipped drafter's name (`eagle3`, `auto:specblock:num_nodes=12`)
    with that name made the shipped folder's path; ar, weightless kinds and folders that exist
    relative to the working folder stay as given."""
    prefix = methods.AUTO if method.startswith(methods.AUTO) else ""
    base, sep, rest = method[len(prefix):].partition(":")
    if base in ("ar", *methods.weightless_kinds()):
        return method
    return prefix + shipped(base, "drafters") + sep + rest


def path_record(path: str) -> str:
    """A path as output rows record it: inside the checkout, relative to it (`eagle3` and
    `assets/drafters/eagle3` record alike, from any working folder); any other as given."""
    try:
        return str(Path(path).resolve().relative_to(CHECKOUT)) if Path(path).exists() else path
    except ValueError:
        return path


def method_record(method: str) -> str:
    """A resolved method as output rows record it: its folder as `path_record` gives it."""
    prefix = methods.AUTO if method.startswith(methods.AUTO) else ""
    base, sep, rest = method[len(prefix):].partition(":")
    return prefix + path_record(base) + sep + rest


def add_cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile-cache", type=Path, default=None,
                   help="JAX's persistent compilation cache folder, so a rerun or a resumed job starts "
                        "warm (default: $SPECBLOCK_JAX_COMPILE_CACHE or ~/.cache/specblock-jax/jax)")
    p.add_argument("--no-compile-cache", action="store_true", help="compile everything afresh, cache nothing")


def use_cache_flags(args) -> None:
    sbj.decoding.use_compile_cache(args.compile_cache, enabled=not args.no_compile_cache)


def show_compiles(bar):
    """A progress bar that says what compiles while it does (instead of sitting at 0%)."""
    return sbj.decoding.on_compile(lambda what: bar.set_postfix_str(f"compiling {what} ...", refresh=True))


def at_least(low: int):
    """A check of an integer flag >= low (`checks.whole`)."""
    return lambda value, field: checks.whole(value, field, low)


def check_flags(prog: str, args, flags: dict) -> None:
    """Each flag's value through the library's one validation (`specblock_jax.checks`, called as
    check(value, flag)): a bad one exits 2 with "<prog>: error: --flag: <what is wrong> (got <value>)"."""
    for flag, check in flags.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None:
            continue
        try:
            check(value, flag)
        except ValueError as e:
            raise usage_error(prog, str(e)) from None


def row_key(row: dict) -> str:
    """The record key of an output row: its id's (`id_key`), or "line N" for an error row."""
    return f"line {row.get('line')}" if "error" in row else id_key(row.get("id"))


def load_target(args, prog: str = "specblock-decode") -> sbj.Target:
    """The checkpoint at --target, or with --random-target a random tiny Qwen3 (4096 positions)."""
    path = None if args.random_target else default_path(args.target)
    if path is not None and not Path(path).is_dir():
        raise usage_error(prog, f"--target: {path}: no such checkpoint folder")
    try:
        return sbj.models.load_text_target(path, seed=args.seed)
    except (sbj.CheckpointError, ValueError, OSError) as e:
        raise usage_error(prog, f"--target: {e}") from None


def cli_method(method: str, target: sbj.Target | None = None, chat_format: dict | None = None,
               prog: str = "specblock-decode", flag: str = "--method"):
    """`check_method` (and with a target, `resolve_method`) with a clear exit on a bad method
    ("<prog>: error: <flag>: ...", exit 2)."""
    try:
        methods.check_method(method)
        return None if target is None else methods.resolve_method(method, target, chat=chat_format)
    except (ValueError, OSError) as e:
        raise usage_error(prog, f"{flag}: {e}") from None


def chat_setup(args, target: sbj.Target, conversations: bool):
    """(chat tokenizer or None, ChatFormat): a tokenizer when records are conversations or a chat
    option is given."""
    fmt = chat.ChatFormat(enable_thinking={"on": True, "off": False}.get(args.thinking))
    if not conversations and args.chat_template is None and args.thinking == "default":
        return None, fmt
    template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
    try:
        return chat.chat_tokenizer(target.tokenizer, template), fmt
    except ValueError as e:
        raise SystemExit(f"{e} (--chat-template FILE.jinja)") from None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="specblock-decode", description=__doc__.split("\n\n")[0],
                                epilog=next(par for par in __doc__.split("\n\n") if par.startswith("Output:")),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=Path, required=True,
                   help="JSONL with {id, prompt} (or {id, messages}) per line, or a shipped set's name "
                        "(humaneval: assets/prompts/humaneval.jsonl)")
    p.add_argument("--chat-template", type=Path, default=None,
                   help="Jinja chat template for conversation records (default: the tokenizer's)")
    p.add_argument("--thinking", choices=("on", "off", "default"), default="default",
                   help="Qwen3's enable_thinking switch for conversation records")
    p.add_argument("--out", type=Path, required=True, help="JSONL results (appended; resumable)")
    p.add_argument("--new-file", action="store_true",
                   help="start --out afresh (its rows are discarded) instead of resuming it")
    p.add_argument("--strict", action="store_true", help="exit 1 when any record failed (default: 0)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="HF checkpoint folder (default %(default)s)")
    p.add_argument("--random-target", action="store_true",
                   help="use a randomly initialised tiny Qwen3 with the shipped tokenizer (smoke tests)")
    p.add_argument("--method", default="ar",
                   help=" | ".join(("ar", *methods.weightless_kinds(), "a drafter folder or a shipped one's name"))
                        + " (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="default per record")
    p.add_argument("--temperature", type=float, default=0.0, help="default per record; 0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--no-refill", action="store_true",
                   help="decode in fixed batches (a batch runs until its longest record ends); by default "
                        "a finished row takes the next record at once (continuous batching; not under --mesh)")
    p.add_argument("--refill-rows", type=int, default=1,
                   help="with continuous batching, return to the host to refill once this many rows are free "
                        "(1: every finished row at once; more: fewer, larger inserts)")
    p.add_argument("--limit", type=int, default=None, help="decode only the first N records")
    p.add_argument("--mesh", default=None,
                   help="device mesh, e.g. data=4,model=2 (batch over data, target over model); "
                        "default: one device (several processes: data=-1 over all devices)")
    p.add_argument("--adapt", action="store_true",
                   help="adapt the drafter to the served prompts between batches (cost-aware)")
    p.add_argument("--adapt-settings", default="",
                   help="AdaptConfig keys, e.g. subset=layer+fc,cost_scale=1,learning_rate=1e-3")
    p.add_argument("--adapt-save", type=Path, default=None, help="write the adapted drafter here")
    p.add_argument("--adapt-state", type=Path, default=None,
                   help="the adapter's state folder (default <out>.adapter): saved as the job runs "
                        "(at most every --adapt-state-every seconds, and at the end), loaded by a resumed job")
    p.add_argument("--adapt-state-every", type=float, default=60.0)
    add_cache_flags(p)
    parallel.distributed.add_flags(p)
    return p.parse_args(argv)


def make_adapter(method: str, served: methods.Method, settings: str):
    """An Adapter for a resolved drafter method, or a clear exit for one that cannot adapt."""
    from specblock_jax.adaptation import AdaptConfig, Adapter

    kind = None if served.loaded is None else sbj.drafters.registry.kind_of(served.loaded.drafter, required=False)
    if served.auto is not None or kind is None or kind.objective is None:
        raise SystemExit(f"adaptation: method {method!r} has no trainable drafter")
    try:
        return Adapter(served.loaded, AdaptConfig.parse(settings))
    except ValueError as e:
        raise SystemExit(f"adaptation ({method!r}): {e}") from None


class AdapterSaver:
    """Saves the adapter's whole state to its folder after records are written, at most every
    `every_s` seconds (`force`: now), so a resumed job continues adapting."""

    def __init__(self, adapter, path: Path | None, every_s: float):
        self.adapter, self.path, self.every_s = adapter, path, every_s
        self.last = time.perf_counter()

    def __call__(self, force: bool = False) -> None:
        if self.adapter is None or self.path is None:
            return
        if force or time.perf_counter() - self.last >= self.every_s:
            self.adapter.save_state(str(self.path))
            self.last = time.perf_counter()


def host_out_path(out: Path) -> Path:
    """This process's result file: `out` itself for one process, else
    <stem>.process<i>-of-<n><suffix>."""
    if jax.process_count() == 1:
        return out
    return out.with_name(f"{out.stem}.process{jax.process_index():03d}-of-"
                         f"{jax.process_count():03d}{out.suffix}")


def _write(out, rec, res) -> None:
    out.write({"id": rec["id"], "text": res.text, "token_ids": res.token_ids, "stats": res.stats.to_dict(),
               "settings": rec["settings"]})


def decode_refill(args, target, served, adapter, mesh, todo, out, bar) -> tuple[int, float, float]:
    """All records in one continuously batched `generate`; each record is written as soon as it
    finishes. Returns (new tokens, run seconds, compile seconds)."""
    seen, acc = set(), {"tokens": 0, "compile": 0.0}
    start = time.perf_counter()

    def finished(batch) -> None:
        for res in batch:
            _write(out, todo[res.index][1], res)
            acc["tokens"] += len(res.token_ids)
            if res.stats.batch not in seen:
                seen.add(res.stats.batch)
                acc["compile"] += res.stats.compile_s
        bar.update(len(batch))
        args.saver()
        run_s = time.perf_counter() - start - acc["compile"]
        bar.set_postfix(tok_s=f"{acc['tokens'] / run_s:.1f}" if run_s > 0 else "-")

    recs = [rec for _, rec in todo]
    served.generate(target, [r["ids"] for r in recs], max_new_tokens=[r["budget"] for r in recs],
                    seed=args.seed, adapter=adapter, on_batch=finished,
                    sampling=sbj.Sampling([r["temp"] for r in recs], top_k=args.top_k, top_p=args.top_p),
                    options=sbj.DecodeOptions(batch_size=args.batch_size, refill=True, refill_rows=args.refill_rows))
    compile_s = acc["compile"] + (adapter.compile_s if adapter is not None else 0.0)
    return acc["tokens"], time.perf_counter() - start - compile_s, compile_s


def decode_batches(args, target, served, adapter, mesh, todo, out, bar) -> tuple[int, float, float]:
    """Records in batches of --batch-size, one `generate` per batch (under a mesh, hosts in
    lockstep). Returns (new tokens, run seconds, compile seconds)."""
    tokens, run_s, compile_s, adapter_compile = 0, 0.0, 0.0, 0.0
    num_batches = -(-len(todo) // args.batch_size)
    if mesh is not None:  # hosts run the same number of generate calls (lockstep)
        num_batches = parallel.host_max([num_batches])[0]
    for start in range(0, num_batches * args.batch_size, args.batch_size):
        batch = [rec for _, rec in todo[start:start + args.batch_size]]
        t0 = time.perf_counter()
        results = served.generate(target, [r["ids"] for r in batch],
                                  max_new_tokens=[r["budget"] for r in batch], seed=args.seed, adapter=adapter,
                                  sampling=sbj.Sampling([r["temp"] for r in batch], top_k=args.top_k, top_p=args.top_p),
                                  options=sbj.DecodeOptions(batch_size=args.batch_size, mesh=mesh, refill=False))
        if not results:  # a host past its share, keeping step with the others
            continue
        batch_compile = results[0].stats.compile_s
        if adapter is not None:  # its compilations are excluded too; its run time counts
            batch_compile += adapter.compile_s - adapter_compile
            adapter_compile = adapter.compile_s
        compile_s += batch_compile
        run_s += time.perf_counter() - t0 - batch_compile
        for rec, res in zip(batch, results):
            tokens += len(res.token_ids)
            _write(out, rec, res)
        bar.update(len(batch))
        args.saver()
        bar.set_postfix(tok_s=f"{tokens / run_s:.1f}" if run_s else "-")
    return tokens, run_s, compile_s


def job_records(args, target):
    """(records, errors, chat tokenizer or None, ChatFormat, line of every record key in the file):
    the prompt file read once, conversations rendered to token ids, cut to --limit and to this
    host's share (process 0 reports the error records)."""
    records, errors = sbj.read_prompts(args.prompts, conversations=True)
    line_of = {r["key"]: r["line"] for r in records}
    tok, fmt = chat_setup(args, target, any(r["messages"] for r in records))
    for rec in records:  # conversations become token ids: the template with its generation prompt
        if rec["messages"]:
            rec["prompt"] = chat.generation_prompt(tok, rec["messages"], fmt)
    if args.limit and len(records) > args.limit:  # the first N records and the errors among them
        cutoff = records[args.limit]["line"]
        records, errors = records[: args.limit], [e for e in errors if e["line"] < cutoff]
    if jax.process_count() > 1:
        records = parallel.host_shard(records)
        errors = errors if jax.process_index() == 0 else []
    return records, errors, tok, fmt, line_of


def record_settings(args, records, chat_format: dict | None) -> None:
    """Each record's budget, temperature and "settings": the method and every setting that
    changes its tokens, as its output row records them (a resume must match them)."""
    base = {"method": method_record(args.method), "target": "random" if args.random_target else path_record(default_path(args.target)),
            "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed, "chat": chat_format}
    for rec in records:
        rec["budget"] = rec["max_new_tokens"] or args.max_new_tokens
        rec["temp"] = args.temperature if rec["temperature"] is None else float(rec["temperature"])
        rec["settings"] = base | {"max_new_tokens": rec["budget"], "temperature": rec["temp"]}


def check_resume(out: Path, records, done: dict) -> None:
    """Exit 2 (one line) when --out holds a record decoded with other settings than this run's."""
    for rec in records:
        row = done.get(rec["key"])
        if row is None or row.get("settings") == rec["settings"]:
            continue
        old = row.get("settings") or {}
        diff = "; ".join(f"{k} {old.get(k)!r} there, {v!r} here" for k, v in rec["settings"].items()
                         if old.get(k) != v) if old else "no settings recorded there"
        raise usage_error("specblock-decode", f"--out: {out} holds record {rec['id']!r} decoded with other "
                                              f"settings ({diff}); resume with those, or pass --new-file to "
                                              "start the file afresh")


def plan(target, records, errors, done: dict) -> tuple[list, list]:
    """(todo: (prompt length, record) with the record's token ids, the error rows still to write):
    every prompt encoded and checked once (`prompt_ids`, as `generate` checks it); one that cannot
    be decoded (empty, over-long) becomes an error row naming its record."""
    limit, todo = target.config.max_position_embeddings, []
    for rec in records:
        if rec["key"] in done:
            continue
        try:
            rec["ids"] = prompt_ids(target, rec["prompt"], rec["budget"], limit)
        except ValueError as e:
            errors.append({"key": f"line {rec['line']}", "id": rec["id"], "line": rec["line"], "error": str(e)})
            continue
        todo.append((len(rec["ids"]), rec))
    return todo, [e for e in errors if e["key"] not in done]


def in_input_order(path: Path, line_of: dict) -> list:
    """Rewrites a finished output file in input order (rows of records no longer in the input
    last); an error row of a record decoded since (e.g. over-long before a smaller budget) is
    dropped. Returns its rows."""
    rows = jsonl.read_rows(path)
    decoded = {line_of.get(row_key(r)) for r in rows if "error" not in r}
    keep = [r for r in rows if "error" not in r or r.get("line") not in decoded]

    def place(row):  # (0, its input line), or (1, 0): a row of a record no longer in the input
        line = row.get("line") if "error" in row else line_of.get(row_key(row))
        return (0, line) if isinstance(line, int) else (1, 0)

    ordered = sorted(keep, key=place)  # (stable: equal places keep their file order)
    if ordered != rows:
        jsonl.replace_rows(path, ordered)
    return ordered


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    check_flags("specblock-decode", args, {
        "--max-new-tokens": checks.max_new_tokens, "--temperature": checks.temperature, "--top-k": checks.top_k,
        "--top-p": checks.top_p, "--batch-size": at_least(1), "--refill-rows": at_least(1), "--limit": at_least(1)})
    parallel.distributed.initialize_from_args(args)  # before any other JAX call
    use_cache_flags(args)
    args.prompts = shipped_prompts(args.prompts)
    if not args.prompts.is_file():
        raise usage_error("specblock-decode", f"--prompts: {args.prompts}: no such prompt file")
    args.method, method_adapt = methods.split_adapt(shipped_method(args.method))
    if method_adapt is not None:  # ':adapt...' keys on the method work like --adapt
        args.adapt = True
        args.adapt_settings = ",".join(filter(None, [args.adapt_settings, method_adapt]))
    cli_method(args.method)
    mesh = None
    if args.mesh or jax.process_count() > 1:
        try:
            mesh = parallel.make_mesh(args.mesh or "data=-1,model=1")
        except ValueError as e:
            raise SystemExit(f"--mesh: {e}") from None
        log.info("mesh %s over %d devices, %d processes", parallel.mesh_str(mesh),
                 jax.device_count(), jax.process_count())
    target = load_target(args)
    records, errors, tok, fmt, line_of = job_records(args, target)
    record_settings(args, records, fmt.record(tok) if tok is not None else None)
    args.out = host_out_path(args.out)
    if args.new_file and args.out.exists():
        args.out.unlink()
    done = {row_key(r): r for r in jsonl.read_rows(args.out) if isinstance(r, dict)}
    check_resume(args.out, records, done)
    served = cli_method(args.method, target, fmt.record(tok) if tok is not None else None)
    adapter = setup_adapter(args, served, mesh)
    if mesh is not None:  # lay the weights out once (generate then finds them in place)
        plan_ = parallel.ShardingPlan(mesh)
        target = target.replace(params=plan_.put(target.params))
        if served.loaded is not None:
            served = dataclasses.replace(served, loaded=served.loaded._replace(params=plan_.put(served.loaded.params)))
    todo, new_errors = plan(target, records, errors, done)
    out = jsonl.Appender(args.out)
    for e in new_errors:
        log.warning("%s line %d (id %r): %s", args.prompts, e["line"], e["id"], e["error"])
        out.write({k: e[k] for k in ("id", "line", "error")})
    log.info("%d records to decode, %d already done, %d errors", len(todo),
             len(done.keys() & {r["key"] for r in records}), len(new_errors))
    todo.sort(key=lambda x: x[0])  # similar lengths share a batch and a length bucket
    refill = mesh is None and not args.no_refill and len(todo) > args.batch_size
    with tqdm(total=len(todo), desc=f"decode ({args.method})", unit="rec") as bar, show_compiles(bar):
        run = decode_refill if refill else decode_batches
        tokens, run_s, compile_s = run(args, target, served, adapter, mesh, todo, out, bar)
    out.close()
    args.saver(force=True)
    return report(args, served, adapter, todo, tokens, run_s, compile_s,
                  in_input_order(args.out, line_of), {r["line"] for r in records} | {e["line"] for e in errors})


def setup_adapter(args, served, mesh):
    """The serving-time adapter (--adapt; None without), its state loaded from --adapt-state
    (default <out>.adapter) when a job resumes; sets args.saver."""
    adapter = None
    if args.adapt:
        if served.auto is not None:
            raise SystemExit("--adapt does not combine with an auto: method yet")
        if mesh is not None:
            raise SystemExit("--adapt does not run under a mesh yet")
        adapter = make_adapter(args.method, served, args.adapt_settings)
        state = args.adapt_state or args.out.with_name(args.out.name + ".adapter")
        if (state / "state.json").exists() and not args.new_file:
            try:
                adapter.load_state(str(state))
            except ValueError as e:
                raise SystemExit(f"--adapt-state: {e}") from None
            log.info("continuing adaptation from %s (%d batches, %d updates so far)", state,
                     len(adapter.events), adapter.controller.updates)
        args.adapt_state = state
    args.saver = AdapterSaver(adapter, args.adapt_state if adapter is not None else None,
                              args.adapt_state_every)
    return adapter


def report(args, served, adapter, todo, tokens, run_s, compile_s, rows, job_lines: set) -> int:
    """The closing lines; exit status 1 when every record of the job failed, or any with --strict."""
    if served.auto is not None:
        print(f"auto: {json.dumps(served.auto.summary())}")
    if adapter is not None:
        print(f"adaptation: {json.dumps(adapter.summary())}")
        if args.adapt_save:
            adapter.save(str(args.adapt_save))
            print(f"adapted drafter -> {args.adapt_save}")
    failed = sum(1 for r in rows if "error" in r and r.get("line") in job_lines)
    print(f"\n{len(todo)} records decoded with {args.method} -> {args.out}; {failed} error records")
    print(f"{tokens} new tokens, {tokens / run_s if run_s else float('nan'):.1f} tokens/s "
          f"(compilation excluded: {compile_s:.1f} s)")
    if failed and failed == len(job_lines):
        print(f"specblock-decode: every record failed ({failed} of {failed}); see {args.out}", file=sys.stderr)
        return 1
    if failed:
        print(f"specblock-decode: {failed} of {len(job_lines)} records failed (their errors are in "
              f"{args.out}){'' if args.strict else '; --strict makes that exit 1'}", file=sys.stderr)
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
