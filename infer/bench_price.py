"""`specblock-bench --price TOPO,PRESET`: step costs from the TPU compiler beside the measured columns.

Acceptance comes from this run (the embedded miniature or whatever target the bench decodes); step
costs come from compiling each method's decoding step ahead of time for a TPU topology at a
deployment preset's shapes (`specblock_jax.aot`, which needs the `tpu` extra: libtpu). The result
is an estimate, not a measurement, and sits in its own columns:

    priced_step_ms             the estimated time of one decoding step: target-only's one-token
                               step for `ar`, the whole speculative step (propose, tree forward,
                               verify + commit, update) for the others; the roofline of the TPU
                               compiler's per-device counts, max(FLOPs / peak bf16 FLOP/s, bytes
                               accessed / HBM bandwidth) (`aot.report.roofline_seconds`; libtpu's
                               own `optimal_seconds`, a different estimate, is negative, no
                               estimate, for many programs)
    priced_speedup             tau_run (tokens committed per decoding forward, measured here)
                               x priced target-only step / priced speculative step
    priced_draft_ms_per_token  the priced drafting phases (propose + update) / tau_run
    priced_update              (a drafter whose update switches on the rows a step committed:
                               SpecBlock) how its update was priced: as the run's mix of the
                               switch's buckets, each compiled alone (`stats.commit_hist`), or at
                               the costliest branch, as XLA's cost analysis prices a switch

Each (method kind, tree or block size, batch) compiles once per run (`Pricer` caches it), only the
phases these columns read (no prefill). With `--price-cache DIR` the priced milliseconds are also
kept on disk, one JSON file per (spec, shape, batch), keyed as well by a digest of the library's
source files and the jax and libtpu versions, so a later run on the same code reuses them instead
of compiling again (a Qwen3-8B step takes ~0.5-1 min per phase to compile on a 2-core CPU); any
change to the library's code or the compiler misses the cache. `Pricer.sources` says, per shape,
whether it was compiled in this run or read from the cache (and when that entry was computed), and
the bench's meta records it. A column that cannot be priced (an `auto:` method, a phase
that failed to compile or whose counts are unknown) is None. How far such estimates
are from measured TPU figures: docs/findings.md, tpu_validation.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import importlib.metadata
import json
from pathlib import Path

import specblock_jax
from specblock_jax.drafters import registry
from specblock_jax.drafters.common import bucket_of
from specblock_jax.serving.methods import Method

PRICED_KEYS = ("priced_step_ms", "priced_speedup", "priced_draft_ms_per_token")


@dataclasses.dataclass(frozen=True)
class PriceSpec:
    """Where to price: a TPU topology name ("v5e:2x2"), a target (a preset such as "qwen3-8b", or an
    HF folder / config.json: `aot.load_target_config`) and the prompt bucket `context` (the priced
    cache holds context + the run's max new tokens)."""

    topology: str
    target: str
    context: int = 2048
    max_new: int = 256

    @classmethod
    def parse(cls, text: str, context: int = 2048, max_new: int = 256) -> "PriceSpec":
        """'TOPO,PRESET' -> PriceSpec; SystemExit naming the form on anything else."""
        topo, sep, target = text.partition(",")
        if not sep or not topo or not target or "," in target:
            raise SystemExit(f"--price: expected TOPOLOGY,PRESET (e.g. v5e:2x2,qwen3-0.6b), got {text!r}")
        if context < 1:
            raise SystemExit(f"--price-context must be >= 1, got {context}")
        return cls(topo, target, context, max_new)

    def header(self) -> str:
        """The plain statement that heads the priced table."""
        return (f"Priced columns (estimates, not measurements): acceptance (tau_run) from this run's own "
                f"decoding, step costs from the roofline of the TPU compiler's FLOP and byte counts at "
                f"{self.target}'s shapes on {self.topology} (prompt bucket {self.context} + {self.max_new} "
                "new tokens, this run's batch size): "
                "priced_speedup = tau_run x priced target-only step / priced speculative step. "
                "The compiler's estimate leaves out host overhead, launch gaps and collectives' latency: "
                "against published TPU measurements it priced steps fast (docs/findings.md, tpu_validation).")


def method_shape(method: Method) -> dict | None:
    """How the bench's method drafts, in `aot.price_method`'s terms: {"method": kind with its
    ':key=value' tree settings, "nodes" or "block": its size}; {"method": "ar"} for target-only;
    None for an `auto:` method (it switches between options: no one step to price). The drafter is
    sized as released for the preset (`aot.released_drafter`); only the tree or block size and
    the settings its kind's `AotPreset.priced_settings` names (EAGLE-3's top_k/depth) come from
    the bench's method."""
    if method.auto is not None:
        return None
    if method.loaded is None:
        return {"method": "ar"}
    d = method.loaded.drafter
    kind = d.kind
    preset = registry.get(kind).aot if kind in registry.kinds() else None
    if preset is not None and preset.size_knob == "block_size":
        # a block drafter (BlockPilot drafts at routed sizes <= its DFlash's block: priced at that)
        return {"method": kind, "block": int(d.num_nodes)}
    knobs = "".join(f":{k}={getattr(d, k)}" for k in (preset.priced_settings if preset is not None else ()))
    return {"method": kind + knobs, "nodes": int(d.num_nodes)}


@functools.cache
def code_digest() -> str:
    """sha256 of the library's source files (paths and bytes) and the jax and libtpu versions: what
    a priced step depends on besides its spec, shape and batch."""
    h = hashlib.sha256()
    root = Path(specblock_jax.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("jax", "jaxlib", "libtpu"):
        try:
            h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist} absent".encode())
    return h.hexdigest()


class Pricer:
    """Prices decoding steps for one `PriceSpec`, compiling each distinct (method, size, batch) once
    (and, with `cache_dir`, once per code version: module docstring)."""

    def __init__(self, spec: PriceSpec, cache_dir: Path | None = None):
        from specblock_jax import aot
        from specblock_jax.aot.report import roofline_seconds

        try:  # fail before any decoding: no libtpu (the error names the `tpu` extra), a bad name
            aot.require_libtpu()
            aot.get_topology(spec.topology)  # an unknown one: the error lists valid names
            self.target = aot.load_target_config(spec.target)
        except (ImportError, ValueError) as e:
            raise SystemExit(f"--price: {e}") from None
        self.spec, self._aot, self._roofline = spec, aot, roofline_seconds
        self.cache_dir = cache_dir
        self._cache: dict[tuple, dict] = {}
        self.sources: dict[str, str] = {}  # shape and batch -> "compiled" | "cache (computed DATE)"

    def _disk(self, shape: dict, batch: int) -> Path | None:
        """The cache file of one (spec, shape, batch) at this code version, or None without a cache."""
        if self.cache_dir is None:
            return None
        key = json.dumps({"spec": dataclasses.asdict(self.spec), "shape": shape, "batch": batch,
                          "code": code_digest()}, sort_keys=True)
        return self.cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"

    def phases_ms(self, shape: dict, batch: int) -> dict:
        """{phase: estimated ms} of the phases of `shape`'s step at `batch` that compiled and were priced."""
        key = (tuple(sorted(shape.items())), batch)
        name = f"{json.dumps(shape, sort_keys=True)} batch {batch}"
        disk = self._disk(shape, batch)
        if key not in self._cache and disk is not None and disk.exists():
            entry = json.loads(disk.read_text())
            self._cache[key] = entry["ms"]
            self.sources[name] = f"cache {disk} (computed {entry['computed_at']})"
        if key not in self._cache:
            s = dict(shape)
            wanted = (("target_step",) if s["method"] == "ar" else ("update",) if "row_bucket" in s
                      else ("spec_step", "propose", "update"))
            try:
                rec = self._aot.price_method(self.target, s.pop("method"), self.spec.topology, batch=batch,
                                             context=self.spec.context, max_new=self.spec.max_new,
                                             phases_wanted=wanted, **s)
            except ValueError as e:  # an unknown topology (the message lists valid names), a bad setting
                raise SystemExit(f"--price: {e}") from None
            # the roofline of the compiler's counts, as the tpu_aot tables price (libtpu's own
            # optimal_seconds is negative, no estimate, for many programs); a phase that failed or
            # whose counts are unknown (a failed cut compile) has none
            ms = {name: self._roofline(p, rec["chip"]) for name, p in rec["phases"].items()}
            self._cache[key] = {phase: 1e3 * s for phase, s in ms.items() if s is not None}
            self.sources[name] = "compiled"
            if disk is not None:
                disk.parent.mkdir(parents=True, exist_ok=True)
                when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                tmp = disk.with_suffix(".tmp")
                tmp.write_text(json.dumps({"ms": self._cache[key], "computed_at": when, "shape": shape,
                                           "batch": batch, "spec": dataclasses.asdict(self.spec)}, indent=1))
                tmp.replace(disk)
        return self._cache[key]

    def update_mix(self, shape: dict, batch: int, rows: int, commits) -> tuple[float, dict] | None:
        """A row-switched update (SpecBlock's: `drafters.common.switch_on_rows` over `rows` path
        rows) priced as it ran: each bucket's update compiled alone, weighted by the run's steps at
        that bucket (`commits`[c]: steps whose batch committed at most c tokens). (ms, {bucket:
        share of steps}), or None when a bucket could not be priced."""
        steps: dict[int, int] = {}
        for count, n in enumerate(commits):
            if n and count:
                b = bucket_of(count, rows)
                steps[b] = steps.get(b, 0) + int(n)
        if not steps:
            return None
        ms = {b: self.phases_ms({**shape, "row_bucket": b}, batch).get("update") for b in steps}
        if any(v is None for v in ms.values()):
            return None
        total = sum(steps.values())
        return sum(ms[b] * n for b, n in steps.items()) / total, {b: round(n / total, 4) for b, n in sorted(steps.items())}

    def row(self, method: Method, tau_run: float, batch: int, commits=None) -> dict:
        """The priced columns of one bench row (None where the step could not be priced). commits:
        the run's steps by the most tokens a batch committed (summed `stats.commit_hist`); with a
        drafter whose update switches on them (`update_rows`), the update is priced as that mix
        of its buckets (`update_mix`) in place of the switch's costliest branch, which XLA's cost
        analysis charges, and `priced_update` says which."""
        out = dict.fromkeys(PRICED_KEYS)
        shape = method_shape(method)
        if shape is None:
            return out
        base = self.phases_ms({"method": "ar"}, batch).get("target_step")
        if shape["method"] == "ar":
            return {**out, "priced_step_ms": base, "priced_speedup": None if base is None else 1.0}
        ms = dict(self.phases_ms(shape, batch))
        rows = getattr(method.loaded.drafter, "update_rows", None)
        if rows and commits is not None and "update" in ms:
            mix = self.update_mix(shape, batch, rows, commits)
            if mix is not None:
                if "spec_step" in ms:  # the step's own update is priced at the switch's costliest branch
                    ms["spec_step"] += mix[0] - ms["update"]
                ms["update"] = mix[0]
                out["priced_update"] = {"by": "the run's mix of row buckets", "share_of_steps": mix[1],
                                        "ms": mix[0]}
            else:
                out["priced_update"] = {"by": "the row switch's costliest branch (a bucket failed to price)"}
        elif rows:
            out["priced_update"] = {"by": "the row switch's costliest branch (no commit counts)"}
        if "spec_step" in ms:
            out["priced_step_ms"] = ms["spec_step"]
            if base is not None:
                out["priced_speedup"] = tau_run * base / ms["spec_step"]
        if "propose" in ms and "update" in ms:
            out["priced_draft_ms_per_token"] = (ms["propose"] + ms["update"]) / tau_run
        return out


def price_all(pricer: Pricer, methods: list, labels: list[str], batch_sizes: list[int]) -> None:
    """`--price-only`: prices target-only and every distinct drafting shape of `methods` at each
    batch size (into the pricer's cache), printing each method's priced phases and their source."""
    for batch in batch_sizes:
        for label, method in zip(labels, methods):
            shape = method_shape(method)
            if shape is None:
                print(f"batch {batch} {label}: not priced (an auto: method)", flush=True)
                continue
            ms = pricer.phases_ms(shape, batch)
            name = f"{json.dumps(shape, sort_keys=True)} batch {batch}"
            print(f"batch {batch} {label}: {json.dumps({k: round(v, 4) for k, v in ms.items()})} "
                  f"({pricer.sources[name]})", flush=True)


def summed_commit_hist(results) -> list[int] | None:
    """The rows' `stats.commit_hist` summed (steps by the most tokens their batch committed: what a
    row-switched update is priced by), or None where a row has none or their lengths differ."""
    hists = [r.stats.commit_hist for r in results]
    if not hists or any(h is None for h in hists) or len({len(h) for h in hists}) != 1:
        return None
    return [int(sum(col)) for col in zip(*hists)]
