"""Plots of a bench/sweep (PNG, matplotlib's Agg backend; Debian's
python3-matplotlib).

  decode tok/s against the x key (cache size, else workers, else the first
  numeric key), one line per setting of the other keys, bars from the
  slowest to the fastest repeat;
  hit rate against the same x;
  the decode time per token of every configuration as stacked bars;
  every configuration's ratios to the machine's limits.

plot_all(grid, aggs, outdir) -> [png paths]; aggs as bench/sweep's
aggregate() makes them (one dict per configuration).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import benchlib as bl  # noqa: E402

STAGE_LABELS = {"ms_attention": "attention", "ms_routing": "routing",
                "ms_expert_wait": "waiting on experts (SSD)", "ms_expert_compute": "expert compute",
                "ms_network": "network", "ms_combine": "combine", "ms_head": "head (lm_head)",
                "ms_other": "other (sampling, ...)"}
MARKERS = "osD^v<>ph*"
STYLES = ["-", "--", "-.", ":"]


def x_key(grid):
    keys = [k for k, v in grid if len(v) > 1]
    for k in ("cache", "expert_cache", "workers", "pin", "qd", "threads"):
        if k in keys:
            return k
    for k in keys:
        if all(bl.sort_value(k, v) is not None for v in dict(grid)[k]):
            return k
    return None


def series_of(grid, aggs, xk):
    """{label: [(x, agg)]} over the keys other than xk that vary."""
    others = [k for k, v in grid if len(v) > 1 and k != xk]
    out = {}
    for g in aggs:
        label = " ".join("%s=%s" % (k, g[k]) for k in others) or "all"
        out.setdefault(label, []).append((bl.sort_value(xk, g[xk]), g))
    for v in out.values():
        v.sort(key=lambda p: p[0])
    return out


def _x_axis(ax, grid, xk, xs):
    """Sizes on a log2 axis labelled 256M/1G/...; 'unlimited' drawn past the
    largest size."""
    finite = sorted(x for x in xs if x != float("inf"))
    if xk in bl.SIZE_KEYS and finite and finite[0] > 0:
        ax.set_xscale("log", base=2)
    ticks = sorted(set(xs))
    labels = []
    for t in ticks:
        if t == float("inf"):
            labels.append("unlimited")
        elif xk in bl.SIZE_KEYS:
            labels.append(bl.fmt_size(int(t)))
        else:
            labels.append("%g" % t)
    return ticks, labels


def _place(xk, x, xs):
    if x == float("inf"):
        finite = [v for v in xs if v != float("inf")]
        return (max(finite) * 2) if finite else 1.0
    return x


def line_plot(grid, aggs, xk, fig_key, ylabel, title, path, scale=1.0):
    ser = series_of(grid, aggs, xk)
    allx = [p[0] for v in ser.values() for p in v]
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    for i, (label, pts) in enumerate(sorted(ser.items())):
        xs = [_place(xk, x, allx) for x, g in pts if g[fig_key] is not None]
        ys = [scale * g[fig_key] for x, g in pts if g[fig_key] is not None]
        lo = [scale * (g[fig_key] - (g.get(fig_key + "_min") or g[fig_key]))
              for x, g in pts if g[fig_key] is not None]
        hi = [scale * ((g.get(fig_key + "_max") or g[fig_key]) - g[fig_key])
              for x, g in pts if g[fig_key] is not None]
        if not xs:
            continue
        ax.errorbar(xs, ys, yerr=[lo, hi], marker=MARKERS[i % len(MARKERS)],
                    linestyle=STYLES[(i // 10) % len(STYLES)], capsize=4, linewidth=1.8,
                    markersize=7, label=label)
    ticks, labels = _x_axis(ax, grid, xk, allx)
    ax.set_xticks([_place(xk, t, allx) for t in ticks])
    ax.set_xticklabels(labels)
    ax.minorticks_off()
    ax.set_xlabel({"cache": "expert cache (--expert-cache)", "workers": "workers"}.get(xk, xk))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _order(aggs, grid):
    keys = [k for k, _ in grid]
    return sorted(aggs, key=lambda g: [(bl.sort_value(k, g[k]) if bl.sort_value(k, g[k]) is not None
                                        else 0, str(g[k])) for k in keys])


def _short(g, grid):
    return " ".join("%s=%s" % (k, g[k]) for k, v in grid if len(v) > 1) or g["config"]


def breakdown_plot(grid, aggs, path):
    rows = [g for g in _order(aggs, grid) if g.get("ms_per_token") is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.8), dpi=110)
    left = [0.0] * len(rows)
    colors = plt.get_cmap("tab10").colors
    y = list(range(len(rows)))
    for i, s in enumerate(bl.STAGES):
        w = [max(0.0, g.get(s) or 0.0) for g in rows]
        if not any(w):
            continue
        ax.barh(y, w, left=left, color=colors[i % 10], label=STAGE_LABELS[s], height=0.7)
        left = [a + b for a, b in zip(left, w)]
    ax.set_yticks(y)
    ax.set_yticklabels([_short(g, grid) for g in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("decode time per token, ms (median over repeats)")
    ax.set_title("Where decode time goes")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9, frameon=False)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def ratio_plot(grid, aggs, path):
    rows = [g for g in _order(aggs, grid)]
    kinds = [("ratio_read_vs_ssd", "expert reads / fio (SSD)"),
             ("ratio_compute_vs_ram", "expert compute / RAM read"),
             ("ratio_wire_vs_link", "wire / link")]
    kinds = [k for k in kinds if any(g.get(k[0]) is not None for g in rows)]
    if not kinds or not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) * len(kinds) / 1.5 + 1.8), dpi=110)
    h = 0.8 / len(kinds)
    colors = plt.get_cmap("tab10").colors
    for j, (k, label) in enumerate(kinds):
        ys = [i + (j - (len(kinds) - 1) / 2) * h for i in range(len(rows))]
        ax.barh(ys, [g.get(k) or 0.0 for g in rows], height=h, color=colors[j + 3], label=label)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_short(g, grid) for g in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the limit measured in the same sweep (1 = at the limit)")
    ax.set_title("Figures as a fraction of the machine's limits")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_all(grid, aggs, outdir):
    os.makedirs(outdir, exist_ok=True)
    out = []
    xk = x_key(grid)
    if xk:
        out.append(line_plot(grid, aggs, xk, "decode_tok_s", "decode tok/s (median; bars: "
                             "slowest and fastest repeat)", "Decode speed against %s" % xk,
                             os.path.join(outdir, "decode_tok_s_vs_%s.png" % xk)))
        if any(g.get("hit_rate_total") is not None for g in aggs):
            out.append(line_plot(grid, aggs, xk, "hit_rate_total", "expert hit rate, % of "
                                 "acquires served from RAM (every executor)", "Hit rate against %s" % xk,
                                 os.path.join(outdir, "hit_rate_vs_%s.png" % xk), scale=100))
    p = breakdown_plot(grid, aggs, os.path.join(outdir, "time_per_token.png"))
    if p:
        out.append(p)
    p = ratio_plot(grid, aggs, os.path.join(outdir, "ratios.png"))
    if p:
        out.append(p)
    return out
