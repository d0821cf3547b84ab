#!/usr/bin/env python3
"""shoal serve's continuous batching keeps contract 1: a request's tokens
and logits bytes are the same whether it runs alone or beside other
requests, in any batch composition, at any --parallel.

For the bundled model and tiny checkpoints of two more families (gen_tiny:
deepseek_v3 with MLA attention, gpt_oss with attention sinks, sliding
windows and biased experts):

  - shoal run --greedy --logits-out: each prompt alone, the reference;
  - shoal serve --test-logits-dir: the same prompt alone through the API
    (as text, and as a list of token ids),
    then the four prompts at once (two of them streamed, one sharing a long
    prefix with another so its KV rows are copied from that slot), then again
    at --parallel 2 --batch 8 (prompt chunks of 8 rows beside decode rows,
    two requests queued), then seeded sampling beside greedy requests;
  - every response's text equals shoal run's, and the logits file the server
    wrote for it equals shoal run's byte for byte;
  - the server's log shows requests that shared steps and a cached prefix;
  - the same with --speculate lookup, and with --speculate mtp for a model
    with MTP layers (deepseek_v3's tiny checkpoint, the bundled model): each
    request drafts its own tokens, verified in the shared step, same bits.

usage: test_batching.py --shoal build-test/coordinator/shoal
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import test_serve as ts  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))
from spec_bench import has_mtp  # noqa: E402  (the config names MTP layers)
from test_serve import check  # noqa: E402

N_TOKENS = 12
PROMPTS = [
    "ROMEO: But soft, what light through yonder window breaks? It is the east,",
    "KING:",
    "To be, or not to be,",
    # shares its first ~20 tokens with the first prompt
    "ROMEO: But soft, what light through yonder window breaks? Arise, fair sun",
]

# repeats itself: prompt lookup finds drafts in it
SPEC_PROMPT = "ROMEO: I'll tell thee how I am.\n\nJULIET: I'll tell thee how I am.\n\nROMEO: I'll"


def reference(shoal, model, tmp, prompt, i, extra=(), greedy=True):
    """shoal run's text and logits bytes for prompt."""
    path = os.path.join(tmp, "run-%d.npy" % i)
    text = ts.shoal_run(shoal, prompt, N_TOKENS, "--logits-out", path, *extra,
                        greedy=greedy, model=model)
    with open(path, "rb") as f:
        return text, f.read()


