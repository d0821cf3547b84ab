#!/usr/bin/python3
"""Speculative decoding on and off (issue 34): `shoal run --speculate off`,
`lookup`, `mtp` (a model with MTP layers) and `auto` alternating on the same
prompts, decode tok/s of each (median over rounds) and the ratio to off in
the same round, the drafts made and kept, what a verify step cost (its mean
rows, its time over a one-row step's), and a check that every mode
generated the same token ids.

usage: /usr/bin/python3 bench/spec_bench.py --shoal build/coordinator/shoal
           [--model M] [--tasks repeat,quote,sampled] [--rounds 5]
           [--modes off,lookup,mtp,auto] [--max-tokens 200] [--threads 2]
           [--draft-max 8] [--json OUT] [-- EXTRA SHOAL RUN FLAGS]

--modes defaults to off,lookup,auto, with mtp when the model's config.json
names MTP layers (num_nextn_predict_layers). For a container or GGUF whose
experts the store reads from disk, the MB it read per generated token too.

Tasks (the prompts are text; any model with a tokenizer takes them):
  repeat   greedy from a speaker's name: the bundled model's greedy text
           repeats itself, which prompt lookup drafts from
  quote    greedy after a held-out passage and its first line again (a
           document being quoted or edited: the answer copies the prompt
           when the model does)
  sampled  the default sampler (temperature 0.8, top-k 40, top-p 0.95)
Flags after `--` go to every `shoal run` (e.g. `--expert-cache 64M
--direct on` for experts on disk). Prints a table; --json writes it.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
CORPUS = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "corpus",
                                       "tinyshakespeare.txt"))
DECODE = re.compile(r"decode (\d+) tokens, ([0-9.]+|n/a) tok/s")
SPEC = re.compile(r"speculate \w+: (\d+) drafted, (\d+) kept")
STEP = re.compile(r"of ([0-9.]+) rows at ([0-9.]+)x a 1-row step")
READ = re.compile(r"experts: io \S+, queue depth \d+: ([0-9.]+) MB read")


def quote_prompt():
    """A held-out passage (the corpus's last tenth, as heldout.json cuts
    it) and its first line again; a fixed passage when ../shared is absent."""
    text = None
    if os.path.exists(CORPUS):
        with open(CORPUS, encoding="utf-8") as f:
            data = f.read()
        start = data.index("\n", int(0.9 * len(data))) + 1
        text = data[start + 2000:start + 2400]
        text = text[text.index("\n\n") + 2:]
        text = text[:text.rindex("\n")]
    if not text:
        text = ("MARCIUS:\nWill the time serve to tell? I do not think.\n"
                "Where is the enemy? are you lords o' the field?\n"
                "If not, why cease you till you are so?\n")
    return text + "\n\n" + text.split("\n")[0] + "\n"


def tasks(names):
    out = []
    for n in names:
        if n == "repeat":
            for p in ("ROMEO:", "JULIET:", "KING RICHARD II:"):
                out.append(("repeat", p, ["--greedy"]))
        elif n == "quote":
            out.append(("quote", quote_prompt(), ["--greedy"]))
        elif n == "sampled":
            out.append(("sampled", "ROMEO:", ["--seed", "11"]))
        else:
            sys.exit("spec_bench: unknown task '%s' (expected repeat, quote, sampled)" % n)
    return out


def has_mtp(model):
    """The model directory's config.json names MTP layers (num_nextn_predict_layers)."""
    try:
        with open(os.path.join(model, "config.json")) as f:
            return bool(json.load(f).get("num_nextn_predict_layers"))
    except (OSError, ValueError):
        return False


