/* wire_unpack: unpacking a frame under a memory budget, and validating
 * every field of a request or reply (see wire.h and docs/PROTOCOL.md). */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "wire_impl.h"

/* ---- unpacking under a memory budget ---- */

uint32_t shoal_wire_msg_max_bytes(Shoal__Frame__MsgCase msg)
{
    switch (msg) {
    case SHOAL__FRAME__MSG_HELLO: return 256;
    case SHOAL__FRAME__MSG_AUTH:
    case SHOAL__FRAME__MSG_READY: return SHOAL_WIRE_HANDSHAKE_MAX_FRAME;
    case SHOAL__FRAME__MSG_STATUS_REQUEST: return 64;
    case SHOAL__FRAME__MSG_STATUS: return SHOAL_WIRE_HANDSHAKE_MAX_FRAME + 512;
    case SHOAL__FRAME__MSG_CLUSTER: return 256u << 10;
    case SHOAL__FRAME__MSG_ERROR: return 4096;
    default: return 0;   /* request, response, hint, heartbeat: the frame limit */
    }
}

size_t shoal_wire_unpack_budget(size_t len)
{
    return SHOAL_WIRE_UNPACK_FACTOR * len + SHOAL_WIRE_UNPACK_SLACK;
}

struct unpack_budget {
    size_t left;   /* bytes still allowed */
    size_t used;   /* bytes charged so far */
    int refused;   /* an allocation went over */
};

/* Charge each allocation what malloc spends on it (a header, 16-byte
 * granules, 32 bytes at least), so that many tiny allocations cannot hide
 * under a byte count. Frees are not credited: the budget bounds every byte
 * the unpack ever held at once. */
static void *budget_alloc(void *data, size_t size)
{
    struct unpack_budget *b = data;
    size_t charge = size > SIZE_MAX - 32 ? SIZE_MAX : (size + 16 + 15) & ~(size_t)15;
    if (charge < 32)
        charge = 32;
    if (charge > b->left) {
        b->refused = 1;
        return NULL;
    }
    void *p = malloc(size ? size : 1);
    if (p) {
        b->left -= charge;
        b->used += charge;
    }
    return p;
}

static void budget_free(void *data, void *p)
{
    (void)data;
    free(p);
}