def token_ids(shoal, model, text):
    r = subprocess.run([shoal, "tokenize", "--model", model, "--text", text,
                        "--parse-special"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


def ask(srv, logits_dir, prompt, stream=False, sampling=None):
    """One completion: (text, logits bytes the server wrote for it)."""
    body = {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0, "stream": stream}
    body.update(sampling or {})
    s, _, b = srv.post("/v1/completions", body)
    if s != 200:
        return "HTTP %d: %r" % (s, b[:200]), b""
    if stream:
        events = ts.sse_events(b)
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        rid = chunks[0]["id"] if chunks else "?"
        text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    else:
        r = json.loads(b)
        rid, text = r["id"], r["choices"][0]["text"]
    try:
        with open(os.path.join(logits_dir, rid + ".npy"), "rb") as f:
            return text, f.read()
    except OSError:
        return text, b""


def together(srv, logits_dir, jobs):
    """Run ask(*job) for every job at once; results in order."""
    out = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def go(k):
        barrier.wait()
        out[k] = ask(srv, logits_dir, *jobs[k])

    ts_ = [threading.Thread(target=go, args=(k,)) for k in range(len(jobs))]
    for t in ts_:
        t.start()
    for t in ts_:
        t.join()
    return out


def same(got, want, what):
    check(got[0] == want[0], "%s: text %r, shoal run gives %r" % (what, got[0], want[0]))
    check(len(want[1]) > 128 and got[1] == want[1],
          "%s: logits bytes equal shoal run's (%d vs %d bytes)" % (what, len(got[1]), len(want[1])))


def check_model(shoal, name, model, tmp):
    refs = [reference(shoal, model, tmp, p, i) for i, p in enumerate(PROMPTS)]
    check(len({r[1] for r in refs}) == len(refs), name + ": the prompts' references differ")
    sampled = reference(shoal, model, tmp, PROMPTS[2], 9,
                        extra=("--temp", "0.9", "--seed", "7"), greedy=False)
    spec_ref = reference(shoal, model, tmp, SPEC_PROMPT, 10)
    configs = [(("--parallel", "4"), "--parallel 4"),
               (("--parallel", "2", "--batch", "8", "--queue", "8"), "--parallel 2 --batch 8")]
    if name == "bundled":   # fewer rows per step than requests: every one still advances
        configs.append((("--parallel", "4", "--batch", "2"), "--parallel 4 --batch 2"))
    # speculation (prompt lookup): drafts verified in the batch, the same bits
    configs.append((("--parallel", "4", "--speculate", "lookup"), "--speculate lookup"))
    configs.append((("--parallel", "2", "--batch", "8", "--queue", "8", "--speculate",
                     "lookup", "--draft-max", "3"), "--parallel 2 --batch 8 --speculate lookup"))
    mtp = has_mtp(model)
    if mtp:   # drafts from the model's MTP layers, each request its own: the same bits
        configs.append((("--parallel", "4", "--speculate", "mtp", "--draft-max", "2"),
                        "--speculate mtp"))
    for args, label in configs:
        logits_dir = tempfile.mkdtemp(dir=tmp)
        srv = ts.Server(shoal, "--test-logits-dir", logits_dir, "--test-token-delay", "5",
                        *args, model=model)
        try:
            what = "%s %s" % (name, label)
            same(ask(srv, logits_dir, PROMPTS[0]), refs[0], what + ", alone")
            ids = token_ids(shoal, model, PROMPTS[0])
            same(ask(srv, logits_dir, ids), refs[0], what + ", the prompt as token ids")
            s, _, b = srv.post("/v1/completions", {"prompt": ids[:3] + [10 ** 6]})
            ts.error_object(s, b, 400, what + ", a token id past the vocabulary", param="prompt")
            got = together(srv, logits_dir, [(p, k % 2 == 1) for k, p in enumerate(PROMPTS)])
            for k in range(len(PROMPTS)):
                same(got[k], refs[k], "%s, prompt %d beside 3 others%s" %
                     (what, k, " (streamed)" if k % 2 else ""))
            got = together(srv, logits_dir,
                           [(PROMPTS[2], False, {"temperature": 0.9, "seed": 7}),
                            (PROMPTS[0], True), (PROMPTS[1], False), (PROMPTS[3], False)])
            same(got[0], sampled, what + ", seeded sampling beside 3 greedy requests")
            for k, p in ((1, 0), (2, 1), (3, 3)):
                same(got[k], refs[p], "%s, prompt %d again beside others" % (what, p))
            log = srv.log()
            mates = [int(m) for m in re.findall(r"batched with up to (\d+)", log)]
            check(mates and max(mates) >= 1,
                  what + ": requests shared engine steps (log: %r)" % mates)
            if "--speculate" in args:
                got = together(srv, logits_dir, [(SPEC_PROMPT, True), (PROMPTS[1], False),
                                                 (SPEC_PROMPT, False)])
                same(got[0], spec_ref, what + ", a repetitive prompt (streamed)")
                same(got[1], refs[1], what + ", prompt 1 beside it")
                same(got[2], spec_ref, what + ", the repetitive prompt again")
                log = srv.log()
            if "mtp" in args:   # every decode step drafts
                drafted = [int(m) for m in re.findall(r"speculate mtp: (\d+) drafted", log)]
                check(drafted and max(drafted) > 0,
                      what + ": requests carried MTP drafts (log: %r)" % drafted)
            elif "--speculate" in args and name == "bundled":   # random weights rarely repeat
                drafted = [int(m) for m in re.findall(r"speculate lookup: (\d+) drafted", log)]
                check(drafted and max(drafted) > 0,
                      what + ": requests carried drafts (log: %r)" % drafted)
            cached = [int(m) for m in re.findall(r"tokens \((\d+) cached\)", log)]
            check(cached and max(cached) >= 10,
                  what + ": a repeated or shared prefix came from the cache (%r)" % cached)
        finally:
            check(srv.stop() == 0, name + ": serve exits 0 on SIGTERM")


def check_slot_dir(shoal, tmp):
    """--slot-dir: a restarted server finds the slots' KV rows again (the
    same logits bytes, the prompt served from the cache); damaged or foreign
    files are reported and skipped."""
    model = ts.MODEL
    ref = reference(shoal, model, tmp, PROMPTS[0], 20)
    slots = tempfile.mkdtemp(dir=tmp)
    logits_dir = tempfile.mkdtemp(dir=tmp)

    def server(*extra):
        return ts.Server(shoal, "--test-logits-dir", logits_dir, "--parallel", "2",
                         "--slot-dir", slots, *extra)

    srv = server()
    same(ask(srv, logits_dir, PROMPTS[0]), ref, "--slot-dir: first server")
    check(srv.stop() == 0, "--slot-dir: the first server exits 0")
    check("slot 0: " in srv.log() and "tokens saved" in srv.log(),
          "--slot-dir: the slot is saved at stop (%r)" % srv.log()[-300:])
    path = os.path.join(slots, "slot-0.kv")
    check(os.path.exists(path), "--slot-dir: slot-0.kv written")
    srv = server()
    try:
        check(re.search(r"slot 0: \d+ tokens from --slot-dir", srv.log()),
              "--slot-dir: the restarted server loads the slot (%r)" % srv.log()[-300:])
        same(ask(srv, logits_dir, PROMPTS[0]), ref, "--slot-dir: after a restart")
        cached = [int(m) for m in re.findall(r"tokens \((\d+) cached\)", srv.log())]
        check(cached and cached[-1] >= 10,
              "--slot-dir: the prompt came from the restored cache (%r)" % cached)
    finally:
        check(srv.stop() == 0, "--slot-dir: the second server exits 0")
    with open(path, "r+b") as f:   # damage one KV byte
        f.seek(os.path.getsize(path) - 20)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    srv = server()
    try:
        check("checksum mismatch" in srv.log() and "slot 0 starts empty" in srv.log(),
              "--slot-dir: a damaged file is reported and skipped (%r)" % srv.log()[-400:])
        same(ask(srv, logits_dir, PROMPTS[0]), ref, "--slot-dir: after a damaged file")
    finally:
        check(srv.stop() == 0, "--slot-dir: the third server exits 0")
    tiny = os.path.join(tmp, "tiny", "deepseek_v3")
    srv = ts.Server(shoal, "--slot-dir", slots, "--parallel", "2", model=tiny)
    try:
        check("written for another model" in srv.log(),
              "--slot-dir: another model's file is refused (%r)" % srv.log()[-400:])
    finally:
        srv.stop()
    r = subprocess.run([shoal, "serve", "--slot-dir", os.path.join(tmp, "nope")],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "--slot-dir" in r.stderr and "writable directory" in r.stderr,
          "--slot-dir: a missing directory is a usage error (%d, %r)" % (r.returncode, r.stderr))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    import gen_tiny
    with tempfile.TemporaryDirectory() as tmp:
        check_model(shoal, "bundled", ts.MODEL, tmp)
        tiny = os.path.join(tmp, "tiny")
        gen_tiny.generate(tiny, only=["deepseek_v3", "gpt_oss"], verbose=False)
        for fam in ("deepseek_v3", "gpt_oss"):
            check_model(shoal, fam, os.path.join(tiny, fam), tmp)
        check_slot_dir(shoal, tmp)
    sys.exit(ts.result.summary("test_batching"))


if __name__ == "__main__":
    main()
