#!/usr/bin/python3
"""The KV cache dtype on the command line and in the container (issue 13).

usage: /usr/bin/python3 tests/cli/test_kv.py --shoal build-test/coordinator/shoal

Cases, on the bundled model (models/shakespeare-moe):
  flag:      `run --kv f16` and `--kv bf16` give logits that differ from f32 and
             from each other, and are the same bytes at 1 and 2 threads;
             `--kv f32` is the default's bytes
  bad flag:  `run --kv f8` (and `--kv` with no value) exit 2 with one line naming
             the flag and what it expects
  convert:   `convert --kv f16` writes "kv": "f16" in shoal.json; a run on it
             without --kv gives `--kv f16`'s logits, `--kv f32` overrides it; a
             default conversion writes "kv": "f32"; `convert --kv f8` exits 2
  manifest:  a container whose shoal.json lacks "kv" (written before it) runs as
             f32; one with "kv": "f8" or "kv": 16 is refused with one line naming
             the field (exit 1)
  memory:    run -v reports the KV bytes of the chosen dtype (f16: half of f32);
             `plan --kv f16 --json` budgets half of f32's KV bytes, `--kv f8` exits 2
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import functools
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as H  # noqa: E402
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
TOKENS = "5,17,300,3,101,257,42,7,99,12"



result = H.Results()


# output captured, 300 s, OMP_WAIT_POLICY passive unless the caller's says
run = functools.partial(H.run, env_default={"OMP_WAIT_POLICY": "passive"})


def logits(shoal, model, tmp, tag, *extra, threads=None):
    out = os.path.join(tmp, tag + ".npy")
    r = run([shoal, "run", "--model", model, "--tokens", TOKENS, "--greedy", "--ignore-eos",
             "--max-tokens", "8", "--logits-out", out] + list(extra),
            env={"OMP_NUM_THREADS": str(threads)} if threads else None)
    if r.returncode != 0:
        return None, r.stderr.strip()
    with open(out, "rb") as f:
        return f.read(), ""


def one_line_error(r, *needles):
    lines = r.stderr.strip().splitlines()
    return (r.returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in needles),
            "exit %d, stderr %r" % (r.returncode, r.stderr))


def test_flag(shoal, tmp):
    got = {}
    for kv in ("f32", "f16", "bf16"):
        got[kv], err = logits(shoal, MODEL, tmp, "hf-" + kv, "--kv", kv)
        result("run --kv %s" % kv, got[kv] is not None, err)
    default, err = logits(shoal, MODEL, tmp, "hf-default")
    result("no --kv = --kv f32 (bytes)", default is not None and default == got["f32"], err)
    result("--kv f16 and bf16 change the logits",
           None not in got.values() and got["f16"] != got["f32"] and got["bf16"] != got["f32"]
           and got["f16"] != got["bf16"])
    for kv in ("f16", "bf16"):
        one, e1 = logits(shoal, MODEL, tmp, "t1-" + kv, "--kv", kv, threads=1)
        two, e2 = logits(shoal, MODEL, tmp, "t2-" + kv, "--kv", kv, threads=2)
        result("--kv %s: same bytes at 1 and 2 threads" % kv,
               one is not None and one == two == got[kv], e1 or e2)
    return got


def test_bad_flag(shoal):
    r = run([shoal, "run", "--model", MODEL, "--tokens", "1,2", "--kv", "f8"])
    ok, why = one_line_error(r, "--kv", "f32|f16|bf16", "'f8'")
    result("run --kv f8: one line, exit 2", ok, why)
    r = run([shoal, "run", "--model", MODEL, "--tokens", "1,2", "--kv"])
    ok, why = one_line_error(r, "--kv", "needs a value")
    result("run --kv without a value: one line, exit 2", ok, why)
    r = run([shoal, "perplexity", "--model", MODEL, "--file", "-", "--kv", "F16"])
    ok, why = one_line_error(r, "--kv", "'F16'")
    result("perplexity --kv F16: one line, exit 2", ok, why)


def test_plan(shoal):
    got = {}
    for kv in ("f32", "f16", "bf16"):
        r = run([shoal, "plan", MODEL, "--kv", kv, "--ctx", "200", "--json"])
        got[kv] = json.loads(r.stdout) if r.returncode == 0 else {}
    ok = (got["f32"].get("kv_bytes_per_token", 0) > 0 and
          got["f16"].get("kv_bytes_per_token") * 2 == got["f32"]["kv_bytes_per_token"] and
          got["bf16"].get("kv_budget_bytes") * 2 == got["f32"].get("kv_budget_bytes") and
          got["f16"].get("kv") == "f16")
    result("plan --kv f16/bf16 budgets half of f32's KV bytes", ok,
           str({k: (v.get("kv"), v.get("kv_bytes_per_token")) for k, v in got.items()}))
    # without --ctx, the cache run would make: max_position_embeddings (256
    # for the bundled model) when below 4096
    r = run([shoal, "plan", MODEL, "--json"])
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    result("plan without --ctx budgets the model's 256 positions, as run's cache",
           j.get("ctx") == 256 and j.get("kv_budget_bytes") == 256 * j.get("kv_bytes_per_token", -1),
           str({k: j.get(k) for k in ("ctx", "kv_budget_bytes", "kv_bytes_per_token")}))
    r = run([shoal, "plan", MODEL, "--kv", "f8"])
    ok, why = one_line_error(r, "--kv", "'f8'")
    result("plan --kv f8: one line, exit 2", ok, why)


def manifest(ct):
    with open(os.path.join(ct, "shoal.json"), encoding="utf-8") as f:
        return json.load(f)


def write_manifest(ct, m):
    with open(os.path.join(ct, "shoal.json"), "w", encoding="utf-8") as f:
        json.dump(m, f, indent=1)


def test_convert(shoal, tmp, got):
    ct16 = os.path.join(tmp, "ct-f16")
    r = run([shoal, "convert", MODEL, ct16, "--kv", "f16"])
    result("convert --kv f16", r.returncode == 0, r.stderr.strip())
    if r.returncode != 0:
        return
    result("convert --kv f16 records \"kv\": \"f16\"", manifest(ct16).get("kv") == "f16",
           str(manifest(ct16).get("kv")))
    dflt, err = logits(shoal, ct16, tmp, "ct16-default")
    ref16, err16 = logits(shoal, ct16, tmp, "ct16-f16", "--kv", "f16")
    over, err32 = logits(shoal, ct16, tmp, "ct16-f32", "--kv", "f32")
    result("the container's kv f16 is used without --kv", dflt is not None and dflt == ref16
           and dflt != over, err or err16)
    # the container's weights are bf16 like the checkpoint's, so the logits match
    result("--kv overrides the container (f32 on an f16 container = f32 on the checkpoint)",
           over is not None and over == got["f32"] and ref16 == got["f16"], err32)
    r = run([shoal, "run", "-v", "--model", ct16, "--tokens", "1,2", "--max-tokens", "1"])
    result("run -v names the container's KV dtype and its bytes",
           r.returncode == 0 and "KV f16 0.5 MiB (the container's)" in r.stderr, r.stderr)
    r = run([shoal, "run", "-v", "--model", ct16, "--tokens", "1,2", "--max-tokens", "1",
             "--kv", "f32"])
    result("run -v --kv f32: the f32 bytes", r.returncode == 0 and "KV f32 1.0 MiB," in r.stderr,
           r.stderr)

    # plan on a container: the dtypes it holds, so its bytes are the files'
    ct4 = os.path.join(tmp, "ct-int4")
    r = run([shoal, "convert", MODEL, ct4, "--experts", "int4a8", "--dense", "int8",
             "--group", "32", "--kv", "bf16"])
    if r.returncode == 0:
        r = run([shoal, "plan", ct4, "--json"])
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        m = manifest(ct4)
        result("plan on an int4a8/int8 container plans its dtypes, group and KV dtype",
               j.get("experts_dtype") == "INT4A8" and j.get("dense_dtype") == "INT8" and
               j.get("group") == 32 and j.get("kv") == "bf16" and
               j.get("expert_bytes") == m["experts"]["blob_bytes"],
               "%r vs blob %r" % ({k: j.get(k) for k in ("experts_dtype", "dense_dtype",
                                                         "group", "kv", "expert_bytes")},
                                  m["experts"].get("blob_bytes")))
    else:
        result("convert --experts int4a8 --dense int8", False, r.stderr.strip())

    ct32 = os.path.join(tmp, "ct-f32")
    r = run([shoal, "convert", MODEL, ct32])
    result("a default conversion records \"kv\": \"f32\"",
           r.returncode == 0 and manifest(ct32).get("kv") == "f32", r.stderr.strip())
    r = run([shoal, "convert", MODEL, os.path.join(tmp, "ct-bad"), "--kv", "f8"])
    ok, why = one_line_error(r, "--kv", "'f8'")
    result("convert --kv f8: one line, exit 2", ok and not os.path.exists(os.path.join(tmp, "ct-bad")),
           why)

    # a container written before the field: runs as f32
    m = manifest(ct16)
    del m["kv"]
    write_manifest(ct16, m)
    old, err = logits(shoal, ct16, tmp, "ct-old")
    result("a manifest without \"kv\" runs with an f32 cache", old is not None and old == got["f32"],
           err)
    for bad, shown in (("f8", "'f8'"), (16, "'not a string'")):
        m["kv"] = bad
        write_manifest(ct16, m)
        r = run([shoal, "run", "--model", ct16, "--tokens", "1,2"])
        lines = r.stderr.strip().splitlines()
        result("a manifest with \"kv\": %r is refused in one line" % (bad,),
               r.returncode == 1 and len(lines) == 1 and "field 'kv'" in lines[0]
               and shown in lines[0] and "expected" in lines[0], r.stderr)
        # the flag does not paper over a damaged manifest
        r = run([shoal, "run", "--model", ct16, "--tokens", "1,2", "--kv", "f32"])
        result("... also with --kv f32", r.returncode == 1 and "field 'kv'" in r.stderr, r.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory(prefix="shoal-kv-") as tmp:
        got = test_flag(shoal, tmp)
        test_bad_flag(shoal)
        test_plan(shoal)
        if None not in got.values():
            test_convert(shoal, tmp, got)
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
