"""Loop cost of feature collection: EAGLE-3 decoding with an adapter that never updates (collect
every batch) against plain, interleaved, static batches of 1 and the refill stream."""
import json, time, math, sys
import specblock_jax as sbj
from specblock_jax.adaptation import AdaptConfig, Adapter
target = sbj.load_target("assets/target")
drafter = sbj.load_drafter("assets/drafters/eagle3", target)
prompts = [json.loads(l)["prompt"] for l in open("assets/prompts/indomain.jsonl")][:24]
def run(collect, refill):
    ad = Adapter(drafter, AdaptConfig(cost_scale=math.inf)) if collect else None
    t = time.perf_counter()
    out = sbj.generate(target, prompts, drafter=drafter, max_new_tokens=128, batch_size=1, adapter=ad, refill=refill)
    return time.perf_counter() - t - sum(r.stats.compile_s for r in out) / 1
for refill in (False, None):
    run(False, refill); run(True, refill)  # warm
    res = {False: [], True: []}
    for _ in range(3):
        for c in (False, True):
            res[c].append(run(c, refill))
    print("refill" if refill is None else "static", {k: [round(x, 2) for x in v] for k, v in res.items()},
          "collect/plain median", round(sorted(res[True])[1] / sorted(res[False])[1], 3), flush=True)
