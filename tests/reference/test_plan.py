#!/usr/bin/env python3
"""`shoal plan`: sizes from a config.json alone.

1. Against what shoal writes: the bundled model converted with several
   --experts/--dense/--group choices, and tiny `shoal synth` containers of
   every family synth makes. The plan's per-expert bytes (the 4 KiB-aligned
   blob, as on disk), its components, the experts' total (experts.bin less
   its 4 KiB header) and the resident bytes (the sum of the dense tensors'
   bytes, without the 64-byte gaps between them) must equal the manifest's
   exactly.
2. Every real config in ../shared/data/configs (skipped, saying so, when
   absent): the total parameter count within 2 % of the published figure,
   and the derived figures (KV per token, per-token reads, disk reads at the
   hit rate, the RAM left for the cache, the worker split) consistent with
   the config's fields. Families shoal cannot run yet say so.
3. Bad input: an unknown model_type, a missing file: one line, exit 2.

Usage: /usr/bin/python3 tests/reference/test_plan.py --shoal BIN
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIGS = H.shared("data", "configs")
BUNDLED = os.path.join(ROOT, "models", "shakespeare-moe")
sys.path.insert(0, HERE)
HEADER = 4096

# Published total parameter counts (MTP layers excluded unless said).
PUBLISHED = {
    # Mistral AI, "Mixtral of Experts" (arXiv 2401.04088): 46.7B total
    "Mixtral-8x7B-v0.1.json": 46.7e9,
    # Qwen3 model card (huggingface.co/Qwen/Qwen3-30B-A3B): 30.5B total
    "Qwen3-30B-A3B.json": 30.5e9,
    # Qwen1.5-MoE-A2.7B model card / blog "Qwen1.5-MoE": 14.3B total
    "Qwen1.5-MoE-A2.7B.json": 14.3e9,
    # OLMoE paper (arXiv 2409.02060): 6.9B total, 1.3B active
    "OLMoE-1B-7B-0924.json": 6.9e9,
    # DeepSeek-V2 paper (arXiv 2405.04434) and V2-Lite model card: 15.7B total
    "DeepSeek-V2-Lite.json": 15.7e9,
    # DeepSeek-V3 technical report (arXiv 2412.19437) and model card: 671B
    # main model; 685B on Hugging Face with the 14B MTP module (below)
    "DeepSeek-V3-Base.json": 671e9,
    "DeepSeek-R1.json": 671e9,
    # Kimi K2 technical report (arXiv 2507.20534): 1.04 trillion total
    # (the model card rounds to 1T; the plan gives 1.026T, -1.3 %)
    "Kimi-K2-Instruct.json": 1.04e12,
    # GLM-4.5 technical report (arXiv 2508.06471): GLM-4.5-Air 106B total
    # (MTP layer excluded; the plan gives 106.9B without it)
    "GLM-4.5-Air-arch.INTELLECT-3-Base.json": 106e9,
    # OpenAI gpt-oss model card (arXiv 2508.10925), table 1: 20.91B total
    "gpt-oss-20b.json": 20.91e9,
}
# the DeepSeek-V3 model card: "685B, 671B main model + 14B MTP module"
PUBLISHED_WITH_MTP = {"DeepSeek-V3-Base.json": 685e9, "DeepSeek-R1.json": 685e9}
TOLERANCE = 0.02
RUNNABLE = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "kimi_k2",
            "glm4_moe", "gpt_oss"}



result = H.Results()


run = H.run   # output captured, 300 s


def plan(shoal, model, *flags):
    r = run([shoal, "plan", model, "--json"] + list(flags))
    if r.returncode not in (0, 3):   # 3: planned, does not fit
        return None, r.stderr.strip()
    return json.loads(r.stdout), ""


def check_container(shoal, name, ct, flags):
    """The plan of ct's own config, at the dtypes it was made with, against
    its manifest."""
    m = json.load(open(os.path.join(ct, "shoal.json")))
    p, e = plan(shoal, ct, *flags)
    if p is None:
        result(name, False, e)
        return
    ex = m["experts"]
    n_layer = json.load(open(os.path.join(ct, "config.json")))["num_hidden_layers"]

    def is_mtp(name):   # the MTP layers' tensors: blk.N.* with N >= num_hidden_layers
        return name.startswith("blk.") and int(name.split(".")[1]) >= n_layer
    dense = sum(t["bytes"] for t in m["dense"]["tensors"] if not is_mtp(t["name"]))
    mtp = sum(t["bytes"] for t in m["dense"]["tensors"] if is_mtp(t["name"]))
    want = {"expert_bytes": ex["blob_bytes"],
            "expert_components": [c["bytes"] for c in ex["components"]],
            "experts_bytes": ex["bytes"] - HEADER,
            "resident_bytes": dense}
    if mtp:   # convert wrote the MTP layers: the plan sizes them the same
        want["mtp_bytes"] = mtp
    got = {k: p[k] for k in want}
    result(name, got == want, "plan %s, container %s" % (got, want))


def test_convert(shoal, tmp):
    if not os.path.isdir(BUNDLED):
        print("SKIP bundled model: %s absent" % BUNDLED)
        return
    for experts, dense, group in [("bf16", "bf16", "64"), ("int4", "int8", "32"),
                                  ("int8", "f32", "128"), ("int4a8", "bf16", "64"),
                                  ("f32", "int8", "64"), ("int4a8", "int4a8", "64"),
                                  ("int4", "int4", "32")]:
        flags = ["--experts", experts, "--dense", dense, "--group", group]
        ct = os.path.join(tmp, "conv-%s-%s-%s" % (experts, dense, group))
        r = run([shoal, "convert", BUNDLED, ct] + flags)
        if r.returncode != 0:
            result("convert %s" % flags, False, r.stderr.strip())
            continue
        check_container(shoal, "plan = convert (bundled, %s)" % " ".join(flags), ct, flags)
    # the checkpoint directory itself (its config.json) plans the same
    p, e = plan(shoal, BUNDLED)
    result("plan of the bundled checkpoint directory", p is not None and p["runnable"]
           and p["n_moe_layer"] == 4 and p["n_expert"] == 8, e)


def dense_default_line(help_text):
    """The --dense entry of a usage text, its continuation lines joined."""
    lines = help_text.splitlines()
    for i, ln in enumerate(lines):
        if ln.strip().startswith("--dense"):
            out = [ln.strip()]
            for nxt in lines[i + 1:]:
                if not nxt.startswith(" " * 10) or nxt.strip().startswith("--"):
                    break
                out.append(nxt.strip())
            return " ".join(out)
    return ""


def test_dense_default(shoal, tmp):
    """Issue 32 item 1: with --experts int4a8 and no --dense, convert writes
    a bf16 trunk, plan reports a bf16 trunk, and both --help texts say
    --dense defaults to bf16 (they said "as --experts")."""
    if not os.path.isdir(BUNDLED):
        print("SKIP dense default: %s absent" % BUNDLED)
        return
    ct = os.path.join(tmp, "conv-int4a8-default")
    r = run([shoal, "convert", BUNDLED, ct, "--experts", "int4a8"])
    if r.returncode != 0:
        result("convert --experts int4a8 (no --dense)", False, r.stderr.strip())
        return
    m = json.load(open(os.path.join(ct, "shoal.json")))
    dtypes = sorted({t["dtype"] for t in m["dense"]["tensors"]})
    result("convert --experts int4a8: every dense tensor BF16", dtypes == ["BF16"],
           "dense dtypes %s" % dtypes)
    for what in (ct, BUNDLED):
        p, e = plan(shoal, what, "--experts", "int4a8")
        result("plan %s --experts int4a8: dense BF16, as convert wrote" % os.path.basename(what),
               p is not None and p["dense_dtype"] == "BF16",
               e or "dense_dtype %s" % p["dense_dtype"])
    check_container(shoal, "plan = convert (bundled, --experts int4a8, default --dense)", ct,
                    ["--experts", "int4a8"])
    for cmd in ("convert", "plan"):
        h = run([shoal, cmd, "--help"])
        line = dense_default_line(h.stdout)
        result("%s --help: --dense defaults to bf16, as it behaves" % cmd,
               h.returncode == 0 and "default bf16" in line and "as --experts" not in line,
               "rc %d: %r" % (h.returncode, line))


def test_fp8(shoal, tmp):
    """An FP8 checkpoint (DeepSeek-V3's layout, tiny) plans FP8 by default, as
    convert keeps it: the experts' bytes (codes, padding, 128x128 block
    scales) equal the container's. The trunk is not compared: the tiny
    checkpoint keeps its non-FP8 tensors in F32 where DeepSeek ships BF16."""
    import gen_tiny
    hf = os.path.join(tmp, "fp8")
    man, _ = gen_tiny.generate(hf, only=["deepseek_v3_fp8"], verbose=False)
    if "skipped" in man["models"]["deepseek_v3_fp8"]:
        print("SKIP fp8 plan: the DeepSeek-V3 config is absent")
        return
    src, ct = os.path.join(hf, "deepseek_v3_fp8"), os.path.join(tmp, "fp8-ct")
    r = run([shoal, "convert", src, ct])
    if r.returncode != 0:
        result("convert the FP8 checkpoint", False, r.stderr.strip())
        return
    m = json.load(open(os.path.join(ct, "shoal.json")))
    p, e = plan(shoal, src)
    if p is None:
        result("plan of the FP8 checkpoint", False, e)
        return
    ex = m["experts"]
    want = {"experts_dtype": "FP8", "expert_bytes": ex["blob_bytes"],
            "expert_components": [c["bytes"] for c in ex["components"]],
            "experts_bytes": ex["bytes"] - HEADER}
    got = {k: p[k] for k in want}
    result("plan = convert (tiny FP8 DeepSeek-V3, default dtypes)", got == want,
           "plan %s, container %s" % (got, want))


def test_gpt_oss(shoal, tmp):
    """gpt_oss's six-component experts (weights, then gate/up/down biases)
    and its trunk extras (o bias, sinks, router bias): plan = convert."""
    import gen_tiny
    hf = os.path.join(tmp, "go")
    man, _ = gen_tiny.generate(hf, only=["gpt_oss"], verbose=False)
    if "skipped" in man["models"]["gpt_oss"]:
        print("SKIP gpt_oss plan: the gpt-oss config is absent")
        return
    for experts, dense in [("bf16", "bf16"), ("int4a8", "int8")]:
        flags = ["--experts", experts, "--dense", dense, "--group", "32"]
        ct = os.path.join(tmp, "go-%s" % experts)
        r = run([shoal, "convert", os.path.join(hf, "gpt_oss"), ct] + flags)
        if r.returncode != 0:
            result("convert gpt_oss %s" % flags, False, r.stderr.strip())
            continue
        check_container(shoal, "plan = convert (tiny gpt_oss, %s)" % " ".join(flags), ct, flags)


def test_synth(shoal, tmp):
    shape = ["--hidden", "128", "--moe-ff", "96", "--n-expert", "8", "--top-k", "2",
             "--layers", "2", "--vocab", "512", "--heads", "4", "--kv-heads", "2",
             "--head-dim", "32", "--trace", "uniform"]
    for fam, experts, dense, group in [("qwen3_moe", "int4", "int8", "32"),
                                       ("olmoe", "int8", "bf16", "128"),
                                       ("mixtral", "int4a8", "f32", "64"),
                                       ("qwen2_moe", "bf16", "int8", "64"),
                                       ("qwen2_moe", "int4a8", "int4a8", "64")]:
        flags = ["--experts", experts, "--dense", dense, "--group", group]
        ct = os.path.join(tmp, "synth-%s-%s-%s" % (fam, experts, dense))
        r = run([shoal, "synth", ct, "--gb", "0.01", "--family", fam] + shape + flags)
        if r.returncode != 0:
            result("synth %s" % fam, False, (r.stderr or r.stdout).strip())
            continue
        check_container(shoal, "plan = synth (%s, %s)" % (fam, " ".join(flags)), ct, flags)


def test_real(shoal):
    if not os.path.isdir(CONFIGS):
        print("SKIP real configs: %s absent (the shared data set)" % CONFIGS)
        return
    ram, ctx, machines = 24 << 30, 2048, 3
    for fname in sorted(PUBLISHED):
        path = os.path.join(CONFIGS, fname)
        if not os.path.exists(path):
            print("SKIP %s: absent" % fname)
            continue
        cfg = json.load(open(path))
        p, e = plan(shoal, path, "--experts", "int4a8", "--dense", "int8", "--ram", "24G",
                    "--ctx", str(ctx), "--machines", str(machines))
        if p is None:
            result("plan " + fname, False, e)
            continue
        pub = PUBLISHED[fname]
        dev = p["params_total"] / pub - 1
        result("%s parameters" % fname, abs(dev) <= TOLERANCE,
               "%.2f B vs published %.2f B (%+.2f %%)" % (p["params_total"] / 1e9, pub / 1e9,
                                                          100 * dev))
        if fname in PUBLISHED_WITH_MTP:
            pub = PUBLISHED_WITH_MTP[fname]
            dev = p["params_total_with_mtp"] / pub - 1
            result("%s parameters with MTP" % fname, abs(dev) <= TOLERANCE,
                   "%.2f B vs %.2f B (%+.2f %%)" % (p["params_total_with_mtp"] / 1e9,
                                                    pub / 1e9, 100 * dev))
        L = cfg["num_hidden_layers"]
        mla = "kv_lora_rank" in cfg
        if mla:   # shoal's cache holds the latent and the rope key (MLA)
            kv_head = L * cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
                                                        + cfg["v_head_dim"]) * 4
            kv = kv_mla = L * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
        else:
            hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
            kv = 2 * L * cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd * 4
            kv_mla = kv_head = 0
        budget = ctx * kv
        tok = p["n_expert_used"] * p["expert_bytes"] * p["n_moe_layer"]
        held = -(-p["n_expert"] * p["n_moe_layer"] // machines)
        reserve = min(max(ram // 10, 1 << 30), 8 << 30)
        staging = 2 * 8 * p["expert_bytes"]   # 2 x the queue depth (expert_store.h)
        need0 = p["resident_bytes"] + budget + reserve + staging
        sp = p["speed"]
        ms = sp["machines"]
        checks = {
            "runnable": (p["runnable"], cfg["model_type"] in RUNNABLE),
            "kv_bytes_per_token": (p["kv_bytes_per_token"], kv),
            "kv_mla_bytes_per_token": (p["kv_mla_bytes_per_token"], kv_mla),
            "kv_per_head_bytes_per_token": (p["kv_per_head_bytes_per_token"], kv_head),
            "kv_budget_bytes": (p["kv_budget_bytes"], budget),
            "n_expert_used": (p["n_expert_used"], cfg.get("num_experts_per_tok")),
            "experts_bytes": (p["experts_bytes"],
                              p["expert_bytes"] * p["n_expert"] * p["n_moe_layer"]),
            "expert_bytes 4 KiB": (p["expert_bytes"] % 4096, 0),
            "token_expert_bytes": (p["token_expert_bytes"], tok),
            "resident parts": (sum(p["resident_parts"].values()), p["resident_bytes"]),
            "machines": (len(ms), machines),
            "verdict": (sp["verdict"], "runs" if need0 <= ram else "does not fit"),
            "coordinator trunk": (ms[0]["trunk_bytes"], p["resident_bytes"]),
            "coordinator kv": (ms[0]["kv_bytes"], budget),
        }
        for i, m in enumerate(ms):
            checks["machine %d ram" % i] = (m["ram_bytes"], ram)
            checks["machine %d reserve" % i] = (m["reserve_bytes"], reserve)
            checks["machine %d staging" % i] = (m["staging_bytes"], staging)
            if sp["verdict"] != "runs":
                continue
            free_b = ram - reserve - staging - (need0 - reserve - staging if i == 0 else 0)
            cached = min(free_b // p["expert_bytes"], held)
            checks["machine %d held" % i] = (m["experts_held"], held)
            checks["machine %d cached" % i] = (m["experts_cached"], cached)
            checks["machine %d cache bytes" % i] = (m["expert_cache_bytes"],
                                                     cached * p["expert_bytes"])
            checks["machine %d fits" % i] = (
                m["trunk_bytes"] + m["kv_bytes"] + m["reserve_bytes"] + m["staging_bytes"]
                + m["expert_cache_bytes"] <= ram, True)
        bad = {k: v for k, v in checks.items() if v[0] != v[1]}
        result("%s figures" % fname, not bad, "mismatched (got, want): %s" % bad if bad else
               "resident %.2f GiB, experts %.1f GiB, %d B/expert, KV %d B/token%s" % (
                   p["resident_bytes"] / 2**30, p["experts_bytes"] / 2**30,
                   p["expert_bytes"], p["kv_bytes_per_token"],
                   ", MLA %d B/token" % kv_mla if mla else ""))
        if fname == "gpt-oss-20b.json":
            # its own safetensors index says how big the shipped checkpoint
            # is (MXFP4 experts, BF16 trunk): the default plan, which keeps
            # that precision, must land within 2 % of it (convert pads each
            # expert to 4 KiB and drops nothing)
            idx = json.load(open(os.path.join(CONFIGS, "gpt-oss-20b.safetensors.index.json")))
            total = idx["metadata"]["total_size"]
            q, e = plan(shoal, path)
            got = q["resident_bytes"] + q["experts_bytes"] if q else 0
            result("gpt-oss-20b: the default plan (MXFP4 experts) matches the shipped bytes",
                   q is not None and q["experts_dtype"] == "MXFP4" and abs(got / total - 1) < 0.02,
                   e or "%.3f GB planned vs %.3f GB in the index" % (got / 1e9, total / 1e9))


def test_bad(shoal, tmp):
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        json.dump({"model_type": "llama4_moe", "hidden_size": 8}, f)
    r = run([shoal, "plan", bad])
    err = r.stderr.strip()
    result("unknown model_type: exit 2, one line naming it", r.returncode == 2 and
           "llama4_moe" in err and "unknown model_type" in err and len(err.splitlines()) == 1,
           "rc %d: %s" % (r.returncode, err))
    r = run([shoal, "plan", os.path.join(tmp, "no-such.json")])
    err = r.stderr.strip()
    result("missing file: exit 2, one line", r.returncode == 2 and len(err.splitlines()) == 1
           and "no-such.json" in err, "rc %d: %s" % (r.returncode, err))
    with open(bad, "w") as f:
        json.dump({"model_type": "deepseek_v3", "hidden_size": 8}, f)
    r = run([shoal, "plan", bad])
    err = r.stderr.strip()
    result("missing field: exit 2, one line naming it", r.returncode == 2 and
           len(err.splitlines()) == 1 and "'" in err, "rc %d: %s" % (r.returncode, err))
    # --ctx past the model's positions: refused as run refuses it (plan
    # budgeted a KV cache run would never make and said "runs")
    with open(bad, "w") as f:
        json.dump({"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
                   "moe_intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                   "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000,
                   "max_position_embeddings": 256}, f)
    r = run([shoal, "plan", bad, "--ctx", "257", "--ram", "8G"])
    err = r.stderr.strip()
    result("--ctx past max_position_embeddings: exit 2, one line naming both",
           r.returncode == 2 and len(err.splitlines()) == 1 and "--ctx 257" in err and
           "max_position_embeddings 256" in err and not r.stdout.strip(),
           "rc %d: %s" % (r.returncode, err))
    r = run([shoal, "plan", bad, "--ctx", "256", "--ram", "8G"])
    result("--ctx at max_position_embeddings: planned", r.returncode in (0, 3),
           "rc %d: %s" % (r.returncode, r.stderr.strip()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory(prefix="shoal-plan-") as tmp:
        test_convert(shoal, tmp)
        test_dense_default(shoal, tmp)
        test_fp8(shoal, tmp)
        test_gpt_oss(shoal, tmp)
        test_synth(shoal, tmp)
        test_real(shoal)
        test_bad(shoal, tmp)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
