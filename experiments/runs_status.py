"""
The finished runs of the B sweep and the competent pilot as a table (docs/long_runs.md, between its "runs"
markers):
what each cost (core-seconds, seconds per step, the machine) and its headline numbers. A summary for
bookkeeping; the decision rules are b_sweep.py --report and competent.py --choose.

    python experiments/runs_status.py               # print the tables
    python experiments/runs_status.py --write_docs  # and put them into docs/long_runs.md
"""
import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "long_runs.md")
START, END = "<!-- runs: experiments/runs_status.py --write_docs -->", "<!-- /runs -->"


def load(name):
    path = os.path.join(ROOT, "experiments", name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def machine(r):
    m = r.get("machine") or {}
    return f"{m.get('cpu')} f{m.get('cpu_family')}{' avx512' if m.get('avx512') else ''}"


def tables():
    lines = []
    b = load("b_sweep.jsonl")
    if b:
        lines += ["b_sweep (tau 0.95 on the 800 sweep prompts; pass share d 1/2/3/4 teacher-forced on 400):", "",
                  "| run | greedy acc | tok/fwd | at window 4 | pass share d 1/2/3/4 | core-s train + eval | s/step | machine |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in b:
            tpf = r.get("sweep", {}).get("0.95", {}).get("tokens_per_forward")
            w4 = r.get("window4", {}).get("0.95", {}).get("tokens_per_forward")
            tf = r.get("teacher_forced")
            share = ""
            if tf:
                n = [sum(col) for col in zip(*tf["n"])][:4]
                p = [sum(col) for col in zip(*tf["0.95"]["pass"])][:4]
                share = " / ".join(f"{a / c:.2f}" if c else "-" for a, c in zip(p, n))
            cs = r["core_seconds"]
            lines.append(f"| {r['name']} | {r['ar']['accuracy']['all']:.3f} | {'' if tpf is None else f'{tpf:.3f}'} | "
                         f"{'' if w4 is None else f'{w4:.3f}'} | {share} | {cs['train']:.0f} + {cs['eval']:.0f} | "
                         f"{r['step_seconds'] or 0:.3f} | {machine(r)} |")
        lines.append("")
    c = load("competent_pilot.jsonl")
    if c:
        lines += ["competent pilot (greedy, all 3650 powered prompts):", "",
                  "| run | accuracy | arithmetic | steps | s/step | core-s | machine |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in c:
            acc = r["ar"]["accuracy"]
            lines.append(f"| {r['name']} | {acc['all']:.3f} | {acc.get('arithmetic', 0):.3f} | {r.get('steps') or ''} | "
                         f"{r.get('step_seconds') or 0:.3f} | {r['core_seconds']:.0f} | {machine(r)} |")
        lines.append("")
    total = sum(r["core_seconds"]["all"] for r in b) + sum(r["core_seconds"] for r in c)
    lines.append(f"{len(b)} b_sweep runs and {len(c)} pilot rows finished, {total / 3600:.2f} core-hours in all.")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write_docs", action="store_true")
    args = p.parse_args()
    text = tables()
    print(text)
    if args.write_docs:
        with open(DOC) as f:
            doc = f.read()
        head, rest = doc.split(START) if START in doc else (doc.rstrip("\n") + "\n\n", END)
        tail = rest.split(END, 1)[1]
        with open(DOC, "w") as f:
            f.write(f"{head}{START}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
