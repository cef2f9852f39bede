"""What the `auto` rows of a bench run spent: per auto row, the chunks each option served, and how
its speed splits into the speed of the option it served most (its chunks' tokens over their
seconds) and the cost of every other chunk (exploration and re-checks) measured against that speed.

    python scripts/auto_events_summary.py BENCH_OUT_DIR [more bench output folders]

speedup = auto's tokens/s over target-only's row; served-most / ar row = the most-served option's
own chunk speed over target-only's row (run-to-run drift and chunking, not auto's choices);
other-chunk cost = the seconds the other chunks took beyond what the most-served option would have
taken for their tokens, as a share of auto's decode time.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def summarize(run: Path) -> list[str]:
    rows = json.loads((run / "results.json").read_text())["results"]
    ar = {(r["temperature"], r["batch_size"]): r for r in rows if r["method"] == "ar"}
    lines = []
    for r in rows:
        events = r.get("auto_events")
        if not events:
            continue
        served = Counter(str(e["option"]) for e in events)
        main, _ = served.most_common(1)[0]
        mine = [e for e in events if str(e["option"]) == main]
        main_speed = sum(e["tokens"] for e in mine) / sum(e["decode_s"] for e in mine)
        other = [e for e in events if str(e["option"]) != main]
        extra = sum(e["decode_s"] - e["tokens"] / main_speed for e in other)
        total = sum(e["decode_s"] for e in events)
        base = ar[(r["temperature"], r["batch_size"])]["tokens_per_s"]
        lines.append(f"| {run.name} | {r['temperature']:g} | {r['batch_size']} | {r['method']} | {r['speedup']:.3f}x | "
                     f"{', '.join(f'{o}: {n}' for o, n in served.most_common())} | {main_speed / base:.3f} | "
                     f"{100 * extra / total:.1f}% |")
    return lines


def main() -> None:
    print("| run | T | batch | method | speedup | chunks served | served-most / ar row | other-chunk cost |")
    print("|---|---|---|---|---|---|---|---|")
    for arg in sys.argv[1:]:
        print("\n".join(summarize(Path(arg))))


if __name__ == "__main__":
    main()
