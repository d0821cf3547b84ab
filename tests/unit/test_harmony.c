/* The harmony reply parser and what shoal chat shows of a reply
 * (coordinator/text/harmony.c), on token sequences as gpt-oss emits them
 * after the generation prompt "<|start|>assistant". */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harmony.h"

/* o200k_harmony's ids (openai/harmony public_encodings.rs) */
enum { START = 200006, CHANNEL = 200005, MESSAGE = 200008, END = 200007,
       RETURN = 200002, CALL = 200012, CONSTRAIN = 200003, TEXT = 1000 };

static const struct shoal_harmony_ids IDS = {START, CHANNEL, MESSAGE, END, RETURN, CALL,
                                             CONSTRAIN};

/* A script: markers as their ids; any other entry is the text of a token. */
struct step {
    int32_t id;
    const char *text;
};

struct run {
    enum shoal_harmony_event last;
    char *shown;
    struct shoal_harmony h;
};

static struct run play(const struct step *steps, size_t n, int show_reasoning, int color)
{
    struct run r;
    size_t len = 0;
    FILE *out = open_memstream(&r.shown, &len);
    cr_assert(out);
    shoal_harmony_init(&r.h, &IDS);
    r.last = SHOAL_HARMONY_EV_NONE;
    for (size_t i = 0; i < n; i++) {
        const char *t = steps[i].text ? steps[i].text : "";
        r.last = shoal_harmony_feed(&r.h, steps[i].id, t, strlen(t));
        shoal_harmony_show(&r.h, r.last, t, strlen(t), show_reasoning, color, out);
    }
    fclose(out);
    return r;
}

static void done(struct run *r)
{
    shoal_harmony_free(&r->h);
    free(r->shown);
}

#define N(a) (sizeof(a) / sizeof((a)[0]))
#define T(s) {TEXT, s}

static const struct step FINAL_ONLY[] = {
    {CHANNEL, NULL}, T("final"), {MESSAGE, NULL}, T("Hello"), T(", world"), {RETURN, NULL}};

static const struct step ANALYSIS_FINAL[] = {
    {CHANNEL, NULL}, T("analysis"), {MESSAGE, NULL}, T("User asks 2+2."), T(" Easy."),
    {END, NULL}, {START, NULL}, T("assistant"), {CHANNEL, NULL}, T("fin"), T("al"),
    {MESSAGE, NULL}, T("4"), {RETURN, NULL}};

Test(harmony, final_only)
{
    struct run r = play(FINAL_ONLY, N(FINAL_ONLY), 0, 0);
    cr_assert_eq(r.last, SHOAL_HARMONY_EV_RETURN);
    cr_assert_str_eq(r.shown, "Hello, world");
    cr_assert_str_eq(r.h.final, "Hello, world");
    cr_assert_null(r.h.analysis);
    done(&r);
}

Test(harmony, analysis_hidden_then_final)
{
    struct run r = play(ANALYSIS_FINAL, N(ANALYSIS_FINAL), 0, 0);
    cr_assert_eq(r.last, SHOAL_HARMONY_EV_RETURN);
    cr_assert_str_eq(r.shown, "4");
    cr_assert_str_eq(r.h.final, "4");
    cr_assert_str_eq(r.h.analysis, "User asks 2+2. Easy.");
    cr_assert_eq(r.h.channel, SHOAL_HARMONY_FINAL);
    done(&r);
}

Test(harmony, show_reasoning_marks_the_analysis)
{
    struct run r = play(ANALYSIS_FINAL, N(ANALYSIS_FINAL), 1, 0);
    cr_assert_str_eq(r.shown, "[analysis] User asks 2+2. Easy.\n4");
    done(&r);
    r = play(ANALYSIS_FINAL, N(ANALYSIS_FINAL), 1, 1);
    cr_assert_str_eq(r.shown, "\x1b[2m[analysis] User asks 2+2. Easy.\x1b[0m\n4");
    done(&r);
}

