#!/usr/bin/env python3
"""The tokenizers of DeepSeek-V3/R1, GLM-4.5, Kimi-K2 (issue 14) and gpt-oss
(issue 16) against an
independent reference of our own, id for id.

The real vocabularies are too big for the tree, so each family is rebuilt
around a small byte-level BPE trained here (deterministically) on a slice of
../shared/data/corpus plus the test strings; what is the family's own is its
pre-tokenization, which the fixtures carry verbatim:

- DeepSeek-V3: tokenizer.json with DeepSeek-V3's pre_tokenizer section (three
  Split regexes: digits in groups of 1-3, CJK runs, then the word/punctuation
  pattern; ByteLevel without regex), as published in deepseek-ai/DeepSeek-V3
  tokenizer.json (quoted verbatim, e.g., in llama.cpp's
  convert_hf_to_gguf_update.py history and several tokenizer ports);
- GLM-4.5: tokenizer.json whose pre_tokenizer is the cl100k-style Split regex
  + ByteLevel(use_regex=false) that llama.cpp maps GLM-4.5 to (tokenizer.ggml.pre
  "glm4" for zai-org/GLM-4.5-Air, llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_CHATGLM4);
- Kimi-K2: a directory with tiktoken.model (base64 token, rank) and a
  tokenizer_config.json whose added_tokens_decoder is Kimi-K2-Instruct's
  (tests/unit/fixtures/kimi-k2-instruct.tokenizer_config.json) moved to the
  toy vocabulary's special range; the split pattern is tokenization_kimi.py's
  pat_str, used here as published (class intersections and all, through the
  `regex` module's VERSION1 sets).

- gpt-oss: tokenizer.json with o200k_harmony's pre_tokenizer (one Split
  with the o200k pattern, then ByteLevel(use_regex=false)) and the model's
  special-token table (tests/unit/fixtures/gpt-oss-20b.tokenizer_config.json)
  at the real ids 199998..200018, checked against openai/harmony's list;
  eight more strings aim at where o200k's classes and PCRE2 could part (case
  runs, Lt/Lm letters, combining marks, contractions in any case and with
  U+017F, the '/' tail, U+180E/U+0085 against \s) and a harmony conversation
  whose markers must be single ids.

The reference: pre-tokenization with the `regex` module (python3-regex), then
HF BPE (lowest merge rank among adjacent symbols) or tiktoken's
_byte_pair_merge (a piece that is a token stays whole; else merge the
adjacent pair whose concatenation has the lowest rank), written here from the
algorithms' descriptions. `shoal tokenize` must print the same ids; bad
tiktoken.model files must give one error line naming the file and line.

Usage: /usr/bin/python3 tests/reference/test_tokenizer_moe.py --shoal BIN
"""
import argparse
import base64
import collections
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import regex
except ImportError:  # pragma: no cover
    regex = None

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
sys.path.insert(0, HERE)
import gen_tiny  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures")
CORPUS = H.shared("data", "corpus", "tinyshakespeare.txt")


result = H.Results()


# --- the families' pre-tokenizers (verbatim) --------------------------------

DEEPSEEK_V3_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"},
     "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex": "[一-龥\u3040-ゟ゠-ヿ]+"},
     "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex":
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
        "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
     "use_regex": False}]}

GLM45_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex":
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
        "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
     "use_regex": False}]}

# tokenization_kimi.py, TikTokenTokenizer.pat_str (moonshotai/Kimi-K2-Instruct)
KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

# gpt-oss (openai/gpt-oss-20b, -120b): o200k_harmony's split pattern, as
# openai/harmony src/tiktoken_ext/public_encodings.rs (Encoding::O200kHarmony,
# @55dc322) joins it and as the model's tokenizer.json carries it in its one
# Split pre-tokenizer (llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O:
# "original regex from tokenizer.json"; onnxruntime-extensions PR 1059: GPT-OSS
# is Sequence[Split, ByteLevel]).
O200K_PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

GPT_OSS_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": O200K_PAT},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
     "use_regex": False}]}

