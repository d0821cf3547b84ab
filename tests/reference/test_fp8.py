#!/usr/bin/python3
"""FP8 checkpoints through `shoal convert`: the container keeps FP8 by default,
or converts into int8 / int4a8 / bf16 when asked.

usage: /usr/bin/python3 tests/reference/test_fp8.py --shoal PATH/TO/shoal
           [--workdir DIR] [--timeout SECONDS] [--configs DIR]

On gen_tiny's qwen3_moe_fp8 (F8_E4M3 weights with 128 x 128 block scales,
partial blocks in both dimensions):
  * the Hugging Face directory matches the numpy reference (which dequantizes
    the codes itself) within test_reference's tolerance;
  * `convert` with no dtype flags writes FP8 experts (group 128) and FP8 dense
    tensors, keeps the F32 ones F32, and its logits are byte-identical to the
    directory's (the same codes, scales and kernels);
  * `--experts f32|int8|int4a8|bf16` dequantize block by block and quantize:
    the first step's logits (after the prompt, independent of generated ids)
    stay within the stated relative bounds of the reference (f32: the
    reference's own tolerance, and the same ids);
  * `--experts fp8` of a non-FP8 checkpoint is a one-line error.
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
sys.path.insert(0, HERE)
import gen_tiny  # noqa: E402
import test_reference as T  # noqa: E402

NAME = "qwen3_moe_fp8"
# first-step relative error bounds (max |diff| / max |ref|) against the FP8
# reference, per experts dtype (dense stays FP8/F32). f32 is the exact
# dequantization (code * scale rounded once to f32): the reference's own
# tolerance. The others add their own rounding; measured on this checkpoint
# 8.2e-3 (int8 g64), 1.1e-1 (int4a8 g64), 1.9e-3 (bf16), bounds with headroom
# (a random tiny model amplifies weight noise; docs/QUANTIZATION.md has the
# quality figures on a trained one)
STEP0_BOUND = {"f32": T.REL_TOL, "int8": 2e-2, "int4a8": 2.5e-1, "bf16": 1e-2}


def convert(shoal, src, dst, args, timeout):
    shutil.rmtree(dst, ignore_errors=True)
    p = subprocess.run([shoal, "convert", src, dst] + args, capture_output=True, text=True,
                       timeout=timeout)
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--workdir")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--configs", default=gen_tiny.DEFAULT_CONFIGS)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    result = H.Results()

    def report(ok, what, msg):
        result(what, ok, msg)

    work = a.workdir or tempfile.mkdtemp(prefix="shoal-fp8-")
    os.makedirs(work, exist_ok=True)
    try:
        man, refs = gen_tiny.generate(os.path.join(work, "ckpt"), a.configs, [NAME, "qwen3_moe"],
                                      verbose=False)
        info = man["models"][NAME]
        if "skipped" in info:
            print(f"SKIP: {NAME}: {info['skipped']}")
            return result.summary()
        src = os.path.join(work, "ckpt", NAME)
        out = os.path.join(work, "out")
        os.makedirs(out, exist_ok=True)
        prompt, n_steps, ref = man["prompt"], man["n_steps"], refs[NAME]
        vocab = ref.shape[1]

        def run(model, tag):
            res, err = T.run_engine(shoal, model, prompt, n_steps, out, tag, a.timeout)
            if not res:
                return None, None, err
            ids, lg = T.read_outputs(res, vocab, n_steps)
            return ids, lg, res

        ids0, lg0, r0 = run(src, "hf")
        if ids0 is None:
            report(False, "FP8 directory runs", r0)
        else:
            rel = float((np.abs(lg0 - ref).max(1) / np.abs(ref).max(1)).max())
            report(ids0 == info["ref_ids"] and rel <= T.REL_TOL, "FP8 directory vs reference",
                   f"ids {'match' if ids0 == info['ref_ids'] else 'differ'}, max rel err {rel:.2e}")

        # default: FP8 kept
        dst = os.path.join(work, "c_default")
        p = convert(shoal, src, dst, [], a.timeout)
        if p.returncode:
            report(False, "convert (default) keeps FP8", p.stderr.strip())
        else:
            m = json.load(open(os.path.join(dst, "shoal.json")))
            ex = m["experts"]
            dts = {t["dtype"] for t in m["dense"]["tensors"]}
            fp8_groups = {t.get("group") for t in m["dense"]["tensors"] if t["dtype"] == "FP8"}
            ok = ex["dtype"] == "FP8" and ex["group"] == 128 and dts == {"FP8", "F32"} \
                and fp8_groups == {128}
            report(ok, "convert (default) keeps FP8",
                   f"experts {ex['dtype']} group {ex['group']}, dense dtypes {sorted(dts)}")
            ids1, lg1, r1 = run(dst, "default")
            if ids1 is None or lg0 is None:
                report(False, "FP8 container logits == FP8 directory logits", r1)
            else:
                same = open(r1["npy"], "rb").read() == open(r0["npy"], "rb").read()
                report(same and ids1 == ids0, "FP8 container logits == FP8 directory logits",
                       "byte-identical" if same else
                       f"differ (max |diff| {float(np.abs(lg1 - lg0).max()):.3g})")

        for dt, bound in STEP0_BOUND.items():
            dst = os.path.join(work, f"c_{dt}")
            p = convert(shoal, src, dst, ["--experts", dt], a.timeout)
            if p.returncode:
                report(False, f"convert --experts {dt}", p.stderr.strip())
                continue
            ex = json.load(open(os.path.join(dst, "shoal.json")))["experts"]["dtype"]
            ids, lg, r = run(dst, dt)
            if ids is None:
                report(False, f"convert --experts {dt} runs", r)
                continue
            rel = float(np.abs(lg[0] - ref[0]).max() / np.abs(ref[0]).max())
            same_ids = dt != "f32" or ids == info["ref_ids"]
            report(ex == dt.upper() and np.all(np.isfinite(lg)) and rel <= bound and same_ids,
                   f"convert --experts {dt}",
                   f"experts {ex}, step-0 rel err {rel:.2e} (bound {bound:g})")

        # FP8 is kept, never made
        if "skipped" not in man["models"].get("qwen3_moe", {"skipped": 1}):
            plain = os.path.join(work, "ckpt", "qwen3_moe")
            dst = os.path.join(work, "c_bad")
            p = convert(shoal, plain, dst, ["--experts", "fp8"], a.timeout)
            lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
            ok = (p.returncode == 1 and len(lines) == 1 and "F32" in lines[0]
                  and "experts.0.gate_proj.weight" in lines[0]
                  and not os.path.exists(os.path.join(dst, "shoal.json")))
            report(ok, "convert --experts fp8 of an F32 checkpoint refused",
                   f"rc={p.returncode}: {' | '.join(lines)}")
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
