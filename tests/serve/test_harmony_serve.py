#!/usr/bin/env python3
"""shoal serve on a harmony model (gpt-oss): /v1/chat/completions parses the
reply into channels, as shoal chat does.

The model: a tiny gpt_oss checkpoint (gen_tiny's architecture, random
weights, hidden 64) with gpt-oss's vocabulary size (201088), its special
tokens at their real ids (<|start|> 200006, <|channel|> 200005, <|message|>
200008, <|end|> 200007, <|return|> 200002, <|call|> 200012; the model's own
tokenizer_config.json), its chat template (chat_template.jinja) and its
generation_config end ids, over a toy byte-level BPE with o200k's split
(the 27 MB o200k_harmony tokenizer.json is not in ../shared/data).

Random weights write no harmony structure, so the server runs with
--test-forced-tokens FILE (tests only): each request's first tokens are the
ids in FILE, the tokenization of a harmony reply. Checks:

  - analysis text lands in message.reasoning_content, final text in
    message.content (whole), and in delta.reasoning_content / delta.content
    chunks (streamed, in the order generated), finish_reason stop, usage and
    logprobs (one entry per token, whole and streamed) count every token;
  - a commentary message without a recipient (a preamble) is content,
    joined to the final answer by a newline;
  - <|call|> after a message to functions.get_weather: finish_reason
    tool_calls, tool_calls [{id "call_...", type function, function {name
    get_weather, arguments as written}}], content null; streamed: one delta
    with the call (index 0), then the finish;
  - max_tokens inside the analysis: finish_reason length, content "", the
    reasoning so far;
  - "stop" on a harmony chat request: 400 naming "stop"; the server keeps
    serving;
  - "tools" and "chat_template_kwargs" reach the template: prompt_tokens
    equals jinja2's rendering of the same request, with and without them;
    a bad value is a 400 naming the field;
  - /v1/completions on the same model is not parsed (the markers give no
    text, the channels run together), as before.

usage: test_harmony_serve.py --shoal build-test/coordinator/shoal
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import test_serve as ts  # noqa: E402
from test_serve import check  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures")
N_VOCAB = 201088          # gpt-oss-20b's vocab_size

ANALYSIS = "<|channel|>analysis<|message|>We think about it.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>"
PREAMBLE = "<|channel|>commentary<|message|>Checking.<|end|>"
CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather "
        "<|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>")


def make_model(d):
    """The tiny gpt_oss checkpoint with gpt-oss's vocabulary layout in d."""
    import gen_tiny
    import test_tokenizer_moe as ttm
    with open(os.path.join(gen_tiny.DEFAULT_CONFIGS, "gpt-oss-20b.json")) as f:
        real = json.load(f)
    _, sizes, extra, seed, _ = gen_tiny.SPECS["gpt_oss"]
    cfg = gen_tiny.derive_config(real, sizes, extra, 200002)
    cfg.update(vocab_size=N_VOCAB, max_position_embeddings=4096, pad_token_id=199999,
               bos_token_id=199998)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gen_tiny.write_checkpoint(d, gen_tiny.make_bf16(gen_tiny.make_weights(cfg, seed)), 1)
    # the toy BPE at ids 0.., the model's special tokens at their real ids
    vocab, merges, eos_id = gen_tiny.train_bpe()
    tj = gen_tiny.tokenizer_json(vocab, merges, eos_id)
    del tj["model"]["vocab"][gen_tiny.EOS]
    with open(os.path.join(FIXTURES, "gpt-oss-20b.tokenizer_config.json")) as f:
        tcfg = json.load(f)
    tj["added_tokens"] = [dict(v, id=int(k)) for k, v in tcfg["added_tokens_decoder"].items()]
    tj["pre_tokenizer"] = ttm.GPT_OSS_PRE
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    shutil.copy(os.path.join(FIXTURES, "gpt-oss-20b.tokenizer_config.json"),
                os.path.join(d, "tokenizer_config.json"))
    shutil.copy(os.path.join(FIXTURES, "gpt-oss-20b.chat_template.jinja"),
                os.path.join(d, "chat_template.jinja"))
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012],
                   "pad_token_id": 199999}, f)


def ids_of(shoal, model, text):
    r = subprocess.run([shoal, "tokenize", "--model", model, "--no-bos", "--parse-special",
                        "--text", text], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


class Harmony:
    def __init__(self, shoal, model, srv, forced_path):
        self.shoal, self.model, self.srv, self.path = shoal, model, srv, forced_path

    def force(self, text):
        """The next requests' first tokens: text's tokens. Returns them."""
        ids = ids_of(self.shoal, self.model, text)
        with open(self.path, "w") as f:
            f.write(" ".join(map(str, ids)))
        return ids

    def chat(self, what, stream=False, **extra):
        """(status, message dict or the deltas list, choice/last chunk, body)."""
        body = {"messages": [{"role": "user", "content": "What is 2+2?"}], "stream": stream,
                "max_tokens": 300}
        body.update(extra)
        s, _, b = self.srv.post("/v1/chat/completions", body)
        if s != 200:
            check(False, "%s: status %d (%r)" % (what, s, b[:300]))
            return None
        if not stream:
            r = json.loads(b)
            return r
        events = ts.sse_events(b)
        return [json.loads(e) for e in events if e != "[DONE]"]


def joined(chunks, field):
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c["choices"])