# Strings where o200k's rules and the engines can part: case runs (HTTPServer,
# camelCase), title case (U+01C5) and modifier letters (Lm), combining marks
# inside words (Devanagari, Thai, Hebrew points), contractions in every case
# and with U+017F (long s folds to s under (?i)), '/' in the punctuation
# run's tail, superscript and Roman-numeral numbers, and the characters where
# PCRE2's \s (\p{Z}, \h, \v) differs from White_Space (U+180E, U+0085).
GPT_OSS_TEXTS = [
    "HTTPServer camelCaseWord McDonald's XMLHttpRequest ABCdef abcDEF",
    "it's IT'S They'RE we'Ll I'M you'Ve he'D it'\u017f don't' 'tis",
    "\u01c5emal \u01c8ubljana \u02b0aspirated x\u02b0 \u3005\u3005",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0e17\u0e35\u0e48 "
    "\u05e2\u05b4\u05d1\u05b0\u05e8\u05b4\u05d9\u05ea",
    "a/b /usr/bin/ ok!/\n//\n\nx ?/\r\n end",
    "x\u00b2\u00b3 \u216b \u00bd 12345678 007",
    "sep\u180eword a\u0085b c\u2028d e\u200bf \ufeffg x \u180e\u180e y\u180e \n\u180e\u180e",
    "\U0001F600\U0001F600 \U0001F44D\U0001F3FD! \u2764\ufe0f\u200d\U0001F525",
]

TEXTS = [
    "Hello, world! It's 2025; don't WE'LL they'RE",
    "1 12 123 1234 12345 1234567 3.14159 ١٢٣٤ ①②",
    "你好，世界。我们在2024年发布了模型！",
    "日本語のテキスト、カタカナ・ひらがな。漢字かな混じり文",
    "한국어 텍스트와 English 섞기",
    "   leading spaces\tand\ttabs   \n\n\n  trailing   ",
    "line one\r\nline two\n\n\nline five\n",
    "emoji 👍🏽🎉 family 👨‍👩‍👧 flags 🇫🇷🇯🇵!",
    "Grüße aus Köln — Ελληνικά русский العربية हिन्दी ไทย",
    "e\u0301 n\u0303 combining a\u0308\u0301 marks",
    "ＡＢＣ１２３ fullwidth！？",
    "code: def f(x):\n    return x**2 + 1  # ok\n\t}",
    "((()))[[[]]]{{{}}} ... !!! ??? --- ___ ''' \"\"\"",
    "$100.00 @user #tag 50% a&b <tag/> C++ e-mail x_y",
    "混合mixed文本text with数字123和標點、。",
    "qqzz qqzz",
    "\u3000ideographic\u3000space and\u00a0nbsp",
    "'s 'S 'll start's",
    "",
]


# --- a toy byte-level BPE ------------------------------------------------------