/* Read a varint of at most 10 bytes at *pos (< len). Returns 0 or -1. */
static int scan_varint(const uint8_t *d, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < 10 && *pos < len; i++) {
        uint8_t b = d[(*pos)++];
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Is the whole body exactly one length-delimited field of the Frame
 * oneof? Reads only the first tag and length (*hdr gets their size),
 * allocates nothing. */
static int check_envelope(const uint8_t *data, size_t len, Shoal__Frame__MsgCase *msg,
                          size_t *hdr, struct shoal_err *err)
{
    size_t pos = 0;
    uint64_t tag = 0, n = 0;
    if (scan_varint(data, len, &pos, &tag) < 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "frame of %zu bytes does not start with a "
                             "protobuf field tag", len);
    const uint64_t field = tag >> 3;
    const unsigned wire_type = (unsigned)(tag & 7);
    if (field < SHOAL__FRAME__MSG_HELLO || field > SHOAL__FRAME__MSG_ERROR || wire_type != 2)
        return shoal_err_set(err, SHOAL_EFORMAT, "frame of %zu bytes starts with field %llu "
                             "(wire type %u), expected one message, field 1..%d", len,
                             (unsigned long long)field, wire_type, SHOAL__FRAME__MSG_ERROR);
    if (scan_varint(data, len, &pos, &n) < 0 || n != len - pos)
        return shoal_err_set(err, SHOAL_EFORMAT, "frame of %zu bytes: its message (field "
                             "%llu) does not span the frame exactly (length %llu after a "
                             "%zu-byte header); one message per frame",
                             len, (unsigned long long)field, (unsigned long long)n, pos);
    *msg = (Shoal__Frame__MsgCase)field;
    *hdr = pos;
    return 0;
}

/* Walk the fields of one message of type d in data[0, len) without
 * allocating: every field number must be one d knows, and a field of
 * message type is walked the same way (depth-limited). So a frame with
 * unknown fields at any depth is refused before protobuf-c copies them. */
static int scan_fields(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                       int depth, struct shoal_err *err)
{
    size_t pos = 0;
    while (pos < len) {
        uint64_t tag = 0, v = 0;
        if (scan_varint(data, len, &pos, &tag) < 0 || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX)
            return shoal_err_set(err, SHOAL_EFORMAT, "%s: bad field tag at byte %zu",
                                 d->short_name, pos);
        const uint32_t field = (uint32_t)(tag >> 3);
        const unsigned wt = (unsigned)(tag & 7);
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(d, field);
        if (!fd)
            return shoal_err_set(err, SHOAL_EFORMAT, "%s carries unknown field %u",
                                 d->short_name, field);
        size_t skip = 0;
        switch (wt) {
        case 0:
            if (scan_varint(data, len, &pos, &v) < 0)
                return shoal_err_set(err, SHOAL_EFORMAT, "%s field %u: bad varint",
                                     d->short_name, field);
            break;
        case 1: skip = 8; break;
        case 5: skip = 4; break;
        case 2:
            if (scan_varint(data, len, &pos, &v) < 0 || v > len - pos)
                return shoal_err_set(err, SHOAL_EFORMAT, "%s field %u: length past the end",
                                     d->short_name, field);
            skip = (size_t)v;
            if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
                if (depth >= 8)
                    return shoal_err_set(err, SHOAL_EFORMAT, "%s: messages nested too deep",
                                         d->short_name);
                int rc = scan_fields(fd->descriptor, data + pos, skip, depth + 1, err);
                if (rc < 0)
                    return rc;
            }
            break;
        default:
            return shoal_err_set(err, SHOAL_EFORMAT, "%s field %u: wire type %u is not used "
                                 "by shoal", d->short_name, field, wt);
        }
        if (skip > len - pos)
            return shoal_err_set(err, SHOAL_EFORMAT, "%s field %u: past the end",
                                 d->short_name, field);
        pos += skip;
    }
    return 0;
}

Shoal__Frame *shoal_wire_unpack_bounded(const uint8_t *data, size_t len, size_t budget,
                                        size_t *used, struct shoal_err *err)
{
    if (used)
        *used = 0;
    Shoal__Frame__MsgCase msg = SHOAL__FRAME__MSG__NOT_SET;
    size_t hdr = 0;
    if (check_envelope(data, len, &msg, &hdr, err) < 0)
        return NULL;
    const uint32_t max = shoal_wire_msg_max_bytes(msg);
    if (max && len > max) {
        Shoal__Frame probe = SHOAL__FRAME__INIT;
        probe.msg_case = msg;
        shoal_err_set(err, SHOAL_ERANGE, "%s frame of %zu bytes, expected at most %u",
                      shoal_wire_frame_name(&probe), len, max);
        return NULL;
    }
    /* the message inside: known fields only, at every depth */
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&shoal__frame__descriptor, (unsigned)msg);
    if (scan_fields(fd->descriptor, data + hdr, len - hdr, 1, err) < 0)
        return NULL;
    struct unpack_budget b = {.left = budget};
    ProtobufCAllocator alloc = {.alloc = budget_alloc, .free = budget_free,
                                .allocator_data = &b};
    Shoal__Frame *f = shoal__frame__unpack(&alloc, len, data);
    if (used)
        *used = b.used;
    if (!f) {
        if (b.refused)
            shoal_err_set(err, SHOAL_ERANGE, "frame of %zu bytes needs more than %zu bytes "
                          "to unpack (the budget of a frame that size)", len, budget);
        else
            shoal_err_set(err, SHOAL_EFORMAT, "frame of %zu bytes is not a valid protobuf "
                          "Frame", len);
        return NULL;
    }
    if (f->msg_case == SHOAL__FRAME__MSG__NOT_SET) {   /* not reached: checked above */
        shoal__frame__free_unpacked(f, NULL);
        shoal_err_set(err, SHOAL_EFORMAT, "frame of %zu bytes carries no known message", len);
        return NULL;
    }
    return f;
}

