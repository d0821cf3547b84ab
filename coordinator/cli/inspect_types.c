/* shoal inspect DIR: the dtypes of a container per tensor group, each ggml
 * type by its name, as 'shoal inspect FILE.gguf' prints a GGUF's (a
 * container converted from one keeps them: docs/FORMAT.md "GGML tensors").
 * A layer's w_gate, w_up and w_down count as one tensor each, as a GGUF's
 * stacked ffn_*_exps do. Thread: main. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "container.h"
#include "ggml_types.h"

enum group { G_EMBED, G_ATTN, G_ROUTER, G_EXPS, G_SHEXP, G_FFN, G_NORM, G_OUTPUT, G_OTHER,
             G_COUNT };
static const char *const group_names[G_COUNT] = {
    "token_embd", "attention", "router", "routed experts", "shared experts", "dense ffn",
    "norms", "output", "other"};

/* The group of a canonical dense tensor name (docs/FORMAT.md). */
static enum group classify(const char *name)
{
    if (!strcmp(name, "tok_embd"))
        return G_EMBED;
    if (!strcmp(name, "lm_head"))
        return G_OUTPUT;
    if (strstr(name, "norm"))
        return G_NORM;
    if (strstr(name, ".shexp"))
        return G_SHEXP;
    if (strstr(name, ".router"))
        return G_ROUTER;
    if (strstr(name, ".ffn."))
        return G_FFN;
    if (strstr(name, ".attn_"))
        return G_ATTN;
    return G_OTHER;
}

/* A tensor's type as inspect names it: its ggml type, else its dtype. */
static const char *type_name(enum shoal_dtype t, uint32_t ggml_type)
{
    return t == SHOAL_DTYPE_GGML ? shoal_ggml_type_name(ggml_type) : shoal_dtype_name(t);
}

#define MAX_TYPES 16

struct tally {
    const char *name[MAX_TYPES];   /* static strings */
    int n[MAX_TYPES];
    int n_types;
};

static void count(struct tally *t, const char *name)
{
    for (int i = 0; i < t->n_types; i++)
        if (!strcmp(t->name[i], name)) {
            t->n[i]++;
            return;
        }
    if (t->n_types < MAX_TYPES) {
        t->name[t->n_types] = name;
        t->n[t->n_types++] = 1;
    }
}

void shoal_cli_print_types(const struct shoal_container *ct)
{
    struct tally g[G_COUNT];
    memset(g, 0, sizeof g);
    for (size_t i = 0; i < ct->n_dense; i++)
        count(&g[classify(ct->dense[i].name)],
              type_name(ct->dense[i].w.dtype, ct->dense[i].w.ggml_type));
    for (int64_t il = 0; il < ct->n_layer; il++) {
        if (ct->layer_offset[il] == UINT64_MAX)
            continue;
        const struct shoal_expert_component *k = ct->layer_layout ? ct->layer_layout[il].comp
                                                                  : ct->comp;
        for (int c = 0; c < (ct->n_comp ? ct->n_comp : 3); c++)
            count(&g[G_EXPS], type_name(k[c].dtype, k[c].ggml_type));
    }
    printf("types        per tensor group (a layer's expert w_gate, w_up, w_down: one each):\n");
    for (int i = 0; i < G_COUNT; i++) {
        if (!g[i].n_types)
            continue;
        printf("  %-26s", group_names[i]);
        for (int j = 0; j < g[i].n_types; j++)
            printf("%s%s x%d", j ? ", " : " ", g[i].name[j], g[i].n[j]);
        printf("\n");
    }
}
