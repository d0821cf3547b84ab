#!/usr/bin/python3
"""`shoal chat` and `shoal serve` read a GGUF file's own chat template
(issue 30): tokenizer.chat_template, with bos_token / eos_token the texts of
tokenizer.ggml.bos_token_id / eos_token_id in tokenizer.ggml.tokens.

usage: /usr/bin/python3 tests/cli/test_gguf_chat.py --shoal build-test/coordinator/shoal

The file is the bundled checkpoint (models/shakespeare-moe) written as a
BF16 qwen3moe GGUF with its own vocabulary, as tests/cli/test_run_gguf.py
writes it, plus the bundled tokenizer_config.json's chat_template as
tokenizer.chat_template. The reference is the checkpoint directory.

Cases:
  chat:     a piped two-turn session (greedy) prints the checkpoint's reply
            text
  tokens:   a template that writes {{ bos_token }} and {{ eos_token }}
            (in the file, and in a copy of the checkpoint's
            tokenizer_config.json): the same prompt token counts as the
            checkpoint's, two more than without them (the ids' texts are
            <|endoftext|>, one token each)
  serve:    /v1/chat/completions (temperature 0) answers what it answers on
            the checkpoint directory
  none:     a GGUF without tokenizer.chat_template: `shoal chat` exits 1
            with one line naming the key, as a checkpoint without a
            template does naming tokenizer_config.json; `shoal serve`
            starts and says so in one line
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402
from gguf_writer import kv, read_safetensors  # noqa: E402
import test_run_gguf as R  # noqa: E402

result = H.Results()
MODEL = H.MODEL
SCRIPT = "Good morrow, sir.\nWhat news?\n"
CHAT = ["--greedy", "--max-tokens", "12"]


def write_model(path, template):
    """The bundled checkpoint as a BF16 GGUF with its vocabulary and, unless
    template is None, tokenizer.chat_template = template."""
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    st = read_safetensors(os.path.join(MODEL, "model.safetensors"))
    tensors = R.gguf_tensors(st, cfg["num_hidden_layers"], cfg["num_experts"])
    kvs = R.metadata(cfg) + R.vocab_kvs()
    if template is not None:
        kvs.append(kv("tokenizer.chat_template", "str", template))
    R.write_gguf(path, kvs, R.typed(tensors, "BF16"))


def checkpoint_copy(d, template):
    """The bundled checkpoint in d, with its chat_template replaced
    (template None: removed)."""
    shutil.copytree(MODEL, d, ignore=shutil.ignore_patterns("golden", "heldout.json"))
    p = os.path.join(d, "tokenizer_config.json")
    with open(p) as f:
        tc = json.load(f)
    tc.pop("chat_template")
    if template is not None:
        tc["chat_template"] = template
    with open(p, "w") as f:
        json.dump(tc, f, indent=2)


def chat(shoal, model, *extra):
    return H.run([shoal, "chat", "--model", model] + CHAT + list(extra), input=SCRIPT,
                 timeout=120)


def show(r):
    return "exit %d: out %r err %r" % (r.returncode, r.stdout[-300:], r.stderr.strip()[-300:])


def prefilled(r):
    """The prompt token counts of each turn (-v: "turn prefilled N new
    tokens (M reused...")."""
    return [int(a) + int(b) for a, b in
            re.findall(r"turn prefilled (\d+) new tokens \((\d+) reused", r.stderr)]


def serve_reply(shoal, model, msgs):
    srv = H.Server(shoal, model=model)
    try:
        s, _, b = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 24,
                                                    "temperature": 0})
        return s, json.loads(b) if s == 200 else b, srv.log()
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with open(os.path.join(MODEL, "tokenizer_config.json")) as f:
        template = json.load(f)["chat_template"]
    with tempfile.TemporaryDirectory(prefix="shoal-gguf-chat-") as tmp:
        path = os.path.join(tmp, "shakespeare.gguf")
        write_model(path, template)
        want, got = chat(shoal, MODEL), chat(shoal, path)
        result("chat: the GGUF's template gives the checkpoint's replies",
               want.returncode == 0 and got.returncode == 0 and got.stdout == want.stdout and
               len(got.stdout.strip()) > 30, show(got) + " | want " + show(want))

        # bos_token / eos_token: texts of the ids, one token each
        tt = "{{ bos_token }}" + template + "{{ eos_token }}"
        tpath, tdir = os.path.join(tmp, "tokens.gguf"), os.path.join(tmp, "tokens-ckpt")
        write_model(tpath, tt)
        checkpoint_copy(tdir, tt)
        base, gt, ct = (prefilled(chat(shoal, m, "-v")) for m in (path, tpath, tdir))
        result("chat: {{ bos_token }} and {{ eos_token }} from the GGUF's ids: prompts of %s "
               "tokens, the checkpoint's %s, the first two more than %s" % (gt, ct, base),
               len(base) == 2 and gt == ct and gt[0] == base[0] + 2)

        msgs = [{"role": "system", "content": "You are a poet."},
                {"role": "user", "content": "Speak of the moon."}]
        s0, r0, log0 = serve_reply(shoal, MODEL, msgs)
        s1, r1, log1 = serve_reply(shoal, path, msgs)
        text = (lambda r: r["choices"][0]["message"]["content"] if isinstance(r, dict) else None)
        result("serve: /v1/chat/completions on the GGUF answers the checkpoint's reply",
               s0 == 200 and s1 == 200 and text(r1) == text(r0) and text(r0),
               "status %s / %s: %r vs %r" % (s1, s0, text(r1), text(r0)))

        # no template: one line naming what is missing, as for a checkpoint
        npath, ndir = os.path.join(tmp, "none.gguf"), os.path.join(tmp, "none-ckpt")
        write_model(npath, None)
        checkpoint_copy(ndir, None)
        for what, m, needles in (("GGUF", npath, [npath, "tokenizer.chat_template",
                                                  "(a base model?)"]),
                                 ("checkpoint", ndir, ["tokenizer_config.json",
                                                       "(a base model?)"])):
            r = chat(shoal, m)
            lines = r.stderr.strip().splitlines()
            result("chat on a %s without a template: exit 1, one line 'shoal: chat: ...' "
                   "naming %s" % (what, ", ".join(needles)),
                   r.returncode == 1 and len(lines) == 1 and lines[0].startswith("shoal: chat: ")
                   and all(n in lines[0] for n in needles), show(r))
        srv = H.Server(shoal, model=npath)
        try:
            s, _, b = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4})
            log = srv.log()
        finally:
            srv.stop()
        said = [x for x in log.splitlines() if "no chat template" in x]
        result("serve on a GGUF without a template: starts, one line naming "
               "tokenizer.chat_template, chat requests refused (%s)" % s,
               len(said) == 1 and "tokenizer.chat_template" in said[0] and s >= 400,
               log[-400:])
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