Shoal__Frame *shoal_wire_unpack(const uint8_t *data, size_t len, struct shoal_err *err)
{
    return shoal_wire_unpack_bounded(data, len, shoal_wire_unpack_budget(len), NULL, err);
}

void shoal_wire_frame_free(Shoal__Frame *f)
{
    if (f)
        shoal__frame__free_unpacked(f, NULL);
}

const char *shoal_wire_frame_name(const Shoal__Frame *f)
{
    switch (f->msg_case) {
    case SHOAL__FRAME__MSG_HELLO: return "hello";
    case SHOAL__FRAME__MSG_AUTH: return "auth";
    case SHOAL__FRAME__MSG_READY: return "ready";
    case SHOAL__FRAME__MSG_REQUEST: return "request";
    case SHOAL__FRAME__MSG_RESPONSE: return "response";
    case SHOAL__FRAME__MSG_HINT: return "hint";
    case SHOAL__FRAME__MSG_HEARTBEAT: return "heartbeat";
    case SHOAL__FRAME__MSG_STATUS_REQUEST: return "status_request";
    case SHOAL__FRAME__MSG_STATUS: return "status";
    case SHOAL__FRAME__MSG_CLUSTER: return "cluster";
    case SHOAL__FRAME__MSG_ERROR: return "error";
    default: return "empty";
    }
}

void shoal_wire_error_init(struct shoal_wire_error *e, uint64_t id, int code,
                           const char *message)
{
    shoal__frame__init(&e->frame);
    shoal__error_reply__init(&e->reply);
    snprintf(e->message, sizeof e->message, "%s", message ? message : "");
    e->reply.id = id;
    e->reply.code = code;
    e->reply.message = e->message;
    e->frame.msg_case = SHOAL__FRAME__MSG_ERROR;
    e->frame.error = &e->reply;
}
/* ---- validation ---- */

int shoal_wire_check_request(const Shoal__ExpertRequest *rq, int64_t n_layer,
                             int64_t n_expert, int64_t n_embd, const uint8_t *is_moe,
                             const uint8_t *coverage, size_t coverage_len,
                             int64_t max_rows, struct shoal_err *err)
{
    if (rq->id == 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "request id 0 is reserved");
    if ((int64_t)rq->layer >= n_layer)
        return shoal_err_set(err, SHOAL_ERANGE, "request %llu: layer %u outside [0, %lld)",
                             (unsigned long long)rq->id, rq->layer, (long long)n_layer);
    if (is_moe && !is_moe[rq->layer])
        return shoal_err_set(err, SHOAL_ERANGE, "request %llu: layer %u is not a MoE layer",
                             (unsigned long long)rq->id, rq->layer);
    if ((int64_t)rq->n_embd != n_embd)
        return shoal_err_set(err, SHOAL_ESHAPE, "request %llu: n_embd %u, expected %lld",
                             (unsigned long long)rq->id, rq->n_embd, (long long)n_embd);
    if (rq->n_rows < 1 || (int64_t)rq->n_rows > max_rows)
        return shoal_err_set(err, SHOAL_ERANGE, "request %llu: n_rows %u outside [1, %lld]",
                             (unsigned long long)rq->id, rq->n_rows, (long long)max_rows);
    uint64_t want = (uint64_t)rq->n_rows * (uint64_t)rq->n_embd * 4u; /* both < 2^32 */
    if (rq->hidden.len != want)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "request %llu: hidden holds %zu bytes, expected n_rows %u x "
                             "n_embd %u x 4 = %llu", (unsigned long long)rq->id,
                             rq->hidden.len, rq->n_rows, rq->n_embd, (unsigned long long)want);
    if (rq->n_experts < 1 || (int64_t)rq->n_experts > n_expert)
        return shoal_err_set(err, SHOAL_ERANGE, "request %llu: %zu experts, expected 1..%lld",
                             (unsigned long long)rq->id, rq->n_experts, (long long)n_expert);
    uint64_t total = 0;
    for (size_t i = 0; i < rq->n_experts; i++) {
        const Shoal__ExpertRows *er = rq->experts[i];
        if ((int64_t)er->expert >= n_expert)
            return shoal_err_set(err, SHOAL_ERANGE,
                                 "request %llu: expert %u outside [0, %lld)",
                                 (unsigned long long)rq->id, er->expert, (long long)n_expert);
        for (size_t j = 0; j < i; j++)
            if (rq->experts[j]->expert == er->expert)
                return shoal_err_set(err, SHOAL_EFORMAT,
                                     "request %llu: expert %u appears twice",
                                     (unsigned long long)rq->id, er->expert);
        if (coverage && !shoal_wire_covers(coverage, coverage_len, n_expert, rq->layer,
                                           er->expert))
            return shoal_err_set(err, SHOAL_ENOTFOUND,
                                 "request %llu: layer %u expert %u is not in this worker's "
                                 "shard", (unsigned long long)rq->id, rq->layer, er->expert);
        if (er->n_rows < 1 || er->n_rows > rq->n_rows)
            return shoal_err_set(err, SHOAL_ERANGE,
                                 "request %llu: expert %u has %zu rows, expected 1..%u",
                                 (unsigned long long)rq->id, er->expert, er->n_rows,
                                 rq->n_rows);
        for (size_t j = 0; j < er->n_rows; j++)
            if (er->rows[j] >= rq->n_rows)
                return shoal_err_set(err, SHOAL_ERANGE,
                                     "request %llu: expert %u row %u outside [0, %u)",
                                     (unsigned long long)rq->id, er->expert, er->rows[j],
                                     rq->n_rows);
        total += er->n_rows;
    }
    /* the response must fit a frame too: total rows * n_embd * 4 */
    if (total * (uint64_t)rq->n_embd * 4u > (uint64_t)SHOAL_WIRE_MAX_FRAME_DEFAULT * 4u)
        return shoal_err_set(err, SHOAL_ERANGE, "request %llu: %llu output rows are too many",
                             (unsigned long long)rq->id, (unsigned long long)total);
    return 0;
}

