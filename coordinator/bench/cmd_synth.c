/* shoal synth: synthetic containers for benchmarks (docs/BENCHMARKS.md).
 * This file is the command: its flags, the family and its shapes scaled to
 * --gb, and what it prints; synth.h says how the rest is made and which
 * file does what.
 *
 * Thread: main.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_tools.h"
#include "cli.h"
#include "config.h"
#include "container.h"
#include "session.h"
#include "session_flags.h"
#include "synth.h"
#include "util.h"

#define DEFAULT_TRACE_FILE SHOAL_SOURCE_ROOT \
    "/../shared/data/traces/allenai-OLMoE-routing/expert_counts.json"

void synth_usage(FILE *f)
{
    fprintf(f,
        "usage: shoal synth [--out] DST --gb N [options]\n"
        "       shoal synth --check [--model] DIR [options]\n"
        "\n"
        "Writes a synthetic container (docs/FORMAT.md) with a real architecture's\n"
        "shapes, scaled in layer count to about N GB, random but well-formed weights,\n"
        "and a router whose expert frequencies follow a real routing trace\n"
        "(docs/BENCHMARKS.md). The same options give the same bytes.\n"
        "\n"
        "  --out DST, DST       the container directory to write\n"
        "  --gb N               target container size in GB (1e9 bytes), e.g. 8 or 0.005\n"
        "  --family F           qwen3_moe (default), olmoe, mixtral, qwen2_moe, or, with\n"
        "                       every key of the real config.json: deepseek_v3\n"
        "                       (DeepSeek-V3-Base), kimi_k2 (Kimi-K2-Instruct), glm4_moe\n"
        "                       (GLM-4.5-Air), deepseek_v2 (DeepSeek-V2-Lite), gpt_oss\n"
        "                       (gpt-oss-20b)\n"
        "  --config FILE        a real config.json of any supported family as the\n"
        "                       template instead (quantization_config dropped)\n"
        "  --experts T          int4 (default), int4a8, int8, bf16, f32 (not fp8)\n"
        "  --dense T            int8 (default), int4a8, int4, bf16, f32 (1-D tensors stay\n"
        "                       f32; routers stay int8 under int4/int4a8)\n"
        "  --group G            quantization group, 32, 64 (default) or 128\n"
        "  --seed S             generator seed (default 1)\n"
        "  --trace T            olmoe (default), mixtral: expert counts of a real trace\n"
        "                       (shared/data/traces); uniform; zipf (built in, --zipf S)\n"
        "  --trace-file FILE    expert_counts.json (default: ../shared/data/traces/...)\n"
        "  --domain D           trace domain or all (default: all domains summed)\n"
        "  --zipf S             exponent of --trace zipf (default 1.0)\n"
        "  --drift D            rms a MoE block adds to the residual, relative to the\n"
        "                       embedding (default 0.3; sets router lookahead accuracy)\n"
        "  --layers N           layer count (default: from --gb)\n"
        "  --n-expert N, --top-k K, --hidden N, --moe-ff N, --heads N, --kv-heads N,\n"
        "  --head-dim N, --vocab N   override the family's shapes (vocab default 32000;\n"
        "                       the real one for config families; shapes shrink\n"
        "                       automatically when --gb is too small)\n"
        "  --ff N, --q-lora N, --kv-lora N, --rope-dim N, --n-group N, --topk-group N,\n"
        "  --dense-layers N     the same for config families: dense intermediate_size,\n"
        "                       MLA ranks and qk_rope_head_dim (--head-dim sets\n"
        "                       qk_nope and v), expert groups, first_k_dense_replace\n"
        "                       (default 1 where the real config has dense layers)\n"
        "  --force              replace an existing DST (a shoal container)\n"
        "\n"
        "--check DIR: decode on a container and report finite logits, timings and\n"
        "(synthetic containers) achieved vs target expert frequencies. Takes the\n"
        "engine, store and cluster flags of 'shoal run' (listed below) and:\n"
        "  --model DIR, DIR     the container to check\n"
        "  --seed S             prompt seed (default 1)\n"
        "  --prompt-len N       random prompt tokens (default 16)\n"
        "  --warmup N           decode steps before the measured window (default 0)\n"
        "  --decode N           measured decode steps (default 32)\n"
        "  --preload            read every expert once before decoding (warm cache)\n"
        "  --keep-counts        keep DIR/routing_counts.json (default: start it afresh\n"
        "                       so it holds this run's routing)\n"
        "  --json FILE          write the results as JSON\n"
        "  --routing-out FILE   write per-layer target and achieved expert shares\n"
        "  --isa auto|scalar|avx2|avx512|avx512-zen4|avx512bw|neon|neon-dotprod|neon-i8mm\n"
        "                       use these quant kernels instead of the best this CPU\n"
        "                       has (same bits, another speed)\n"
        "  --ctx N              context length (default: what the prompt and steps need)\n"
        "  --kv f32|f16|bf16    KV cache dtype (default: the container's, else f32)\n"
        "  --batch N            prefill chunk in tokens (default 256; the same bits at any)\n"
        "  --threads N          compute threads (default: all cores)\n"
        "  -v, --verbose        print what was loaded\n"
        "\nExpert store:\n");
    shoal_session_usage_store(f);
}

int shoal_cmd_synth(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--check"))
            return synth_check_main(argc, argv);
    const char *dst = NULL, *family = "qwen3_moe", *trace = "olmoe", *domain = "all";
    const char *trace_file = DEFAULT_TRACE_FILE, *config_path = NULL;
    double gb = 0, drift = 0.3, zipf_s = 1.0;
    long long seed = 1, group = 64;
    int64_t ov_dense = -1;
    struct shape ov;
    memset(&ov, 0, sizeof ov);
    int family_given = 0;
    enum shoal_dtype ed = SHOAL_DTYPE_INT4, dd = SHOAL_DTYPE_INT8;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            synth_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--force")) {
            force = 1;
            continue;
        }
        if (a[0] != '-') {
            if (shoal_cli_take_path("synth", "output directory", a, &dst) < 0)
                return 2;
            continue;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("%s needs a value (see 'shoal synth --help')", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--out")) {
            if (shoal_cli_take_path("synth", "output directory", v, &dst) < 0)
                return 2;
            continue;
        }
        long long n;
        struct {
            const char *flag;
            int64_t *dst;
            long long lo, hi;
        } ints[] = {
            {"--layers", &ov.layers, 1, SHOAL_MAX_LAYERS},
            {"--n-expert", &ov.n_expert, 1, 4096},
            {"--top-k", &ov.top_k, 1, 64},
            {"--hidden", &ov.hidden, 16, 65536},
            {"--moe-ff", &ov.moe_ff, 8, 1 << 20},
            {"--heads", &ov.heads, 1, 1024},
            {"--kv-heads", &ov.kv_heads, 1, 1024},
            {"--head-dim", &ov.head_dim, 8, 1024},
            {"--vocab", &ov.vocab, 16, 1 << 24},
            {"--ff", &ov.ff, 8, 1 << 20},
            {"--q-lora", &ov.q_lora, 8, 1 << 16},
            {"--kv-lora", &ov.kv_lora, 8, 1 << 16},
            {"--rope-dim", &ov.rope_dim, 2, 1024},
            {"--n-group", &ov.n_group, 1, 4096},
            {"--topk-group", &ov.topk_group, 1, 4096},
            {"--dense-layers", &ov_dense, 0, SHOAL_MAX_LAYERS},
        };
        int matched = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].flag))
                continue;
            if (shoal_cli_parse_i64(a, v, ints[k].lo, ints[k].hi, &n))
                return 2;
            *ints[k].dst = n;
            matched = 1;
        }
        if (matched)
            continue;
        if (!strcmp(a, "--gb")) {
            if (shoal_cli_parse_f64(a, v, 1e-4, 1e5, &gb))
                return 2;
        } else if (!strcmp(a, "--family")) {
            family = v;
            family_given = 1;
        } else if (!strcmp(a, "--config")) {
            config_path = v;
        } else if (!strcmp(a, "--experts")) {
            if (shoal_cli_parse_dtype(a, v, &ed))
                return 2;
        } else if (!strcmp(a, "--dense")) {
            if (shoal_cli_parse_dtype(a, v, &dd))
                return 2;
        } else if (!strcmp(a, "--group")) {
            int g;
            if (shoal_cli_parse_group(a, v, &g))
                return 2;
            group = g;
        } else if (!strcmp(a, "--seed")) {
            if (shoal_cli_parse_i64(a, v, 0, INT64_MAX, &seed))
                return 2;
        } else if (!strcmp(a, "--trace")) {
            trace = v;
        } else if (!strcmp(a, "--trace-file")) {
            trace_file = v;
        } else if (!strcmp(a, "--domain")) {
            domain = v;
        } else if (!strcmp(a, "--zipf")) {
            if (shoal_cli_parse_f64(a, v, 0, 10, &zipf_s))
                return 2;
        } else if (!strcmp(a, "--drift")) {
            if (shoal_cli_parse_f64(a, v, 0, 10, &drift))
                return 2;
        } else {
            shoal_cli_error("synth: unknown option '%s' (see 'shoal synth --help')", a);
            return 2;
        }
    }
    if (!dst || gb <= 0) {
        shoal_cli_error("synth: usage: shoal synth DST --gb N [options]");
        return 2;
    }
    if (ed == SHOAL_DTYPE_FP8 || dd == SHOAL_DTYPE_FP8 || ed == SHOAL_DTYPE_MXFP4 ||
        dd == SHOAL_DTYPE_MXFP4) {
        const int fp8 = ed == SHOAL_DTYPE_FP8 || dd == SHOAL_DTYPE_FP8;
        shoal_cli_error("synth: --%s %s is not written (shoal keeps %s only from %s "
                        "checkpoints); expected int4a8, int4, int8, bf16 or f32",
                        ed == SHOAL_DTYPE_FP8 || ed == SHOAL_DTYPE_MXFP4 ? "experts" : "dense",
                        fp8 ? "fp8" : "mxfp4", fp8 ? "FP8" : "MXFP4", fp8 ? "FP8" : "MXFP4");
        return 2;
    }
    if (config_path && family_given) {
        shoal_cli_error("synth: --config and --family are exclusive (the config names its "
                        "model_type)");
        return 2;
    }
    /* the family: a built-in table row (fam), or a real config.json as the
     * template of the one written (tmpl, with tfam its descriptor) */
    const struct fam_shape *fam = NULL;
    json_t *tmpl = NULL;
    const struct shoal_family *tfam = NULL;
    const char *model_type = family;
    if (!config_path)
        fam = synth_fam_find(family);
    json_error_t jerr;
    if (config_path) {
        tmpl = json_load_file(config_path, 0, &jerr);
        if (!tmpl) {
            if (jerr.line < 0)   /* not opened or not read: no line to name */
                shoal_cli_error("synth: cannot read --config '%s': %s", config_path,
                                jerr.text);
            else
                shoal_cli_error("synth: cannot read --config '%s': %s (line %d)", config_path,
                                jerr.text, jerr.line);
            return 2;
        }
    } else if (!fam) {
        tmpl = synth_tmpl_find(family);
        if (!tmpl) {
            shoal_cli_error("--family expects %s, got '%s'", synth_family_names(), family);
            return 2;
        }
    }
    if (tmpl) {
        model_type = json_string_value(json_object_get(tmpl, "model_type"));
        tfam = model_type ? shoal_family_find(model_type) : NULL;
        if (!tfam || !json_is_integer(json_object_get(tmpl, tfam->key_n_expert))) {
            shoal_cli_error("synth: '%s': model_type %s%s%s is not a supported MoE family "
                            "(expected one of %s, with %s)", config_path ? config_path : family,
                            model_type ? "'" : "", model_type ? model_type : "missing",
                            model_type ? "'" : "", shoal_family_list(),
                            tfam ? tfam->key_n_expert : "its expert count");
            json_decref(tmpl);
            return 2;
        }
    }
    if (strcmp(trace, "olmoe") && strcmp(trace, "mixtral") && strcmp(trace, "uniform") &&
        strcmp(trace, "zipf")) {
        shoal_cli_error("--trace expects olmoe, mixtral, uniform or zipf, got '%s'", trace);
        json_decref(tmpl);
        return 2;
    }
    if (shoal_exists(dst) && !force) {
        shoal_cli_error("synth: '%s' already exists; pass --force to replace it", dst);
        json_decref(tmpl);
        return 1;
    }
    /* as convert: --force replaces a container (all its files), nothing else */
    if (shoal_exists(dst) && !shoal_container_is(dst)) {
        shoal_cli_error("synth: '%s' exists and is not a shoal container (no shoal.json); "
                        "refusing to replace it, even with --force", dst);
        json_decref(tmpl);
        return 1;
    }

    /* shapes: the family's, overridden, then shrunk until two layers (a
     * template family: its leading dense layers and one MoE layer) fit */
    struct shape sh;
    if (tmpl)
        synth_shape_of_tmpl(tmpl, tfam, &sh);
    else
        synth_shape_of_fam(fam, &sh);
    const int olmoe = !strcmp(model_type, "olmoe");
    const int mla = tfam && tfam->mla;
    const uint64_t target = (uint64_t)(gb * 1e9);
    struct shoal_err err = {0};
    struct shoal_model_config cfg;
    struct shoal_container_layout ms;
    uint64_t fixed = 0, per_layer = 0, b[2];
    for (;;) {
#define OV(f) if (ov.f) sh.f = ov.f
        OV(hidden); OV(heads); OV(kv_heads); OV(head_dim); OV(moe_ff); OV(n_expert);
        OV(top_k); OV(vocab); OV(ff); OV(q_lora); OV(kv_lora); OV(rope_dim); OV(n_group);
        OV(topk_group);
#undef OV
        if (tmpl && ov_dense >= 0)
            sh.dense_layers = ov_dense;
        if (olmoe)
            sh.head_dim = sh.hidden / sh.heads;
        if (sh.top_k > sh.n_expert)
            sh.top_k = sh.n_expert;
        if (mla)
            sh.kv_heads = sh.heads;
        if (sh.heads % sh.kv_heads)
            sh.kv_heads = sh.heads;
        /* groups divide the experts, hold at least two each (noaux_tc ranks
         * a group by its two best) and, kept, at least top-k experts */
        if (sh.n_expert % sh.n_group || sh.n_expert / sh.n_group < 2)
            sh.n_group = 1;
        if (sh.topk_group > sh.n_group || sh.n_group == 1 ||
            sh.topk_group * (sh.n_expert / sh.n_group) < sh.top_k)
            sh.topk_group = sh.n_group;
        for (int k = 0; k < 2; k++) {
            sh.layers = sh.dense_layers + k + 1;
            json_t *c = tmpl ? synth_apply_shapes(tmpl, tfam, &sh) : synth_make_config(fam, &sh);
            int rc = synth_parse_config(c, &cfg, &err);
            json_decref(c);
            if (rc) {
                shoal_cli_error("synth: %s", err.msg);
                json_decref(tmpl);
                return 2;
            }
            b[k] = synth_measure(&cfg, ed, dd, (int)group, &ms);
        }
        per_layer = b[1] - b[0];
        fixed = b[0] - per_layer;
        int any_ov = ov.hidden || ov.moe_ff || ov.vocab || ov.head_dim || ov.heads || ov.ff ||
                     ov.q_lora || ov.kv_lora || ov.rope_dim;
        if (any_ov || (tmpl ? b[0] : fixed + 2 * per_layer) <= target || sh.hidden <= 64)
            break;
        /* too small for real shapes: halve the widths */
        sh.hidden /= 2;
        sh.moe_ff /= 2;
        sh.shexp_ff /= 2;
        sh.ff /= 2;
        if (sh.q_lora > 16)
            sh.q_lora /= 2;
        if (sh.kv_lora > 16)
            sh.kv_lora /= 2;
        if (sh.rope_dim > 16)
            sh.rope_dim /= 2;
        if (sh.head_dim > 32 && !olmoe)
            sh.head_dim /= 2;
        else if (sh.heads > 2)
            sh.heads /= 2;
        if (sh.kv_heads > sh.heads)
            sh.kv_heads = sh.heads;
        if (sh.vocab > 4096)
            sh.vocab = 4096;
    }
    if (ov.layers) {
        sh.layers = ov.layers;
        if (sh.dense_layers >= sh.layers)
            sh.dense_layers = sh.layers - 1;
    } else {
        double nl = target > fixed ? (double)(target - fixed) / (double)per_layer : 1.0;
        int64_t n_moe = (int64_t)(nl + 0.5);
        if (n_moe < 1)
            n_moe = 1;
        sh.layers = sh.dense_layers + n_moe;
        if (sh.layers > SHOAL_MAX_LAYERS)
            sh.layers = SHOAL_MAX_LAYERS;
    }

    struct synth sy;
    memset(&sy, 0, sizeof sy);
    sy.sh = sh;
    sy.experts_dtype = ed;
    sy.dense_dtype = dd;
    sy.group = (int)group;
    sy.seed = (uint64_t)seed;
    sy.drift = drift;
    sy.domain = domain;
    sy.tty = isatty(2);
    sy.err = &err;
    sy.fd_dense = sy.fd_exp = -1;
    sy.config = tmpl ? synth_apply_shapes(tmpl, tfam, &sh) : synth_make_config(fam, &sh);
    json_decref(tmpl);
    tmpl = NULL;
    if (tfam) /* the template's string is gone: the copy's */
        model_type = json_string_value(json_object_get(sy.config, "model_type"));
    if (synth_parse_config(sy.config, &sy.cfg, &err)) {
        shoal_cli_error("synth: %s", err.msg);
        json_decref(sy.config);
        return 2;
    }
    sy.c0 = sy.cfg.n_embd - 1;
    sy.C = sqrt((double)(sy.cfg.n_embd - 1));
    sy.total = synth_measure(&sy.cfg, ed, dd, sy.group, &sy.lay);

    double t_plan = shoal_time_s();
    int rc = synth_plan_routing(&sy, trace, trace_file, domain, zipf_s);
    t_plan = shoal_time_s() - t_plan;
    if (rc) {
        shoal_cli_error("synth: %s", err.msg);
        synth_free(&sy);
        return 1;
    }
    fprintf(stderr, "shoal: synth %s: %s, %lld layers, %lld experts top-%lld, hidden %lld, "
            "moe_ff %lld, heads %lld/%lld x %lld, vocab %lld; experts %s, dense %s; "
            "%.2f GB (blob %" PRIu64 " bytes)\n", dst, model_type,
            (long long)sh.layers, (long long)sh.n_expert, (long long)sy.cfg.n_expert_used,
            (long long)sh.hidden, (long long)sh.moe_ff, (long long)sy.cfg.n_head,
            (long long)sy.cfg.n_head_kv, (long long)sy.cfg.head_dim, (long long)sh.vocab,
            shoal_dtype_name(ed), shoal_dtype_name(dd), (double)sy.total / 1e9,
            sy.lay.blob_bytes);
    fprintf(stderr, "shoal: synth routing: trace %s (%s), router calibrated in %.2f s "
            "(Monte Carlo, %d tokens):", trace, domain, t_plan, MC_TOKENS);
    for (int i = 0; i < sy.trace.n_src; i++) {
        /* the trace's layer is the traced model's (OLMoE has 16), not this
         * one's: name both, and which of this model's layers follow it */
        int64_t lo = -1, hi = -1;
        for (int64_t il = 0; il < sy.cfg.n_layer; il++)
            if (shoal_layer_is_moe(&sy.cfg, il) && sy.layer_src[il] == sy.trace.src_layer[i]) {
                lo = lo < 0 ? il : lo;
                hi = il;
            }
        fprintf(stderr, "%s %s ", i ? ";" : "", trace);
        if (sy.trace.src_n_layer)
            fprintf(stderr, "layer %d of %d ", sy.trace.src_layer[i], sy.trace.src_n_layer);
        if (lo < 0)
            fprintf(stderr, "(no layer here)");
        else if (lo == hi)
            fprintf(stderr, "(this model's layer %lld)", (long long)lo);
        else
            fprintf(stderr, "(this model's layers %lld-%lld)", (long long)lo, (long long)hi);
        fprintf(stderr, " worst inclusion error %.1f%%", 100 * sy.calib_err[i]);
    }
    if (sy.n_layer_fits)
        fprintf(stderr, "; group-limited router: refitted for each of %d MoE layers' expert "
                "permutation, worst inclusion error %.1f%%", sy.n_layer_fits,
                100 * sy.layer_err);
    fprintf(stderr, "\n");

    rc = synth_write(&sy, dst, force, argc, argv);
    synth_free(&sy);
    return rc;
}