Test(harmony, tool_call_ends_with_call)
{
    /* as the model writes it: recipient after the channel, a constraint */
    static const struct step s[] = {
        {CHANNEL, NULL}, T("analysis"), {MESSAGE, NULL}, T("Need weather."), {END, NULL},
        {START, NULL}, T("assistant"), {CHANNEL, NULL}, T("commentary"), T(" t"),
        T("o=functions"), T(".get_weather"), T(" "), {CONSTRAIN, NULL}, T("json"),
        {MESSAGE, NULL}, T("{\"city\":"), T("\"Paris\"}"), {CALL, NULL}};
    struct run r = play(s, N(s), 0, 0);
    cr_assert_eq(r.last, SHOAL_HARMONY_EV_CALL);
    cr_assert_str_eq(r.h.recipient, "functions.get_weather");
    cr_assert_str_eq(r.h.call_args, "{\"city\":\"Paris\"}");
    cr_assert_eq(r.h.channel, SHOAL_HARMONY_COMMENTARY);
    cr_assert_str_eq(r.shown, "[tool call to functions.get_weather: {\"city\":\"Paris\"}]");
    cr_assert_null(r.h.final);
    done(&r);
    /* as the chat template renders it: recipient before the channel */
    static const struct step t[] = {
        {START, NULL}, T("assistant to=functions.f"), {CHANNEL, NULL},
        T("commentary json"), {MESSAGE, NULL}, T("{}"), {CALL, NULL}};
    r = play(t, N(t), 1, 0);
    cr_assert_eq(r.last, SHOAL_HARMONY_EV_CALL);
    cr_assert_str_eq(r.h.recipient, "functions.f");
    cr_assert_str_eq(r.shown, "[tool call to functions.f: {}]");
    done(&r);
}

Test(harmony, preamble_and_final_each_on_a_line)
{
    static const struct step s[] = {
        {CHANNEL, NULL}, T("commentary"), {MESSAGE, NULL}, T("Let me think."), {END, NULL},
        {START, NULL}, T("assistant"), {CHANNEL, NULL}, T("analysis"), {MESSAGE, NULL},
        T("hmm"), {END, NULL}, {START, NULL}, T("assistant"), {CHANNEL, NULL}, T("final"),
        {MESSAGE, NULL}, T("Done."), {RETURN, NULL}};
    struct run r = play(s, N(s), 0, 0);
    cr_assert_str_eq(r.shown, "Let me think.\nDone.");
    cr_assert_str_eq(r.h.final, "Done.");
    done(&r);
    r = play(s, N(s), 1, 0);
    cr_assert_str_eq(r.shown, "Let me think.\n[analysis] hmm\nDone.");
    done(&r);
}

Test(harmony, held_back_text_and_unknown_channel)
{
    /* id -1 is text even though absent markers are -1 too */
    struct shoal_harmony_ids ids = IDS;
    ids.constrain = -1;
    struct shoal_harmony h;
    shoal_harmony_init(&h, &ids);
    cr_assert_eq(shoal_harmony_feed(&h, CHANNEL, "", 0), SHOAL_HARMONY_EV_NONE);
    shoal_harmony_feed(&h, TEXT, "final", 5);
    cr_assert_eq(shoal_harmony_feed(&h, MESSAGE, "", 0), SHOAL_HARMONY_EV_BEGIN);
    cr_assert_eq(shoal_harmony_feed(&h, -1, "\xef\xbf\xbd", 3), SHOAL_HARMONY_EV_TEXT);
    cr_assert_str_eq(h.final, "\xef\xbf\xbd");
    /* an <|end|> outside a body ends nothing */
    cr_assert_eq(shoal_harmony_feed(&h, END, "", 0), SHOAL_HARMONY_EV_END);
    cr_assert_eq(shoal_harmony_feed(&h, END, "", 0), SHOAL_HARMONY_EV_NONE);
    /* nor does a <|call|> (no message, no call); <|return|> still ends */
    cr_assert_eq(shoal_harmony_feed(&h, CALL, "", 0), SHOAL_HARMONY_EV_NONE);
    cr_assert_eq(shoal_harmony_feed(&h, RETURN, "", 0), SHOAL_HARMONY_EV_RETURN);
    shoal_harmony_free(&h);
    static const struct step s[] = {
        {CHANNEL, NULL}, T("secret"), {MESSAGE, NULL}, T("x"), {END, NULL},
        {START, NULL}, T("assistant"), {CHANNEL, NULL}, T("final"), {MESSAGE, NULL},
        T("y"), {RETURN, NULL}};
    struct run r = play(s, N(s), 0, 0);
    cr_assert_str_eq(r.shown, "y");
    cr_assert_eq(r.h.channel, SHOAL_HARMONY_FINAL);
    done(&r);
}