def test_channels(h):
    ids = h.force(ANALYSIS + FINAL)
    r = h.chat("analysis + final")
    if r:
        c = r["choices"][0]
        m = c["message"]
        check(m.get("content") == "The answer is 4.",
              "whole: content is the final channel (%r)" % m.get("content"))
        check(m.get("reasoning_content") == "We think about it.",
              "whole: reasoning_content is the analysis (%r)" % m.get("reasoning_content"))
        check("tool_calls" not in m, "whole: no tool_calls")
        check(c["finish_reason"] == "stop", "whole: finish_reason stop (%r)" % c["finish_reason"])
        check(r["usage"]["completion_tokens"] == len(ids),
              "whole: usage counts every token (%d vs %d)" %
              (r["usage"]["completion_tokens"], len(ids)))
    chunks = h.chat("analysis + final, streamed", stream=True)
    if chunks:
        check(joined(chunks, "content") == "The answer is 4.",
              "streamed: the content deltas are the final text (%r)" % joined(chunks, "content"))
        check(joined(chunks, "reasoning_content") == "We think about it.",
              "streamed: the reasoning deltas are the analysis (%r)" %
              joined(chunks, "reasoning_content"))
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        check(deltas[0] == {"role": "assistant", "content": ""}, "streamed: the role first")
        kinds = [("r" if d.get("reasoning_content") else "c") for d in deltas
                 if d.get("reasoning_content") or d.get("content")]
        check(len(kinds) >= 4 and kinds == sorted(kinds, reverse=True),
              "streamed: several reasoning chunks, then content chunks (%s)" % "".join(kinds))
        check(chunks[-1]["choices"][0]["finish_reason"] == "stop",
              "streamed: the last chunk says stop")
    # logprobs: one entry per generated token but the end token (fed, not
    # sampled with logits kept), whole and over the chunks
    r = h.chat("logprobs", logprobs=True)
    if r:
        lp = r["choices"][0]["logprobs"]["content"]
        check(len(lp) == len(ids) - 1, "whole: a logprob per token (%d, %d tokens)" %
              (len(lp), len(ids)))
        check(all(e["logprob"] <= 0 for e in lp), "whole: logprobs are <= 0")
        check(r["choices"][0]["message"]["content"] == "The answer is 4.",
              "whole with logprobs: content")
    chunks = h.chat("logprobs, streamed", stream=True, logprobs=True)
    if chunks:
        n = sum(len((c["choices"][0].get("logprobs") or {}).get("content") or [])
                for c in chunks if c["choices"])
        check(n == len(ids) - 1, "streamed: a logprob per token over the chunks (%d)" % n)
        check(joined(chunks, "content") == "The answer is 4." and
              joined(chunks, "reasoning_content") == "We think about it.",
              "streamed with logprobs: the channels")

    h.force(PREAMBLE + FINAL)
    r = h.chat("preamble")
    if r:
        m = r["choices"][0]["message"]
        check(m.get("content") == "Checking.\nThe answer is 4.",
              "a commentary preamble is content, a newline before the final (%r)" %
              m.get("content"))
        check("reasoning_content" not in m, "no analysis: no reasoning_content")

    h.force(ANALYSIS + FINAL)
    n_head = len(ids_of(h.shoal, h.model, "<|channel|>analysis<|message|>"))
    r = h.chat("cut in the analysis", max_tokens=n_head + 3)
    if r:
        c = r["choices"][0]
        check(c["finish_reason"] == "length", "max_tokens in the analysis: length")
        check(c["message"]["content"] == "", "max_tokens in the analysis: content empty")
        rc = c["message"].get("reasoning_content") or ""
        check(rc and "We think about it.".startswith(rc),
              "max_tokens in the analysis: the reasoning so far (%r)" % rc)