def run_once(a, prompt, args, mode, tmp, extra):
    ids = os.path.join(tmp, "ids." + mode)
    cmd = [a.shoal, "run", "--model", a.model, "--no-echo", "--prompt", prompt,
           "--max-tokens", str(a.max_tokens), "--threads", str(a.threads),
           "--speculate", mode, "--draft-max", str(a.draft_max), "--ids-out", ids,
           "--stats"] + args + extra
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit("spec_bench: %s failed: %s" % (" ".join(cmd[:6]), r.stderr.strip()[-500:]))
    m = DECODE.search(r.stderr)
    s = SPEC.search(r.stderr)
    st = STEP.search(r.stderr)
    rd = READ.search(r.stderr)
    with open(ids) as f:
        got = f.read().split()
    return {"tok_s": float(m.group(2)) if m and m.group(2) != "n/a" else 0.0,
            "mb_read": float(rd.group(1)) if rd else None,
            "drafted": int(s.group(1)) if s else 0, "kept": int(s.group(2)) if s else 0,
            "verify_rows": float(st.group(1)) if st else None,
            "verify_cost": float(st.group(2)) if st else None, "ids": got}


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--tasks", default="repeat,quote,sampled")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--modes", help="comma-separated, 'off' first (default: off,lookup,"
                    "[mtp,]auto)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.modes:
        modes = tuple(a.modes.split(","))
    else:
        modes = ("off", "lookup", "mtp", "auto") if has_mtp(a.model) else ("off", "lookup", "auto")
    if modes[0] != "off":
        modes = ("off",) + tuple(m for m in modes if m != "off")
    spec = modes[1:]
    rows = []
    with tempfile.TemporaryDirectory(prefix="spec-bench-") as tmp:
        for name, prompt, args in tasks(a.tasks.split(",")):
            per = {m: [] for m in modes}
            same = True
            for rnd in range(a.rounds):
                order = modes if rnd % 2 == 0 else modes[::-1]   # alternate who goes first
                res = {m: run_once(a, prompt, args, m, tmp, extra) for m in order}
                same &= all(res[m]["ids"] == res["off"]["ids"] for m in modes)
                for m in modes:
                    per[m].append(res[m])
            med = {m: statistics.median(r["tok_s"] for r in per[m]) for m in modes}
            ratio = {m: statistics.median(r["tok_s"] / o["tok_s"] for r, o in
                                          zip(per[m], per["off"]) if o["tok_s"] > 0)
                     for m in spec}
            mb = {m: statistics.median(r["mb_read"] / max(1, len(r["ids"])) for r in per[m])
                  if per[m][0]["mb_read"] is not None else None for m in modes}
            row = {"task": name, "prompt": prompt[:40], "tok_s": med, "ratio_vs_off": ratio,
                   "disk_mb_per_token": mb,
                   "drafted": {m: per[m][0]["drafted"] for m in spec},
                   "kept": {m: per[m][0]["kept"] for m in spec},
                   "tokens": len(per["off"][0]["ids"]), "same_ids": same,
                   "verify_rows": {m: per[m][0]["verify_rows"] for m in spec},
                   "verify_cost": {m: statistics.median(
                       [r["verify_cost"] for r in per[m] if r["verify_cost"]] or [0])
                       for m in spec}}
            rows.append(row)
            cols = []
            for m in spec:
                vr = row["verify_rows"][m]
                cols.append("%s %7.1f (%.2fx, kept %d/%d, verify %s)" % (
                    m, med[m], ratio[m], row["kept"][m], row["drafted"][m],
                    "%.1f rows at %.2fx" % (vr, row["verify_cost"][m]) if vr else "none"))
            disk = "" if mb["off"] is None else " | disk MB/token " + " ".join(
                "%s %.2f" % (m, mb[m]) for m in modes)
            print("%-8s %-18r off %7.1f | %s | ids %s%s" %
                  (name, prompt[:16], med["off"], " | ".join(cols),
                   "identical" if same else "DIFFER", disk), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "rounds": a.rounds,
                       "max_tokens": a.max_tokens, "draft_max": a.draft_max,
                       "extra": extra, "rows": rows}, f, indent=1)
    return 0 if all(r["same_ids"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
