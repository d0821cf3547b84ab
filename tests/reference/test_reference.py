#!/usr/bin/python3
"""Compare the shoal engine with the independent numpy reference on tiny checkpoints.

usage: /usr/bin/python3 tests/reference/test_reference.py --shoal PATH/TO/shoal
           [--workdir DIR] [--only NAME[,NAME...]] [--timeout SECONDS] [--configs DIR]

For every tiny checkpoint written by gen_tiny.py (gen_tiny.SPECS: mixtral [sharded], qwen2_moe,
qwen3_moe, olmoe, qwen3_moe_yarn, qwen3_moe_yarn_v5, qwen3_moe_dense_layers,
olmoe_tied_clip) it runs

    SHOAL run --model DIR --tokens 17,300,3,101,257,42,7 --max-tokens 16 --greedy \
              --logits-out OUT.npy --ids-out IDS.txt

and checks
  * reference : exit 0; IDS.txt (one line, space-separated ints) equals the
                reference's greedy ids; OUT.npy is float32 [16][vocab] and at every
                step max|logit - ref| <= 1e-3 * max|ref logit| (row 0 = logits after
                the prompt, row i = after feeding generated token i-1);
  * same as   : for a checkpoint in gen_tiny.SAME_LOGITS_AS (the same weights, another
                config layout: qwen3_moe_yarn_v5 has transformers v5 rope_parameters),
                OUT.npy is byte-identical to its twin's;
  * threads   : the same run under OMP_NUM_THREADS=1 and OMP_NUM_THREADS=2 writes
                byte-identical OUT.npy (and identical ids).
  * MTP       : for a checkpoint with MTP layers (num_nextn_predict_layers:
                deepseek_v3, glm4_moe and their dtype twins), --draft-logits-out's rows
                (the MTP head's logits for the token after each generated one) are
                within the same tolerance of ref_numpy.mtp_logits over the prompt and
                the generated ids, and byte-identical through an f32 container
                (convert writes the MTP layer); --speculate mtp (draft-max 1 and 3)
                gives the ids and the logits bytes of the run without it; with a
                mis-shaped MTP tensor the model runs, auto too, and --speculate mtp
                exits 2 with one line naming the tensor.
Ends with the line "N passed, M failed"; exit status 1 if anything failed.
Checkpoints whose real config is missing (../shared/data/configs relative to the
repo root) are reported as SKIP and counted neither passed nor failed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_tiny  # noqa: E402
import ref_numpy as R  # noqa: E402

REL_TOL = 1e-3


def run_engine(shoal, model_dir, prompt, n_steps, out_dir, tag, timeout, env_extra=None,
               extra_args=()):
    npy = os.path.join(out_dir, f"{tag}.logits.npy")
    ids_txt = os.path.join(out_dir, f"{tag}.ids.txt")
    for p in (npy, ids_txt):
        if os.path.exists(p):
            os.remove(p)
    cmd = [shoal, "run", "--model", model_dir, "--tokens", ",".join(map(str, prompt)),
           "--max-tokens", str(n_steps), "--greedy", "--logits-out", npy, "--ids-out", ids_txt,
           *extra_args]
    env = dict(os.environ)
    if env_extra:
        env.update(env_extra)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s: {' '.join(cmd)}"
    except OSError as e:
        return None, f"cannot execute {shoal}: {e}"
    dt = time.time() - t0
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return None, f"exit status {p.returncode}: {' | '.join(tail)}"
    if not os.path.exists(npy) or not os.path.exists(ids_txt):
        return None, f"--logits-out/--ids-out not written ({npy}, {ids_txt})"
    return dict(npy=npy, ids_txt=ids_txt, seconds=dt), None


def read_outputs(res, vocab, n_steps):
    with open(res["ids_txt"]) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    if len(lines) != 1:
        raise ValueError(f"{res['ids_txt']}: expected one line, got {len(lines)}")
    ids = [int(x) for x in lines[0].split()]
    lg = np.load(res["npy"], allow_pickle=False)
    if lg.dtype != np.float32:
        raise ValueError(f"{res['npy']}: dtype {lg.dtype}, expected float32")
    if lg.shape != (n_steps, vocab):
        raise ValueError(f"{res['npy']}: shape {lg.shape}, expected ({n_steps}, {vocab})")
    return ids, lg


def same_as_twin(manifest, ref_logits, out_dir, name, twin, res):
    """(ok, message): name's engine logits are byte-identical to twin's (run
    just before under the tag twin), and the generator gave both the same
    weights and the reference the same logits."""
    tinfo = manifest["models"].get(twin, {})
    if "seed" not in tinfo:
        return False, f"twin {twin} was not generated ({tinfo})"
    if tinfo["seed"] != manifest["models"][name]["seed"]:
        return False, (f"the generator chose seed {manifest['models'][name]['seed']} vs {tinfo['seed']} "
                       f"for {twin}: the reference reads the two layouts differently")
    if not np.array_equal(ref_logits[name], ref_logits[twin]):
        return False, "the reference gives different logits for the two layouts"
    twin_npy = os.path.join(out_dir, f"{twin}.logits.npy")
    if not res or not os.path.exists(twin_npy):
        return False, "engine output missing for one of the two"
    a, b = open(res["npy"], "rb").read(), open(twin_npy, "rb").read()
    if a != b:
        try:
            d = float(np.abs(np.load(res["npy"]).astype(np.float64) - np.load(twin_npy)).max())
        except ValueError as e:
            d = str(e)
        return False, f"engine logits bytes differ (max |diff| {d})"
    return True, f"byte-identical engine logits ({len(a)} bytes), same weights and reference"


def check_mtp(shoal, d, prompt, n_steps, out_dir, name, timeout, res):
    """(ok, message) for a checkpoint with MTP layers: its draft logits
    against the reference, and --speculate mtp against the plain run (res)."""
    npy = os.path.join(out_dir, f"{name}.draft.npy")
    r, err = run_engine(shoal, d, prompt, n_steps, out_dir, f"{name}.mtp", timeout,
                        extra_args=["--draft-logits-out", npy])
    if not r:
        return False, err
    ids = [int(x) for x in open(r["ids_txt"]).read().split()]
    got = np.load(npy, allow_pickle=False)
    seq = list(prompt) + ids
    want = R.mtp_logits(R.load_model(d), seq)[len(prompt) - 1:]
    if got.dtype != np.float32 or got.shape[0] < n_steps - 1 or got.shape[1] != want.shape[1]:
        return False, f"draft logits {got.dtype} {got.shape}: expected float32 [>= {n_steps - 1}][{want.shape[1]}]"
    want = want[:got.shape[0]]
    rel = np.abs(got.astype(np.float64) - want).max(axis=1) / np.abs(want).max(axis=1)
    if rel.max() > REL_TOL:
        return False, f"MTP logits: max rel err {rel.max():.2e} > {REL_TOL:g} at row {int(np.argmax(rel))}"
    # the MTP layer through a container (convert writes it as dense tensors): at
    # f32 (FP8 models: fp8) the same draft logits bytes, the store streaming the
    # trunk's experts
    ct = os.path.join(out_dir, f"{name}.ct")
    shutil.rmtree(ct, ignore_errors=True)
    dt = "fp8" if name.endswith("_fp8") else "f32"   # FP8 stays FP8 (its own kernels)
    cv = subprocess.run([shoal, "convert", d, ct, "--experts", dt, "--dense", dt],
                        capture_output=True, text=True, timeout=timeout)
    if cv.returncode:
        return False, f"convert: exit {cv.returncode}: {cv.stderr.strip()[-300:]}"
    cnpy = os.path.join(out_dir, f"{name}.ct.draft.npy")
    r2, err = run_engine(shoal, ct, prompt, n_steps, out_dir, f"{name}.ct", timeout,
                         extra_args=["--draft-logits-out", cnpy])
    if not r2:
        return False, "container: " + err
    if open(cnpy, "rb").read() != open(npy, "rb").read():
        return False, f"the {dt} container's MTP logits bytes differ from the directory's"
    plain = open(res["npy"], "rb").read()
    for k in ("1", "3"):
        s, err = run_engine(shoal, d, prompt, n_steps, out_dir, f"{name}.spec{k}", timeout,
                            extra_args=["--speculate", "mtp", "--draft-max", k])
        if not s:
            return False, err
        if open(s["npy"], "rb").read() != plain or open(s["ids_txt"]).read() != open(res["ids_txt"]).read():
            return False, f"--speculate mtp --draft-max {k}: ids or logits bytes differ from the plain run"
    # an MTP tensor of the wrong shape: the model runs, --speculate mtp is refused in
    # one line naming the tensor (exit 2), auto runs without the MTP layer
    if not name.endswith(("_fp8", "_bf16")):
        bad = os.path.join(out_dir, f"{name}.badmtp")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(d, bad, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
        W = R.load_tensors(d)
        L = R.load_config(d)["num_hidden_layers"]
        k = f"model.layers.{L}.eh_proj.weight"
        W[k] = np.ascontiguousarray(W[k][:, :-1])
        gen_tiny.write_checkpoint(bad, sorted(W.items()), 1)
        base = [shoal, "run", "--model", bad, "--tokens", ",".join(map(str, prompt)),
                "--max-tokens", "4", "--greedy"]
        p0 = subprocess.run(base, capture_output=True, text=True, timeout=timeout)
        p1 = subprocess.run(base + ["--speculate", "mtp"], capture_output=True, text=True,
                            timeout=timeout)
        p2 = subprocess.run(base + ["--speculate", "auto"], capture_output=True, text=True,
                            timeout=timeout)
        lines = p1.stderr.strip().splitlines()
        if not (p0.returncode == 0 and p2.returncode == 0 and p1.returncode == 2 and
                len(lines) == 1 and "no usable MTP layer" in lines[0] and k in lines[0]):
            return False, (f"a mis-shaped {k}: run {p0.returncode}, auto {p2.returncode}, mtp "
                           f"{p1.returncode}: {p1.stderr.strip()[-300:]}")
    return True, (f"{got.shape[0]} rows of MTP logits, max rel err {rel.max():.2e}, the same bytes "
                  f"from a container; --speculate mtp (draft-max 1, 3): the same ids and "
                  f"logits bytes")


def main():
    ap = argparse.ArgumentParser(description="shoal vs numpy reference on tiny MoE checkpoints")
    ap.add_argument("--shoal", required=True, help="path to the shoal executable")
    ap.add_argument("--workdir", help="keep checkpoints and outputs here (default: temp dir, removed)")
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ",".join(gen_tiny.SPECS))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per engine run")
    ap.add_argument("--configs", default=gen_tiny.DEFAULT_CONFIGS)
    a = ap.parse_args()

    shoal = os.path.abspath(a.shoal) if os.path.sep in a.shoal else (shutil.which(a.shoal) or a.shoal)
    only = [x for x in a.only.split(",") if x]
    for x in only:
        if x not in gen_tiny.SPECS:
            ap.error(f"unknown checkpoint {x!r}")
    names = only or list(gen_tiny.SPECS)
    # a checkpoint compared with its twin needs the twin run first
    for n in list(names):
        twin = gen_tiny.SAME_LOGITS_AS.get(n)
        if twin and twin not in names:
            names.insert(names.index(n), twin)

    passed = failed = skipped = 0

    if not os.path.isdir(a.configs):
        for n in names:
            print(f"SKIP: {n}: ../shared/data/configs not found ({os.path.normpath(a.configs)})")
        skipped = len(names)
        print(f"({skipped} skipped)")
        print(f"{passed} passed, {failed} failed")
        return 0

    work = a.workdir or tempfile.mkdtemp(prefix="shoal-ref-")
    os.makedirs(work, exist_ok=True)
    ckpt_dir = os.path.join(work, "ckpt")
    out_dir = os.path.join(work, "out")
    os.makedirs(out_dir, exist_ok=True)
    try:
        t0 = time.time()
        manifest, ref_logits = gen_tiny.generate(ckpt_dir, a.configs, names, verbose=False)
        print(f"generated {len(ref_logits)} tiny checkpoints + references in {time.time() - t0:.1f}s "
              f"under {ckpt_dir}")
        prompt, n_steps = manifest["prompt"], manifest["n_steps"]
        for name in names:
            info = manifest["models"][name]
            if "skipped" in info:
                print(f"SKIP: {name}: {info['skipped']} (../shared/data/configs not found)")
                skipped += 2
                continue
            if "failed" in info:
                print(f"FAIL {name}: generator could not build a usable checkpoint ({info['failed']})")
                failed += 2
                continue
            d = os.path.join(ckpt_dir, name)
            ref_ids, ref = info["ref_ids"], ref_logits[name]
            vocab = ref.shape[1]

            # --- 1. against the reference
            res, err = run_engine(shoal, d, prompt, n_steps, out_dir, name, a.timeout)
            ok, msg = False, err
            if res:
                try:
                    ids, lg = read_outputs(res, vocab, n_steps)
                    scale = np.abs(ref).max(axis=1)
                    rel = (np.abs(lg.astype(np.float64) - ref).max(axis=1) / scale)
                    worst = int(np.argmax(rel))
                    if ids != ref_ids:
                        k = next((i for i, (x, y) in enumerate(zip(ids, ref_ids)) if x != y),
                                 min(len(ids), len(ref_ids)))
                        msg = (f"generated ids differ at step {k}: engine {ids} vs reference {ref_ids}; "
                               f"max rel err {rel.max():.2e} (step {worst})")
                    elif not np.all(np.isfinite(lg)):
                        msg = "non-finite logits"
                    elif rel.max() > REL_TOL:
                        msg = (f"max rel err {rel.max():.2e} > {REL_TOL:g} at step {worst} "
                               f"(per-step: {' '.join(f'{x:.1e}' for x in rel)})")
                    else:
                        ok = True
                        msg = (f"ids match ({len(ids)} tokens), max rel err {rel.max():.2e} "
                               f"(step {worst}), {res['seconds']:.2f}s")
                except (ValueError, OSError) as e:
                    msg = str(e)
            print(f"{'PASS' if ok else 'FAIL'} {name} [{info['model_type']}] reference: {msg}")
            passed += ok
            failed += not ok

            # --- 1b. the same model in another config layout: the same bytes
            twin = gen_tiny.SAME_LOGITS_AS.get(name)
            if twin:
                ok, msg = same_as_twin(manifest, ref_logits, out_dir, name, twin, res)
                print(f"{'PASS' if ok else 'FAIL'} {name} [{info['model_type']}] same as {twin}: {msg}")
                passed += ok
                failed += not ok

            # --- 2. thread-count invariance
            outs, errs = [], []
            for nt in (1, 2):
                r, e = run_engine(shoal, d, prompt, n_steps, out_dir, f"{name}.omp{nt}", a.timeout,
                                  {"OMP_NUM_THREADS": str(nt)})
                outs.append(r)
                errs.append(e)
            if not all(outs):
                ok, msg = False, "; ".join(e for e in errs if e)
            else:
                b1, b2 = (open(r["npy"], "rb").read() for r in outs)
                i1, i2 = (open(r["ids_txt"]).read().split() for r in outs)
                ok = b1 == b2 and i1 == i2
                if ok:
                    msg = f"OMP_NUM_THREADS=1 and =2 give byte-identical logits ({len(b1)} bytes)"
                elif i1 != i2:
                    msg = f"ids differ: 1 thread {i1} vs 2 threads {i2}"
                else:
                    try:
                        l1, l2 = (np.load(r["npy"]) for r in outs)
                        diff = float(np.abs(l1.astype(np.float64) - l2).max()) if l1.shape == l2.shape else None
                        msg = f"logits bytes differ between 1 and 2 threads (max |diff| {diff})"
                    except ValueError as e:
                        msg = f"logits bytes differ between 1 and 2 threads ({e})"
            print(f"{'PASS' if ok else 'FAIL'} {name} [{info['model_type']}] threads: {msg}")
            passed += ok
            failed += not ok

            # --- 3. the MTP layers: draft logits vs the reference; speculation keeps the bits
            if R.load_config(d).get("num_nextn_predict_layers") and res:
                ok, msg = check_mtp(shoal, d, prompt, n_steps, out_dir, name, a.timeout, res)
                print(f"{'PASS' if ok else 'FAIL'} {name} [{info['model_type']}] MTP: {msg}")
                passed += ok
                failed += not ok
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if skipped:
        print(f"({skipped} skipped)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
