#!/usr/bin/env python3
"""The source tree's layers, checked from its #include lines.

Every source folder has a rank (LAYERS below, lowest first); a file may
include headers of its own folder and of folders of a lower rank only.
Folders of one rank (the coordinator's text/ and engine/ parts, say) must
not include each other in a circle. Fails, naming the file, the line and
both folders, on:
  - an include of a header in a folder of a higher rank;
  - a circle between folders (A includes B's headers and B includes A's);
  - a header name found in two folders (the include would be ambiguous);
  - a folder in the tree that LAYERS does not name (a new folder gets a
    rank here, with a line on what it holds).
Headers outside the tree (system, libraries, generated) are ignored.

usage: tests/check_layers.py [--root DIR] [--graph]
"""
import argparse
import os
import re
import sys

# (folder, rank, what it holds), lowest first. A folder may include its
# own headers and those of lower ranks.
LAYERS = [
    ("proto", 0, "the wire protocol's schema (protobuf-c, generated code)"),
    ("common/base", 1, "errors, logging, allocation, parsing, OpenMP settings"),
    ("common/kernels", 2, "tensors, quantized matmul and KV kernels: the scalar reference"),
    ("common/kernels/isa", 3, "one file per ISA (AVX2, AVX-512, NEON): the reference's bits"),
    ("common/format", 4, "safetensors, configs, the model, the shoal container"),
    ("common/store", 5, "the expert store: I/O engines, cache, pins, placement, expert FFN"),
    ("common/net", 6, "the wire protocol: frames, handshake, limits, addresses"),
    ("coordinator/text", 7, "tokenizers, Unicode, chat templates, GGUF vocabularies"),
    ("coordinator/engine", 8, "the forward pass, sampling, the session"),
    ("coordinator/cluster", 9, "expert workers: connections, placement, failover"),
    ("coordinator/serve", 10, "the OpenAI-compatible HTTP API and its batcher"),
    ("coordinator/cli", 11, "the shoal commands: flags, output"),
    ("coordinator/bench", 11.5, "shoal bench and shoal synth: probes, synthetic containers"),
    ("coordinator", 12, "main()"),
    ("worker", 10, "shoal-worker: serves experts over the wire"),
    ("bench", 12, "benchmarks"),
    ("tests/unit", 13, "unit tests"),
    ("tests/unit/fixtures", 13, "unit test fixtures"),
    ("tests/cluster", 13, "wire probe"),
    ("tests/fuzz", 13, "fuzz targets"),
    ("tests/cross/criterion-shim", 13, "Criterion's API for the aarch64 cross build"),
    ("tests/cross/criterion-shim/include/criterion", 13, "(the shim's headers)"),
    ("tests/cross/criterion-shim/include/criterion/new", 13, "(the shim's headers)"),
]
SKIP_DIRS = {".git", "node_modules", "models", "docs", "deploy", ".ci"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def source_dirs(root):
    for d, subdirs, files in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if s not in SKIP_DIRS and
                            not s.startswith("build"))
        srcs = sorted(f for f in files if f.endswith((".c", ".h")))
        if srcs:
            yield os.path.relpath(d, root), srcs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    ap.add_argument("--graph", action="store_true", help="print the folder graph")
    a = ap.parse_args()
    rank = {f: r for f, r, _ in LAYERS}
    dirs = dict(source_dirs(a.root))
    errors = []
    home = {}   # header name -> folder
    for d, files in dirs.items():
        if d not in rank:
            errors.append("%s: a source folder tests/check_layers.py does not rank "
                          "(add it to LAYERS)" % d)
        for f in files:
            if f.endswith(".h"):
                if f in home:
                    errors.append("%s is in both %s and %s: includes of it are ambiguous" %
                                  (f, home[f], d))
                home[f] = d
    edges = {}   # (from folder, to folder) -> first "file:line"
    for d, files in dirs.items():
        for f in files:
            path = os.path.join(a.root, d, f)
            with open(path, errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    name = os.path.basename(m.group(1))
                    to = home.get(name)
                    if to is None or to == d:
                        continue
                    where = "%s:%d" % (os.path.join(d, f), n)
                    edges.setdefault((d, to), where)
                    if d in rank and to in rank and rank[to] > rank[d]:
                        errors.append("%s includes \"%s\" of %s (rank %g) from %s (rank %g): "
                                      "a lower layer includes a higher one" %
                                      (where, m.group(1), to, rank[to], d, rank[d]))
    for (x, y), where in sorted(edges.items()):
        if x < y and (y, x) in edges:
            errors.append("a circle between %s and %s: %s includes %s's headers, %s "
                          "includes %s's" % (x, y, where, y, edges[(y, x)], x))
    if a.graph:
        for (x, y), where in sorted(edges.items()):
            print("%s -> %s (%s)" % (x, y, where))
    for e in errors:
        print("check_layers: " + e)
    print("check_layers: %d folders, %d folder edges, %d problems" %
          (len(dirs), len(edges), len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
