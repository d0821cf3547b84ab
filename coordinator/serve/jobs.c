/* jobs: a generating request of `shoal serve` as the HTTP side and the
 * batcher share it (see jobs.h). */
#include "jobs.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

void job_queue_push(struct job_queue *q, struct job *j)
{
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    q->n++;
}

struct job *job_queue_pop(struct job_queue *q)
{
    struct job *j = q->head;
    if (!j)
        return NULL;
    q->head = j->next;
    if (!q->head)
        q->tail = NULL;
    q->n--;
    j->next = NULL;
    return j;
}

void serve_job_unref(pthread_mutex_t *mu, struct job *j)
{
    pthread_mutex_lock(mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(mu);
    if (!last)
        return;
    shoal_api_request_free(&j->req);
    free(j->out);
    free(j->text);
    free(j->reply);
    serve_logprobs_free(j->lp, j->n_lp);
    free(j);
}

void serve_out_put(struct job *j, const char *p, size_t n)
{
    /* a client that reads nothing while its request generates: beyond
     * SERVE_MAX_UNSENT bytes queued (after what the sockets hold) the
     * request is cancelled, so its queue and its slot are bounded */
    if (j->out_len - j->out_sent > SERVE_MAX_UNSENT)
        j->cancel = 1;
    if (j->out_len + n > j->out_cap) {
        j->out_cap = (j->out_len + n) * 2 + 256;
        j->out = shoal_xrealloc(j->out, j->out_cap);
    }
    memcpy(j->out + j->out_len, p, n);
    j->out_len += n;
}

void serve_out_event(struct job *j, char *json)
{
    serve_out_put(j, "data: ", 6);
    serve_out_put(j, json, strlen(json));
    serve_out_put(j, "\n\n", 2);
    free(json);
}

void serve_logprobs_free(struct shoal_api_token_logprob *lp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < lp[i].n_top; k++)
            free((char *)lp[i].top[k].text);
        free((void *)lp[i].top);
        free((char *)lp[i].text);
    }
    free(lp);
}
