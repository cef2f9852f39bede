"""Pools benchmarks/dflash_tree/run.sh's runs (OUT_DIR/<set>_T<t>/results.json of specblock-bench)
into a markdown table of pooled tau (all committed tokens after the prefill's / all decoding target
forwards, the bonus included) per prompt set, temperature and method, with each tree's ratio to
the chain's, and writes the compact rows to benchmarks/dflash_tree/results.json.

    python benchmarks/dflash_tree/table.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SETS = ("heldout", "humaneval", "shift_sympy")
DRAFTER = "assets/drafters/dflash"


def rows(out: Path) -> list[dict]:
    found = []
    for name in SETS:
        for t in (0, 1):
            file = out / f"{name}_T{t}" / "results.json"
            if not file.exists():
                continue
            for r in json.loads(file.read_text())["results"]:
                if r["method"] == "ar":
                    continue
                method = r["method"].removeprefix(DRAFTER).removeprefix(":sizing=fixed") or "chain"
                found.append({"set": name, "T": t, "method": method,
                              "prompts": r["prompts"], "tau": round(r["tau_run"], 4),
                              "tau_median": round(r["tau_median"], 4), "same_as_ar": r["same_as_ar"]})
    return found


def table(found: list[dict]) -> str:
    lines = ["| set | T | method | pooled tau | x chain | tau median | same as ar |", "|---|---|---|---|---|---|---|"]
    for r in found:
        chain = next(c["tau"] for c in found if (c["set"], c["T"], c["method"]) == (r["set"], r["T"], "chain"))
        same = f"{r['same_as_ar']:.2f}" if r["T"] == 0 else "-"
        lines.append(f"| {r['set']} | {r['T']} | {r['method']} | {r['tau']:.3f} | {r['tau'] / chain:.2f}x | "
                     f"{r['tau_median']:.2f} | {same} |")
    return "\n".join(lines)


def main(out: str) -> None:
    found = rows(Path(out))
    (Path(__file__).parent / "results.json").write_text(json.dumps(found, indent=1) + "\n")
    print(table(found))


if __name__ == "__main__":
    main(sys.argv[1])