def train_bpe(text, n_merges):
    """Merges (pairs of byte strings) learned on text cut only at whitespace,
    so merges cross letter / digit / punctuation / script boundaries and a
    different pre-tokenization gives different ids; deterministic (ties
    broken by the bytes)."""
    words = collections.Counter(w.encode() for w in regex.findall(r"\s?\S+|\s+", text))
    seqs = {w: [bytes([b]) for b in w] for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, s in seqs.items():
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (gen_tiny's)."""
    bs, cs = gen_tiny.bytes_to_unicode()
    return dict(zip(bs, cs))


# --- references ------------------------------------------------------------------

def hf_split(pieces, pattern):
    """HF Split, behavior Isolated: matches and the gaps between them."""
    out = []
    for p in pieces:
        last = 0
        for m in regex.finditer(pattern, p):
            if m.start() > last:
                out.append(p[last:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            last = m.end()
        if last < len(p):
            out.append(p[last:])
    return out


def hf_bpe(piece, ranks, vocab):
    """HF BPE on the bytes of one piece: merge the adjacent pair with the
    lowest merge rank (leftmost first) until none applies."""
    syms = [bytes([b]) for b in piece.encode()]
    while len(syms) > 1:
        best = None
        for i in range(len(syms) - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    return [vocab[s] for s in syms]


def hf_encode(text, pre, ranks, vocab):
    pieces = [text] if text else []
    for p in pre["pretokenizers"]:
        if p["type"] == "Split":
            pieces = hf_split(pieces, p["pattern"]["Regex"])
    return [i for p in pieces for i in hf_bpe(p, ranks, vocab)]


def tiktoken_merge(piece, ranks):
    """tiktoken's _byte_pair_merge: parts start as single bytes; merge the
    adjacent pair whose concatenation has the lowest rank (leftmost)."""
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]


def kimi_encode(text, ranks, added=None):
    """Added tokens split out first (as transformers does), then tiktoken:
    regex pieces; a piece that is a token stays whole."""
    out = []
    chunks = [text]
    if added:
        alt = "(" + "|".join(regex.escape(a) for a in sorted(added, key=len, reverse=True)) + ")"
        chunks = regex.split(alt, text)
    for k, chunk in enumerate(chunks):
        if added and k % 2 == 1:
            out.append(added[chunk])
            continue
        for m in regex.finditer("(?V1)" + KIMI_PAT, chunk):
            b = m.group().encode()
            out.extend([ranks[b]] if b in ranks else tiktoken_merge(b, ranks))
    return out


# --- fixtures ---------------------------------------------------------------------

def build(tmp):
    with open(CORPUS, encoding="utf-8") as f:
        corpus = f.read()[:40000]
    # "qqzz" stays out of the training text: Kimi's vocabulary gets it as a
    # token that no merge reaches
    train = corpus + "\n".join(t for t in TEXTS if "qqzz" not in t) * 3
    # gpt-oss's strings weigh more, so that merges reach across the places
    # where o200k's alternatives cut them (a wrong cut then changes the ids)
    train += "\n".join(GPT_OSS_TEXTS) * 40
    merges = train_bpe(train, 1000)
    tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in merges]
    # dedupe (a merge can rebuild an existing token) keeping the first
    seen, uniq = set(), []
    for t in tokens:
        if t not in seen:
            seen.add(t)
            uniq.append(t)
    tokens = uniq

    # HF tokenizer.json families: ids in token order, merges in training order
    b2u = bytes_to_unicode()
    enc = lambda bs: "".join(b2u[b] for b in bs)  # noqa: E731
    hf_vocab = {enc(t): i for i, t in enumerate(tokens)}
    vocab_by_bytes = {t: i for i, t in enumerate(tokens)}
    ranks = {}
    merge_strs = []
    for a, b in merges:
        if (a, b) not in ranks:
            ranks[(a, b)] = len(merge_strs)
            merge_strs.append(enc(a) + " " + enc(b))
    fams = {}
    for name, pre, specials in (
            ("deepseek-v3", DEEPSEEK_V3_PRE, ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                             "<｜User｜>", "<｜Assistant｜>"]),
            ("glm-4.5", GLM45_PRE, ["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>",
                                    "<|assistant|>", "<think>", "</think>"])):
        added = [{"id": len(tokens) + k, "content": s, "single_word": False,
                  "lstrip": False, "rstrip": False, "normalized": False,
                  "special": True} for k, s in enumerate(specials)]
        tj = {"version": "1.0", "truncation": None, "padding": None,
              "added_tokens": added,
              "normalizer": {"type": "Sequence", "normalizers": []}
              if name == "deepseek-v3" else None,
              "pre_tokenizer": pre, "post_processor": None,
              "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                          "trim_offsets": True, "use_regex": True},
              "model": {"type": "BPE", "dropout": None, "unk_token": None,
                        "continuing_subword_prefix": None, "end_of_word_suffix": None,
                        "fuse_unk": False, "byte_fallback": False,
                        "vocab": hf_vocab, "merges": merge_strs}}
        d = os.path.join(tmp, name)
        os.makedirs(d)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        fams[name] = (d, pre, {s: a["id"] for s, a in zip(specials, added)})

    # gpt-oss: the toy vocabulary at ids 0.., the model's own special-token
    # table (tokenizer_config.json added_tokens_decoder) at its real ids
    # 199998..200018, so the ids shoal prints are the model's
    with open(os.path.join(FIXTURES, "gpt-oss-20b.tokenizer_config.json")) as f:
        gcfg = json.load(f)
    gadded = [dict(v, id=int(k)) for k, v in gcfg["added_tokens_decoder"].items()]
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": gadded, "normalizer": None,
          "pre_tokenizer": GPT_OSS_PRE, "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                      "trim_offsets": True, "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None,
                    "continuing_subword_prefix": None, "end_of_word_suffix": None,
                    "fuse_unk": False, "byte_fallback": False,
                    "vocab": hf_vocab, "merges": merge_strs}}
    d = os.path.join(tmp, "gpt-oss")
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    fams["gpt-oss"] = (d, GPT_OSS_PRE, {a["content"]: a["id"] for a in gadded})

    # Kimi: ranks shuffled for the single bytes (rank order need not be byte
    # order), then the merged tokens; "qqzz" is a token no merge reaches
    rng = random.Random(14)
    single = [bytes([b]) for b in range(256)]
    rng.shuffle(single)
    kimi_tokens = single + [t for t in tokens if len(t) > 1] + [b"qqzz"]
    assert len(set(kimi_tokens)) == len(kimi_tokens)
    kimi_ranks = {t: i for i, t in enumerate(kimi_tokens)}
    n = len(kimi_tokens)
    with open(os.path.join(FIXTURES, "kimi-k2-instruct.tokenizer_config.json")) as f:
        cfg = json.load(f)
    base = 163584  # Kimi-K2's own number of ranks
    cfg["added_tokens_decoder"] = {str(int(k) - base + n): v
                                   for k, v in cfg["added_tokens_decoder"].items()}
    kd = os.path.join(tmp, "kimi-k2")
    os.makedirs(kd)
    with open(os.path.join(kd, "tiktoken.model"), "w") as f:
        for t, r in kimi_ranks.items():
            f.write("%s %d\n" % (base64.b64encode(t).decode(), r))
    with open(os.path.join(kd, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False)
    added = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
    return fams, vocab_by_bytes, ranks, (kd, kimi_ranks, added, n)


def shoal_ids(shoal, model, text, *flags):
    p = subprocess.run([shoal, "tokenize", "--model", model, "--no-bos", "--text", text]
                       + list(flags), capture_output=True, timeout=60)
    if p.returncode != 0:
        return None, p.stderr.decode()
    return [int(x) for x in p.stdout.split()], ""


def check_hf(shoal, fams, vocab, ranks):
    for name, (d, pre, specials) in fams.items():
        for i, text in enumerate(TEXTS):
            want = hf_encode(text, pre, ranks, vocab)
            got, err = shoal_ids(shoal, d, text)
            result("%s text %d" % (name, i), got == want,
                   "%r\n  shoal:     %s %s\n  reference: %s" % (text, got, err, want))
        # special tokens in the text: with --parse-special they become ids
        sp = list(specials)
        text = sp[0] + "Hi" + sp[-1] + " 12345"
        want = [specials[sp[0]]] + hf_encode("Hi", pre, ranks, vocab) + [specials[sp[-1]]] + \
            hf_encode(" 12345", pre, ranks, vocab)
        got, err = shoal_ids(shoal, d, text, "--parse-special")
        result("%s special tokens parsed" % name, got == want,
               "%r: shoal %s %s; reference %s" % (text, got, err, want))


# The harmony special tokens and their ids, from openai/harmony
# src/tiktoken_ext/public_encodings.rs (O200kHarmony special_tokens, @55dc322);
# the model's tokenizer_config.json must agree, and shoal must map each name
# to that id (eos <|return|> 200002 as in generation_config.json).
HARMONY_SPECIALS = {
    "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
    "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006,
    "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012,
    "<|reserved_200000|>": 200000, "<|reserved_200013|>": 200013,
}


def check_gpt_oss(shoal, fams, vocab, ranks):
    d, pre, specials = fams["gpt-oss"]
    for name, i in HARMONY_SPECIALS.items():
        result("gpt-oss tokenizer_config: %s is %d (openai/harmony)" % (name, i),
               specials.get(name) == i, "config says %s" % specials.get(name))
    for i, text in enumerate(GPT_OSS_TEXTS):
        want = hf_encode(text, pre, ranks, vocab)
        got, err = shoal_ids(shoal, d, text)
        result("gpt-oss o200k text %d" % i, got == want,
               "%r\n  shoal:     %s %s\n  reference: %s" % (text, got, err, want))
    # a harmony conversation as the chat template writes it: every marker is
    # one id, the text between them goes through the o200k split
    parts = ["<|start|>", "system", "<|message|>", "Reasoning: high\n\n",
             "<|end|>", "<|start|>", "user", "<|message|>", "What's 2+2? I'M sure/\n",
             "<|end|>", "<|start|>", "assistant", "<|channel|>", "analysis",
             "<|message|>", "Simple.", "<|end|>", "<|start|>", "assistant",
             "<|channel|>", "commentary to=functions.f ", "<|constrain|>", "json",
             "<|message|>", '{"x": 1}', "<|call|>", "<|return|>", "<|endoftext|>"]
    want = []
    for p in parts:
        want += [HARMONY_SPECIALS[p]] if p in HARMONY_SPECIALS else hf_encode(p, pre, ranks, vocab)
    got, err = shoal_ids(shoal, d, "".join(parts), "--parse-special")
    result("gpt-oss harmony markers are single ids", got == want,
           "shoal %s %s\n  reference %s" % (got, err, want))
    # without --parse-special the markers are text
    got, err = shoal_ids(shoal, d, "<|channel|>final")
    result("gpt-oss markers not parsed without --parse-special",
           got == hf_encode("<|channel|>final", pre, ranks, vocab), "%s %s" % (got, err))
    ids = [HARMONY_SPECIALS["<|channel|>"]] + hf_encode("final", pre, ranks, vocab) + \
        [HARMONY_SPECIALS["<|message|>"]] + hf_encode(GPT_OSS_TEXTS[1], pre, ranks, vocab)
    p = subprocess.run([shoal, "detokenize", "--model", d, "--special", "--ids",
                        " ".join(map(str, ids))], capture_output=True, timeout=60)
    result("gpt-oss decode round trip (--special)", p.returncode == 0 and
           p.stdout.decode().rstrip("\n") == "<|channel|>final<|message|>" + GPT_OSS_TEXTS[1],
           "rc=%d out=%r" % (p.returncode, p.stdout))


def check_kimi(shoal, kimi):
    kd, kranks, added, n = kimi
    for i, text in enumerate(TEXTS):
        want = kimi_encode(text, kranks)
        got, err = shoal_ids(shoal, kd, text)
        result("kimi-k2 text %d" % i, got == want,
               "%r\n  shoal:     %s %s\n  reference: %s" % (text, got, err, want))
    got, _ = shoal_ids(shoal, kd, "qqzz")
    result("kimi-k2: a piece that is a token stays whole (no merge reaches it)",
           got == [kranks[b"qqzz"]], "got %s" % got)
    text = "<|im_user|>user<|im_middle|>Hi 你好<|im_end|><|tool_call_begin|>x"
    want = kimi_encode(text, kranks, added)
    got, err = shoal_ids(shoal, kd, text, "--parse-special")
    result("kimi-k2 special tokens from added_tokens_decoder", got == want,
           "%r\n  shoal:     %s %s\n  reference: %s" % (text, got, err, want))
    # a non-special added token (<|tool_call_begin|>, special: false) is
    # matched without --parse-special; the special ones are not
    text = "a<|tool_call_begin|>b<|im_end|>"
    nonspecial = {k: v for k, v in added.items() if k == "<|tool_call_begin|>"}
    want = kimi_encode(text, kranks, nonspecial)
    got, err = shoal_ids(shoal, kd, text)
    result("kimi-k2 non-special added token always matched", got == want,
           "shoal %s %s; reference %s" % (got, err, want))
    # reserved names fill the ids the config leaves out; ids = ranks + 258
    name = "<|reserved_token_%d|>" % (n + 5)
    got, err = shoal_ids(shoal, kd, "x" + name, "--parse-special")
    result("kimi-k2 reserved special name", got == kimi_encode("x", kranks) + [n + 5],
           "%s: %s %s" % (name, got, err))
    got, err = shoal_ids(shoal, kd, name)
    result("kimi-k2 reserved special not parsed without --parse-special",
           got == kimi_encode(name, kranks), "%s %s" % (got, err))
    p = subprocess.run([shoal, "detokenize", "--model", kd, "--ids",
                        " ".join(map(str, kimi_encode(TEXTS[7] + TEXTS[2], kranks)))],
                       capture_output=True, timeout=60)
    result("kimi-k2 decode round trip", p.returncode == 0 and
           p.stdout.decode().rstrip("\n") == TEXTS[7] + TEXTS[2],
           "rc=%d out=%r" % (p.returncode, p.stdout))


def check_bad_tiktoken(shoal, kimi, tmp):
    kd = kimi[0]
    with open(os.path.join(kd, "tiktoken.model")) as f:
        good = f.read().splitlines()
    cases = [
        ("bad base64", 3, good[:2] + ["!!notb64 2"] + good[3:]),
        ("missing rank", 5, good[:4] + [good[4].split()[0]] + good[5:]),
        ("rank not a number", 2, good[:1] + [good[1].split()[0] + " 1x"] + good[2:]),
        ("duplicate rank", 7, good[:6] + [good[6].split()[0] + " 0"] + good[7:]),
        ("rank out of range", 4, good[:3] + [good[3].split()[0] + " 99999999"] + good[4:]),
        ("duplicate token", 9, good[:8] + [good[0].split()[0] + " 8"] + good[9:]),
        ("padding inside", 1, [good[0].split()[0][:1] + "=" + good[0].split()[0][2:] + " 0"] +
         good[1:]),
    ]
    for label, line, lines in cases:
        d = os.path.join(tmp, "bad-" + label.replace(" ", "-"))
        os.makedirs(d)
        path = os.path.join(d, "tiktoken.model")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        p = subprocess.run([shoal, "tokenize", "--model", d, "--text", "hi"],
                           capture_output=True, timeout=60)
        err = p.stderr.decode()
        result("bad tiktoken.model (%s): one error line naming file and line %d" % (label, line),
               p.returncode == 1 and err.count("\n") == 1 and path in err and
               ("line %d" % line) in err, "rc=%d err=%r" % (p.returncode, err))
    d = os.path.join(tmp, "bad-config")
    os.makedirs(d)
    with open(os.path.join(d, "tiktoken.model"), "w") as f:
        f.write("\n".join(good) + "\n")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"added_tokens_decoder": {"3": {"content": "<x>", "special": True}}}, f)
    p = subprocess.run([shoal, "tokenize", "--model", d, "--text", "hi"],
                       capture_output=True, timeout=60)
    err = p.stderr.decode()
    result("tokenizer_config added token inside the ranks refused",
           p.returncode == 1 and err.count("\n") == 1 and "'3'" in err, "err=%r" % err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    args = ap.parse_args()
    if regex is None:
        print("SKIP test_tokenizer_moe: python3-regex is not installed (apt-get install python3-regex)")
        return 0
    if not os.path.exists(CORPUS):
        print("SKIP test_tokenizer_moe: %s not found (../shared/data)" % CORPUS)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fams, vocab, ranks, kimi = build(tmp)
        check_hf(args.shoal, fams, vocab, ranks)
        check_gpt_oss(args.shoal, fams, vocab, ranks)
        check_kimi(args.shoal, kimi)
        check_bad_tiktoken(args.shoal, kimi, tmp)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