def test_tool_call(h):
    h.force(CALL)
    r = h.chat("tool call")
    if r:
        c = r["choices"][0]
        m = c["message"]
        check(c["finish_reason"] == "tool_calls", "tool call: finish_reason tool_calls (%r)" %
              c["finish_reason"])
        check(m.get("content") is None, "tool call: content null (%r)" % m.get("content"))
        check(m.get("reasoning_content") == "Need the weather.", "tool call: the reasoning")
        calls = m.get("tool_calls") or [{}]
        check(len(calls) == 1, "tool call: one call")
        t = calls[0]
        check(t.get("type") == "function" and str(t.get("id", "")).startswith("call_") and
              len(t["id"]) > 10, "tool call: id and type (%r)" % t)
        f = t.get("function") or {}
        check(f.get("name") == "get_weather", "tool call: name without functions. (%r)" % f)
        check(f.get("arguments") == "{\"city\": \"Paris\"}", "tool call: arguments (%r)" % f)
    chunks = h.chat("tool call, streamed", stream=True)
    if chunks:
        calls = [c["choices"][0]["delta"]["tool_calls"] for c in chunks
                 if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
        check(len(calls) == 1 and len(calls[0]) == 1, "streamed: one delta with the call")
        if calls:
            t = calls[0][0]
            check(t.get("index") == 0 and t.get("type") == "function" and
                  t["function"] == {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
                  "streamed: the call's delta (%r)" % t)
        check(joined(chunks, "content") == "", "streamed: no content")
        check(joined(chunks, "reasoning_content") == "Need the weather.",
              "streamed: the reasoning")
        check(chunks[-1]["choices"][0]["finish_reason"] == "tool_calls",
              "streamed: finish_reason tool_calls")


TOOLS = [{"type": "function",
          "function": {"name": "get_weather", "description": "The weather in a city.",
                       "parameters": {"type": "object",
                                      "properties": {"city": {"type": "string"}},
                                      "required": ["city"]}}}]


def test_tools(h):
    """"tools" and "chat_template_kwargs" reach the chat template: the
    prompt has as many tokens as jinja2's rendering of the same request
    (transformers' apply_chat_template(tools=..., **kwargs)), and more with
    the tool than without; a bad value is a 400 naming the field."""
    import test_chat_template_jinja as tj
    if tj.jinja2 is None:
        print("SKIP tools: python3-jinja2 is not installed")
        return
    env = tj.make_env()
    with open(os.path.join(FIXTURES, "gpt-oss-20b.chat_template.jinja")) as f:
        src = f.read()
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    counts = {}
    for name, tools, kw in (("none", None, None), ("tools", TOOLS, None),
                            ("tools + reasoning_effort", TOOLS, {"reasoning_effort": "high"}),
                            ("empty tools", [], None)):
        extra = dict(kw or {})
        extra["tools"] = tools or None
        text, err = tj.jinja_render(env, src, msgs, "<|startoftext|>", "<|return|>", True, extra)
        check(err is None, "%s: jinja2 renders the request (%s)" % (name, err))
        if err:
            continue
        want = len(ids_of(h.shoal, h.model, text))
        h.force(FINAL)
        body = {}
        if tools is not None:
            body["tools"] = tools
        if kw is not None:
            body["chat_template_kwargs"] = kw
        r = h.chat(name, **body)
        if r:
            got = r["usage"]["prompt_tokens"]
            counts[name] = got
            check(got == want, "%s: prompt_tokens %d == jinja2's rendering, %d tokens" % (
                name, got, want))
    if len(counts) == 4:
        check(counts["tools"] > counts["none"] and counts["empty tools"] == counts["none"] and
              counts["tools + reasoning_effort"] != counts["tools"],
              "the tool and the kwargs change the prompt, [] does not (%r)" % counts)
    for field, value in (("tools", {"type": "function"}), ("tools", [1]),
                         ("chat_template_kwargs", [1]), ("chat_template_kwargs", "x"),
                         ("chat_template_kwargs", {"messages": "evil"}),
                         ("chat_template_kwargs", {"add_generation_prompt": False})):
        s, _, b = h.srv.post("/v1/chat/completions",
                             {"messages": msgs, field: value, "max_tokens": 2})
        err = json.loads(b).get("error", {}) if s == 400 else {}
        check(s == 400 and field in (err.get("message") or "") and err.get("param") == field,
              "%s %r: 400 naming it (%d %r)" % (field, value, s, b[:200]))


def test_refusals_and_completions(h):
    s, _, b = h.srv.post("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Hi"}], "stop": ["x"]})
    ts.error_object(s, b, 400, "stop with harmony", param="stop")
    ts.healthy(h.srv, "after the stop refusal")
    h.force(ANALYSIS + FINAL)
    s, _, b = h.srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 300})
    check(s == 200, "completions: status %d" % s)
    if s == 200:
        c = json.loads(b)["choices"][0]
        check(c["text"] == "analysisWe think about it.assistantfinalThe answer is 4.",
              "completions: not parsed, the markers give no text (%r)" % c["text"])
        check(c["finish_reason"] == "stop", "completions: <|return|> (the model's EOS) stops")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "gpt_oss_harmony")
        make_model(model)
        forced = os.path.join(tmp, "forced.txt")
        with open(forced, "w"):
            pass
        srv = ts.Server(shoal, "--ctx", "1024", "--parallel", "2",
                        "--test-forced-tokens", forced, model=model)
        try:
            h = Harmony(shoal, model, srv, forced)
            test_channels(h)
            test_tool_call(h)
            test_tools(h)
            test_refusals_and_completions(h)
        finally:
            check(srv.stop() == 0, "serve exits 0 on SIGTERM")
            if ts.result.failed:
                print(srv.log()[-3000:])
    sys.exit(ts.result.summary("test_harmony_serve"))


if __name__ == "__main__":
    main()
