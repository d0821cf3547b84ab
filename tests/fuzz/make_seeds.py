#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets under tests/fuzz/corpus/ from
real files, cut small (the wire targets' seeds come from make_wire_seeds).

  tokenizer_hf   the bundled model's tokenizer.json (byte-level BPE) and,
                 when ../shared/data is there, Mixtral's (SentencePiece BPE,
                 byte fallback) and OLMoE's (GPT-NeoX), each cut to its first
                 600 ids and the merges among them, NUL, a text to encode
                 (and once NUL and the bundled tokenizer_config.json)
  gguf_vocab     llama.cpp's ggml-vocab-{llama-spm,gpt-2}.gguf (shared data)
                 cut the same way, then "\\0TEXT:" and a text
  gguf           small GGUF files with tensors of several ggml types (F32,
                 Q8_0, Q4_K, Q6_K, IQ2_XXS, IQ1_S, MXFP4) and random bytes
  ggml_blocks    the random blocks of tests/data/gguf's vectors (every
                 quantized type's, the first 1 KiB), after a case byte
  safetensors    the bundled model.safetensors with only its small tensors
                 (norms, router) and their real bytes; a misaligned F32 and
                 an I64 tensor beside metadata
  model_config   tests/reference/configs/*.json and the bundled config.json
  chat_template  tests/unit/fixtures/*.jinja with a conversation, and the
                 templates of bugs found (TEMPLATE_REGRESSIONS)
  container      shoal.json of the bundled model converted (int4 experts,
                 int8 dense) and of one of its two shards (--shoal SHOAL)

Usage: make_seeds.py [--shoal build-fuzz/coordinator/shoal]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, '..', '..'))
SHARED = os.path.normpath(os.path.join(ROOT, '..', 'shared', 'data'))
CORPUS = os.path.join(HERE, 'corpus')
MODEL = os.path.join(ROOT, 'models', 'shakespeare-moe')
KEEP = 600

# chat templates that once went wrong, kept as seeds (name, source)
TEMPLATE_REGRESSIONS = [
    # repeat() copied from an empty list's NULL items (UBSan, issue 28)
    ('repeat-empty-list', b"{{ 3 * [] }}|{{ [] * 3 }}|{{ ([] * 2) | length }}"),
    ('repeat-zero-times', b"{{ [1] * 0 }}|{{ 'ab' * 0 }}|{{ '' * 3 }}|{{ [1, 2] * -1 }}"),
]

TEXTS = [
    b"First Citizen:\nBefore we proceed any further, hear me speak.\n",
    b"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Caf\u00e9 \u00fcber na\u00efve \u2014 \u65e5\u672c\u8a9e 123 456789 \U0001f600\t\r\n".encode(),
    b"  leading and trailing spaces  \xff\xfe invalid utf-8 \xc3",
]


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def cut_tokenizer(path):
    t = json.load(open(path, encoding='utf-8'))
    m = t['model']
    vocab = {k: v for k, v in m['vocab'].items() if v < KEEP}
    merges = []
    for mg in m['merges']:
        a, b = mg.split(' ', 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m['vocab'] = vocab
    m['merges'] = merges
    nxt = KEEP
    added = []
    for tok in t.get('added_tokens') or []:
        if tok['id'] >= KEEP:
            tok['id'] = nxt
            nxt += 1
        added.append(tok)
    t['added_tokens'] = added[:8]
    pp = t.get('post_processor')
    if isinstance(pp, dict) and pp.get('type') == 'TemplateProcessing':
        for st in pp.get('special_tokens', {}).values():
            st['ids'] = [i if i < KEEP else KEEP for i in st['ids']]
    return json.dumps(t, ensure_ascii=False, separators=(',', ':')).encode()


# ---- GGUF (v2/v3) ----
SCALAR = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q',
          12: 'd'}


def gguf_read(b):
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from('<' + fmt, b, pos)
        pos += struct.calcsize('<' + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take('Q')
        s = b[pos:pos + n]
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take('I')
            n = take('Q')
            return (et, [value(et) for _ in range(n)])
        return take(SCALAR[t])

    assert b[:4] == b'GGUF'
    pos = 4
    version = take('I')
    n_tensors = take('Q')
    n_kv = take('Q')
    kv = []
    for _ in range(n_kv):
        k = string()
        t = take('I')
        kv.append((k, t, value(t)))
    return version, n_tensors, kv


def gguf_write(version, kv):
    out = bytearray(b'GGUF')

    def put_str(s):
        out.extend(struct.pack('<Q', len(s)))
        out.extend(s)

    def put(t, v):
        if t == 8:
            put_str(v)
        elif t == 9:
            et, items = v
            out.extend(struct.pack('<IQ', et, len(items)))
            for x in items:
                put(et, x)
        else:
            out.extend(struct.pack('<' + SCALAR[t], v))

    out.extend(struct.pack('<IQQ', version, 0, len(kv)))
    for k, t, v in kv:
        put_str(k)
        out.extend(struct.pack('<I', t))
        put(t, v)
    return bytes(out)


def gguf_with_tensors(align):
    """A GGUF with an architecture key and one small tensor per type:
    (name, ggml type, block size, bytes per block, dims)."""
    import random
    rnd = random.Random(align)
    tensors = [('token_embd.weight', 0, 1, 4, [32, 2]),
               ('blk.0.attn_q.weight', 8, 32, 34, [64, 2]),
               ('blk.0.ffn_gate_exps.weight', 12, 256, 144, [256, 1, 2]),
               ('blk.0.ffn_down_shexp.weight', 14, 256, 210, [256, 1]),
               ('blk.0.ffn_up_exps.weight', 16, 256, 66, [256, 1, 2]),
               ('blk.1.ffn_down_exps.weight', 19, 256, 50, [256, 1, 2]),
               ('blk.1.ffn_gate_exps.weight', 39, 32, 17, [64, 1, 2])]
    kv = [(b'general.architecture', 8, b'qwen3moe'), (b'general.alignment', 4, align)]
    out = bytearray(gguf_write(3, kv))
    struct.pack_into('<Q', out, 8, len(tensors))
    off, data = 0, bytearray()
    for name, t, bs, ts, dims in tensors:
        n = 1
        for d in dims:
            n *= d
        nbytes = n // bs * ts
        out.extend(struct.pack('<Q', len(name)) + name.encode() + struct.pack('<I', len(dims)))
        out.extend(struct.pack('<%dQ' % len(dims), *dims) + struct.pack('<IQ', t, off))
        blob = bytearray(rnd.getrandbits(8) for _ in range(nbytes))
        data.extend(blob + b'\0' * (-nbytes % align))
        off += nbytes + (-nbytes % align)
    out.extend(b'\0' * (-len(out) % align))
    return bytes(out + data)


def cut_gguf(path):
    version, _, kv = gguf_read(open(path, 'rb').read())
    toks = None
    for k, t, v in kv:
        if k == b'tokenizer.ggml.tokens':
            toks = set(v[1][:KEEP])
    res = []
    for k, t, v in kv:
        if not k.startswith(b'tokenizer.') and not k.startswith(b'general.'):
            continue
        if k == b'tokenizer.ggml.merges':
            keep = []
            for mg in v[1]:
                a, _, b2 = mg.partition(b' ')
                if a in toks and b2 in toks and a + b2 in toks:
                    keep.append(mg)
            v = (v[0], keep)
        elif t == 9 and k in (b'tokenizer.ggml.tokens', b'tokenizer.ggml.scores',
                              b'tokenizer.ggml.token_type'):
            v = (v[0], v[1][:KEEP])
        elif k.endswith(b'_token_id') and v >= KEEP:
            v = KEEP - 1
        res.append((k, t, v))
    return gguf_write(version, res)


def safetensors_file(tensors, meta=None, pad=0):
    """tensors: [(name, dtype, shape, bytes)]"""
    hdr = {}
    if meta:
        hdr['__metadata__'] = meta
    data = bytearray(b'\0' * pad)
    for name, dt, shape, raw in tensors:
        hdr[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
        data.extend(raw)
    h = json.dumps(hdr, separators=(',', ':')).encode()
    return struct.pack('<Q', len(h)) + h + bytes(data)


# the block size in bytes of each type tests/data/gguf has vectors of
GGML_BLOCK_BYTES = {'q4_0': 18, 'q4_1': 20, 'q5_0': 22, 'q5_1': 24, 'q8_0': 34, 'q2_k': 84,
                    'q3_k': 110, 'q4_k': 144, 'q5_k': 176, 'q6_k': 210, 'iq4_nl': 18,
                    'iq4_xs': 136, 'mxfp4': 17, 'iq2_xxs': 66, 'iq2_xs': 74, 'iq2_s': 82,
                    'iq3_xxs': 98, 'iq3_s': 110, 'iq1_s': 50, 'iq1_m': 56}


def ggml_block_seeds():
    """ggml_blocks: real blocks (finite scales) of each type, case bytes 0
    (one token), 0x25 (three, a larger scale) and 0x41 (a NaN activation)"""
    data = os.path.join(ROOT, 'tests', 'data', 'gguf')
    for i, (name, size) in enumerate(GGML_BLOCK_BYTES.items()):
        blocks = open(os.path.join(data, name + '.bin'), 'rb').read()
        n = min(1024 // size, 4 if size > 40 else 32) * size
        case = (0x00, 0x25, 0x41)[i % 3]
        write('ggml_blocks', name, bytes([case]) + blocks[:n])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--shoal', help='a shoal binary, for the container seeds')
    args = ap.parse_args()

    # tokenizer_hf
    toks = [('bundled', os.path.join(MODEL, 'tokenizer.json')),
            ('mixtral', os.path.join(SHARED, 'tokenizers', 'Mixtral-8x7B-v0.1.tokenizer.json')),
            ('olmoe', os.path.join(SHARED, 'tokenizers',
                                   'OLMoE_gpt-neox-olmo-dolma-v1_5.tokenizer.json'))]
    for name, path in toks:
        if not os.path.exists(path):
            print(f'make_seeds: {path} is missing; {name} seeds skipped', file=sys.stderr)
            continue
        j = cut_tokenizer(path)
        for i, text in enumerate(TEXTS[:2] if name != 'bundled' else TEXTS):
            write('tokenizer_hf', f'{name}-{i}', j + b'\0' + text)
        if name == 'bundled':   # with its tokenizer_config.json as a third part
            cfg = open(os.path.join(MODEL, 'tokenizer_config.json'), 'rb').read()
            write('tokenizer_hf', 'bundled-config', j + b'\0' + TEXTS[1] + b'\0' + cfg)

    # gguf_vocab
    for name in ('llama-spm', 'gpt-2'):
        path = os.path.join(SHARED, 'tokenizers', 'llama.cpp', f'ggml-vocab-{name}.gguf')
        if not os.path.exists(path):
            print(f'make_seeds: {path} is missing; skipped', file=sys.stderr)
            continue
        g = cut_gguf(path)
        for i, text in enumerate(TEXTS[:2]):
            write('gguf_vocab', f'{name}-{i}', g + b'\0TEXT:' + text)

    # gguf: tensors of several types, random data, 32- and 64-byte alignment
    for align in (32, 64):
        write('gguf', f'tensors-{align}', gguf_with_tensors(align))

    ggml_block_seeds()

    # safetensors
    b = open(os.path.join(MODEL, 'model.safetensors'), 'rb').read()
    n = struct.unpack_from('<Q', b)[0]
    hdr = json.loads(b[8:8 + n])
    small = []
    for k, v in hdr.items():
        if k == '__metadata__':
            continue
        nb = v['data_offsets'][1] - v['data_offsets'][0]
        if nb <= 4096 and len(small) < 12:
            o = 8 + n + v['data_offsets'][0]
            small.append((k, v['dtype'], v['shape'], b[o:o + nb]))
    write('safetensors', 'bundled-small', safetensors_file(small, hdr.get('__metadata__')))
    f32 = struct.pack('<6f', 1.0, -2.5, 3.25, 0.0, 1e-3, 65504.0)
    write('safetensors', 'misaligned-f32',
          safetensors_file([('a.weight', 'F32', [2, 3], f32),
                            ('b.ids', 'I64', [2], struct.pack('<2q', 7, -1)),
                            ('c.bias', 'F16', [1], b'\x00\x3c')], {'format': 'pt'}, pad=2))
    write('safetensors', 'empty-tensors', safetensors_file([('x', 'BF16', [0, 4], b'')]))

    # model_config
    cfgdir = os.path.join(ROOT, 'tests', 'reference', 'configs')
    for f in sorted(os.listdir(cfgdir)):
        if f.endswith('.json'):
            shutil.copy(os.path.join(cfgdir, f), os.path.join(CORPUS, 'model_config', f))
    shutil.copy(os.path.join(MODEL, 'config.json'),
                os.path.join(CORPUS, 'model_config', 'shakespeare-moe.json'))

    # chat_template
    fx = os.path.join(ROOT, 'tests', 'unit', 'fixtures')
    conv = (b'\0ssYou are terse.\0uHello\0aHi! How can I help?\0uWrite a haiku.\0g'
            b'\0j{"enable_thinking": false}')
    for f in sorted(os.listdir(fx)):
        if f.endswith('.jinja'):
            src = open(os.path.join(fx, f), 'rb').read()
            write('chat_template', f[:-6], src + conv)
            write('chat_template', f[:-6] + '-default', src)
    for name, src in TEMPLATE_REGRESSIONS:
        write('chat_template', name, src)

    # container
    if args.shoal:
        with tempfile.TemporaryDirectory() as tmp:
            full = os.path.join(tmp, 'full')
            env = dict(os.environ, ASAN_OPTIONS='detect_leaks=0')
            subprocess.run([args.shoal, 'convert', MODEL, full, '--experts', 'int4',
                            '--dense', 'int8'], check=True, env=env, stdout=subprocess.DEVNULL)
            subprocess.run([args.shoal, 'shard', '--model', full, '--shards', '2', '--out',
                            os.path.join(tmp, 'shards')], check=True, env=env,
                           stdout=subprocess.DEVNULL)
            shutil.copy(os.path.join(full, 'shoal.json'),
                        os.path.join(CORPUS, 'container', 'full.json'))
            shutil.copy(os.path.join(tmp, 'shards', 'worker-0', 'shoal.json'),
                        os.path.join(CORPUS, 'container', 'shard-0-of-2.json'))


if __name__ == '__main__':
    main()
