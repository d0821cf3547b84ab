#!/usr/bin/python3
"""Write the bundled checkpoint (or another qwen3_moe checkpoint of one
safetensors file) as a qwen3moe GGUF, with the writer and quantizers the
GGUF tests use (tests/cli/test_run_gguf.py): llama.cpp's tensor names and
metadata keys, its vocabulary as tokenizer.ggml.*.

usage: /usr/bin/python3 tests/make_gguf.py OUT.gguf [--type BF16|F32|Q8_0]
                                           [--model DIR]

--type: the matrices' type (1-D tensors stay F32; BF16 keeps the
checkpoint's bits). docs/OPERATIONS.md "Running a GGUF file" uses it for its
worked example; llama.cpp's convert_hf_to_gguf.py writes the same layout.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "cli"))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402
import test_run_gguf as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--type", default="BF16", choices=("BF16", "F32", "Q8_0"))
    ap.add_argument("--model", default=H.MODEL, help="a qwen3_moe checkpoint directory "
                    "(default: the bundled one)")
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "qwen3_moe":
        sys.exit("make_gguf: %s is a %s checkpoint; this writes qwen3_moe only"
                 % (a.model, cfg.get("model_type")))
    st = T.read_safetensors(os.path.join(a.model, "model.safetensors"))
    tensors = T.gguf_tensors(st, cfg["num_hidden_layers"], cfg["num_experts"])
    T.write_gguf(a.out, T.metadata(cfg) + T.vocab_kvs(), T.typed(tensors, a.type))
    print("wrote %s: %d tensors, %s matrices, %.1f MB" % (a.out, len(tensors), a.type,
                                                         os.path.getsize(a.out) / 1e6))


if __name__ == "__main__":
    main()