int shoal_wire_check_response(const Shoal__ExpertResponse *rs, uint64_t total_rows,
                              int64_t n_embd, struct shoal_err *err)
{
    uint64_t want = total_rows * (uint64_t)n_embd * 4u;
    if (rs->more)
        return shoal_err_set(err, SHOAL_EFORMAT, "response %llu: a part ('more') where the "
                             "last frame was due", (unsigned long long)rs->id);
    if (rs->out.len != want)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "response %llu: %zu output bytes, expected %llu rows x n_embd "
                             "%lld x 4 = %llu", (unsigned long long)rs->id, rs->out.len,
                             (unsigned long long)total_rows, (long long)n_embd,
                             (unsigned long long)want);
    return 0;
}

int shoal_wire_check_response_part(const Shoal__ExpertResponse *rs, uint64_t have,
                                   uint64_t total_rows, int64_t n_embd, uint32_t parts_left,
                                   struct shoal_err *err)
{
    const uint64_t row = (uint64_t)n_embd * 4u, want = total_rows * row;
    const unsigned long long id = (unsigned long long)rs->id;
    if (parts_left < 2)
        return shoal_err_set(err, SHOAL_EFORMAT, "response %llu: more parts than the request "
                             "allowed", id);
    if (rs->out.len == 0 || row == 0 || rs->out.len % row != 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "response %llu: a part of %zu bytes, expected "
                             "a positive multiple of n_embd %lld x 4", id, rs->out.len,
                             (long long)n_embd);
    if (have > want || rs->out.len > want - have)
        return shoal_err_set(err, SHOAL_EFORMAT, "response %llu: parts of %llu bytes, expected "
                             "at most %llu rows x n_embd %lld x 4 = %llu", id,
                             (unsigned long long)(have + rs->out.len),
                             (unsigned long long)total_rows, (long long)n_embd,
                             (unsigned long long)want);
    return 0;
}

char *shoal_wire_printable(char *dst, size_t n, const char *src)
{
    size_t j = 0;
    for (size_t i = 0; src && src[i] && j + 1 < n; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[j++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    if (n)
        dst[j] = 0;
    return dst;
}
