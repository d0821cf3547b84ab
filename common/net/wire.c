/* wire: framing, cluster key, handshake, validation and a blocking client
 * (see wire.h and docs/PROTOCOL.md). */
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

static const char LABEL_ACCEPTOR[] = "shoal-acceptor-v1";
static const char LABEL_CONNECTOR[] = "shoal-connector-v1";

static int sodium_ready(struct shoal_err *err)
{
    if (sodium_init() < 0)
        return shoal_err_set(err, SHOAL_EIO, "libsodium could not be initialised");
    return 0;
}

/* ---- key ---- */

int shoal_wire_key_load(const char *path, struct shoal_wire_key *key, struct shoal_err *err)
{
    memset(key, 0, sizeof *key);
    int rc = sodium_ready(err);
    if (rc)
        return rc;
    char *text = NULL;
    size_t len = 0;
    if ((rc = shoal_read_file(path, 1 << 20, &text, &len, err)) < 0)
        return rc;
    size_t b = 0, e = len;
    while (b < e && (text[b] == ' ' || text[b] == '\t' || text[b] == '\n' || text[b] == '\r'))
        b++;
    while (e > b && (text[e - 1] == ' ' || text[e - 1] == '\t' || text[e - 1] == '\n' ||
                     text[e - 1] == '\r'))
        e--;
    if (e - b < 16) {
        sodium_memzero(text, len);
        free(text);
        return shoal_err_set(err, SHOAL_EINVAL,
                             "key file '%s' holds %zu bytes of secret, expected at "
                             "least 16 (make one with: head -c 32 /dev/urandom | base64 > %s)",
                             path, e - b, path);
    }
    crypto_hash_sha256(key->bytes, (const unsigned char *)text + b, e - b);
    sodium_memzero(text, len);
    free(text);
    key->set = 1;
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)))
        shoal_log(SHOAL_LOG_WARN, "wire", "key file '%s' is readable by group or others "
                       "(mode %03o); chmod 600 it", path, (unsigned)(st.st_mode & 0777));
    return 0;
}

static void wire_mac(uint8_t out[SHOAL_WIRE_MAC_BYTES], const struct shoal_wire_key *key,
                     const char *label, const uint8_t *a, const uint8_t *b)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key->bytes, sizeof key->bytes);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, strlen(label));
    crypto_auth_hmacsha256_update(&st, a, SHOAL_WIRE_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, b, SHOAL_WIRE_NONCE_BYTES);
    crypto_auth_hmacsha256_final(&st, out);
}

/* ---- frames ---- */

void shoal_wire_buf_free(struct shoal_wire_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

int shoal_wire_buf_append(struct shoal_wire_buf *b, const Shoal__Frame *f,
                          uint32_t max_frame, struct shoal_err *err)
{
    size_t body = protobuf_c_message_get_packed_size(&f->base);
    if (body == 0 || body > max_frame)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "%s frame of %zu bytes exceeds the peer's maximum of %u bytes",
                             shoal_wire_frame_name(f), body, max_frame);
    size_t need = b->len + 4 + body;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need)
            cap *= 2;
        uint8_t *p = realloc(b->data, cap);
        if (!p)
            return shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate %zu bytes for a frame",
                                 cap);
        b->data = p;
        b->cap = cap;
    }
    put_le32(b->data + b->len, (uint32_t)body);
    size_t packed = protobuf_c_message_pack(&f->base, b->data + b->len + 4);
    if (packed != body)
        return shoal_err_set(err, SHOAL_EIO, "protobuf-c packed %zu bytes, expected %zu",
                             packed, body);
    b->len = need;
    return 0;
}

uint8_t *shoal_wire_pack(const Shoal__Frame *f, uint32_t max_frame, size_t *len,
                         struct shoal_err *err)
{
    struct shoal_wire_buf b = {0};
    if (shoal_wire_buf_append(&b, f, max_frame, err) < 0) {
        shoal_wire_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.data;
}

void shoal_frame_reader_init(struct shoal_frame_reader *r, uint32_t max_frame)
{
    memset(r, 0, sizeof *r);
    r->max_frame = max_frame ? max_frame : SHOAL_WIRE_MAX_FRAME_DEFAULT;
}

void shoal_frame_reader_free(struct shoal_frame_reader *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Make room for `need` buffered bytes of a frame whose whole size (prefix
 * included) is `whole`: the buffer grows geometrically but never past what
 * the frame can hold, and never more than twice what has arrived, so an
 * announced length costs nothing until its bytes come. */
static int reader_reserve(struct shoal_frame_reader *r, size_t need, size_t whole,
                          struct shoal_err *err)
{
    if (need <= r->cap)
        return 0;
    size_t cap = r->cap * 2 > 256 ? r->cap * 2 : 256;
    if (cap > whole)
        cap = whole;
    if (cap < need)
        cap = need;
    uint8_t *p = realloc(r->buf, cap);
    if (!p)
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate %zu bytes for a frame", cap);
    r->buf = p;
    r->cap = cap;
    return 0;
}

int shoal_frame_reader_feed(struct shoal_frame_reader *r, const uint8_t *data, size_t n,
                            int (*on_frame)(void *user, const uint8_t *body, size_t len),
                            void *user, struct shoal_err *err)
{
    while (n > 0) {
        /* the length prefix */
        if (r->len < 4) {
            size_t take = 4 - r->len < n ? 4 - r->len : n;
            int rc = reader_reserve(r, 4, 4, err);
            if (rc)
                return rc;
            memcpy(r->buf + r->len, data, take);
            r->len += take;
            data += take;
            n -= take;
            if (r->len < 4)
                return 0;
            uint32_t body = get_le32(r->buf);
            if (body == 0 || body > r->max_frame) {
                r->len = 0;
                return shoal_err_set(err, SHOAL_ERANGE,
                                     "frame length %u is outside [1, %u] (the maximum "
                                     "frame size)", body, r->max_frame);
            }
        }
        uint32_t body = get_le32(r->buf);
        size_t have = r->len - 4;
        /* a whole frame in the input and nothing buffered: no copy */
        if (have == 0 && n >= body) {
            r->len = 0;
            int rc = on_frame(user, data, body);
            data += body;
            n -= body;
            if (rc)
                return rc;
            continue;
        }
        size_t take = body - have < n ? body - have : n;
        int rc = reader_reserve(r, r->len + take, 4 + (size_t)body, err);
        if (rc)
            return rc;
        memcpy(r->buf + r->len, data, take);
        r->len += take;
        data += take;
        n -= take;
        if (r->len == 4 + (size_t)body) {
            r->len = 0;
            if ((rc = on_frame(user, r->buf + 4, body)))
                return rc;
            /* do not keep a large buffer around after one big frame */
            if (r->cap > (1u << 20) && body < r->cap / 4) {
                free(r->buf);
                r->buf = NULL;
                r->cap = 0;
            }
        }
    }
    return 0;
}

size_t shoal_frame_reader_buffered(const struct shoal_frame_reader *r)
{
    return r->cap;
}

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
    if (rs->out.len != want)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "response %llu: %zu output bytes, expected %llu rows x n_embd "
                             "%lld x 4 = %llu", (unsigned long long)rs->id, rs->out.len,
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

/* ---- handshake ---- */

const char *shoal_wire_role_name(Shoal__Role r)
{
    switch (r) {
    case SHOAL__ROLE__ROLE_COORDINATOR: return "coordinator";
    case SHOAL__ROLE__ROLE_WORKER: return "worker";
    case SHOAL__ROLE__ROLE_OBSERVER: return "observer";
    default: return "unknown";
    }
}

void shoal_handshake_init(struct shoal_handshake *hs, int connector, Shoal__Role role,
                          const struct shoal_wire_key *key, const Shoal__PeerInfo *info,
                          const char *fingerprint, const char *peer_name)
{
    memset(hs, 0, sizeof *hs);
    hs->connector = connector;
    hs->role = role;
    hs->key = key && key->set ? key : NULL;
    hs->info = info;
    hs->fingerprint = fingerprint;
    hs->peer_name = peer_name ? peer_name : "peer";
    hs->state = SHOAL_HS_START;
    if (sodium_init() < 0) {
        /* no random source: every step of this handshake fails */
        hs->state = SHOAL_HS_FAILED;
        return;
    }
    randombytes_buf(hs->nonce_self, sizeof hs->nonce_self);
}

void shoal_handshake_free(struct shoal_handshake *hs)
{
    shoal_wire_frame_free(hs->peer_frame);
    hs->peer_frame = NULL;
    hs->peer_info = NULL;
}

static int hs_fail(struct shoal_handshake *hs, struct shoal_wire_buf *out, int code,
                   struct shoal_err *err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int hs_fail(struct shoal_handshake *hs, struct shoal_wire_buf *out, int code,
                   struct shoal_err *err, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hs->state = SHOAL_HS_FAILED;
    if (out) {
        /* tell the peer why, without anything secret or model-specific */
        struct shoal_wire_error e;
        shoal_wire_error_init(&e, 0, code, msg);
        (void)shoal_wire_buf_append(out, &e.frame, SHOAL_WIRE_MAX_FRAME_DEFAULT, NULL);
    }
    return shoal_err_set(err, code, "%s: %s", hs->peer_name, msg);
}

static int hs_send_hello(struct shoal_handshake *hs, const uint8_t *mac,
                         struct shoal_wire_buf *out, struct shoal_err *err)
{
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__Hello h = SHOAL__HELLO__INIT;
    h.version = SHOAL_PROTO_VERSION;
    h.role = hs->role;
    h.nonce.data = hs->nonce_self;
    h.nonce.len = sizeof hs->nonce_self;
    if (mac) {
        h.mac.data = (uint8_t *)mac;
        h.mac.len = SHOAL_WIRE_MAC_BYTES;
    }
    h.keyed = hs->key != NULL;
    f.msg_case = SHOAL__FRAME__MSG_HELLO;
    f.hello = &h;
    return shoal_wire_buf_append(out, &f, SHOAL_WIRE_HANDSHAKE_MAX_FRAME, err);
}

int shoal_handshake_start(struct shoal_handshake *hs, struct shoal_wire_buf *out,
                          struct shoal_err *err)
{
    if (hs->state == SHOAL_HS_FAILED)
        return shoal_err_set(err, SHOAL_EIO, "%s: libsodium could not be initialised",
                             hs->peer_name);
    if (!hs->connector || hs->state != SHOAL_HS_START)
        return shoal_err_set(err, SHOAL_EINVAL, "handshake start: not a fresh connector");
    int rc = hs_send_hello(hs, NULL, out, err);
    if (rc)
        return rc;
    hs->state = SHOAL_HS_WAIT_HELLO;
    return 0;
}

/* Check the peer's hello: version, roles, nonce, key presence. */
static int hs_check_hello(struct shoal_handshake *hs, const Shoal__Hello *h,
                          struct shoal_wire_buf *out, struct shoal_err *err)
{
    if (h->version != SHOAL_PROTO_VERSION)
        return hs_fail(hs, out, SHOAL_EUNSUPPORTED, err,
                       "protocol version %u, expected %u", h->version, SHOAL_PROTO_VERSION);
    if (h->nonce.len != SHOAL_WIRE_NONCE_BYTES)
        return hs_fail(hs, out, SHOAL_EFORMAT, err, "hello nonce of %zu bytes, expected %d",
                       h->nonce.len, SHOAL_WIRE_NONCE_BYTES);
    /* allowed pairs: coordinator-worker, coordinator-observer and
     * worker-observer (status of one worker); never two of a kind */
    int valid = h->role == SHOAL__ROLE__ROLE_COORDINATOR || h->role == SHOAL__ROLE__ROLE_WORKER ||
                h->role == SHOAL__ROLE__ROLE_OBSERVER;
    if (!valid || h->role == hs->role)
        return hs_fail(hs, out, SHOAL_EINVAL, err,
                       "a %s cannot talk to a %s (expected a coordinator with a worker or "
                       "an observer, or an observer with a worker)",
                       shoal_wire_role_name(hs->role), shoal_wire_role_name(h->role));
    if (hs->key && !h->keyed)
        return hs_fail(hs, out, SHOAL_EINVAL, err,
                       "authentication failed: the %s has a cluster key and the %s has "
                       "none (give both the same --cluster-key)",
                       shoal_wire_role_name(hs->role), shoal_wire_role_name(h->role));
    if (!hs->key && h->keyed)
        return hs_fail(hs, out, SHOAL_EINVAL, err,
                       "authentication failed: the %s has a cluster key and the %s has "
                       "none (give both the same --cluster-key)",
                       shoal_wire_role_name(h->role), shoal_wire_role_name(hs->role));
    memcpy(hs->nonce_peer, h->nonce.data, SHOAL_WIRE_NONCE_BYTES);
    hs->peer_role = h->role;
    return 0;
}

/* Check the peer's PeerInfo once authenticated. */
static int hs_check_info(struct shoal_handshake *hs, const Shoal__PeerInfo *pi,
                         struct shoal_wire_buf *out, struct shoal_err *err)
{
    if (!pi)
        return hs_fail(hs, out, SHOAL_EFORMAT, err, "handshake without peer info");
    int observer = hs->role == SHOAL__ROLE__ROLE_OBSERVER ||
                   hs->peer_role == SHOAL__ROLE__ROLE_OBSERVER;
    if (!observer && hs->fingerprint &&
        (!pi->fingerprint || strcmp(pi->fingerprint, hs->fingerprint) != 0))
        return hs_fail(hs, out, SHOAL_EINVAL, err,
                       "model fingerprint mismatch: the %s has model %s, this %s has %s",
                       shoal_wire_role_name(hs->peer_role),
                       pi->fingerprint && pi->fingerprint[0] ? pi->fingerprint : "(none)",
                       shoal_wire_role_name(hs->role), hs->fingerprint);
    return 0;
}

static int hs_send_info(struct shoal_handshake *hs, int auth, struct shoal_wire_buf *out,
                        struct shoal_err *err)
{
    Shoal__Frame f = SHOAL__FRAME__INIT;
    Shoal__Auth a = SHOAL__AUTH__INIT;
    Shoal__Ready r = SHOAL__READY__INIT;
    Shoal__PeerInfo empty = SHOAL__PEER_INFO__INIT;
    Shoal__PeerInfo *info = hs->info ? (Shoal__PeerInfo *)hs->info : &empty;
    uint8_t mac[SHOAL_WIRE_MAC_BYTES];
    if (auth) {
        if (hs->key) {
            wire_mac(mac, hs->key, LABEL_CONNECTOR, hs->nonce_peer, hs->nonce_self);
            a.mac.data = mac;
            a.mac.len = sizeof mac;
        }
        a.info = info;
        f.msg_case = SHOAL__FRAME__MSG_AUTH;
        f.auth = &a;
    } else {
        r.info = info;
        f.msg_case = SHOAL__FRAME__MSG_READY;
        f.ready = &r;
    }
    /* the peer reads it before the handshake is done: its small limit */
    return shoal_wire_buf_append(out, &f, SHOAL_WIRE_HANDSHAKE_MAX_FRAME, err);
}

int shoal_handshake_on_frame(struct shoal_handshake *hs, const Shoal__Frame *f,
                             struct shoal_wire_buf *out, struct shoal_err *err)
{
    if (f->msg_case == SHOAL__FRAME__MSG_ERROR) {
        hs->state = SHOAL_HS_FAILED;
        char msg[300];
        shoal_wire_printable(msg, sizeof msg, f->error->message);
        return shoal_err_set(err, f->error->code < 0 ? f->error->code : SHOAL_EINVAL,
                             "%s refused the handshake: %s", hs->peer_name, msg);
    }
    if (hs->state == SHOAL_HS_FAILED)
        return shoal_err_set(err, SHOAL_EIO, "%s: handshake already failed (libsodium could "
                             "not be initialised, or an earlier step)", hs->peer_name);
    switch (hs->state) {
    case SHOAL_HS_START: /* acceptor: the connector's hello */
        if (hs->connector || f->msg_case != SHOAL__FRAME__MSG_HELLO)
            break;
        {
            int rc = hs_check_hello(hs, f->hello, out, err);
            if (rc)
                return rc;
            uint8_t mac[SHOAL_WIRE_MAC_BYTES];
            if (hs->key)
                wire_mac(mac, hs->key, LABEL_ACCEPTOR, hs->nonce_peer, hs->nonce_self);
            if ((rc = hs_send_hello(hs, hs->key ? mac : NULL, out, err)))
                return rc;
            hs->state = SHOAL_HS_WAIT_AUTH;
            return 0;
        }
    case SHOAL_HS_WAIT_HELLO: /* connector: the acceptor's hello + proof */
        if (f->msg_case != SHOAL__FRAME__MSG_HELLO)
            break;
        {
            int rc = hs_check_hello(hs, f->hello, out, err);
            if (rc)
                return rc;
            if (hs->key) {
                uint8_t mac[SHOAL_WIRE_MAC_BYTES];
                wire_mac(mac, hs->key, LABEL_ACCEPTOR, hs->nonce_self, hs->nonce_peer);
                if (f->hello->mac.len != SHOAL_WIRE_MAC_BYTES ||
                    crypto_verify_32(mac, f->hello->mac.data) != 0)
                    return hs_fail(hs, out, SHOAL_EINVAL, err,
                                   "authentication failed: the %s and the %s hold "
                                   "different cluster keys",
                                   shoal_wire_role_name(hs->role),
                                   shoal_wire_role_name(hs->peer_role));
            }
            if ((rc = hs_send_info(hs, 1, out, err)))
                return rc;
            hs->state = SHOAL_HS_WAIT_READY;
            return 0;
        }
    case SHOAL_HS_WAIT_AUTH: /* acceptor: the connector's proof + info */
        if (f->msg_case != SHOAL__FRAME__MSG_AUTH)
            break;
        {
            if (hs->key) {
                uint8_t mac[SHOAL_WIRE_MAC_BYTES];
                wire_mac(mac, hs->key, LABEL_CONNECTOR, hs->nonce_self, hs->nonce_peer);
                if (f->auth->mac.len != SHOAL_WIRE_MAC_BYTES ||
                    crypto_verify_32(mac, f->auth->mac.data) != 0)
                    return hs_fail(hs, out, SHOAL_EINVAL, err,
                                   "authentication failed: the %s and the %s hold "
                                   "different cluster keys",
                                   shoal_wire_role_name(hs->role),
                                   shoal_wire_role_name(hs->peer_role));
            }
            int rc = hs_check_info(hs, f->auth->info, out, err);
            if (rc)
                return rc;
            char why[300];
            why[0] = 0;
            if (hs->admit && hs->admit(hs->admit_user, hs->peer_role, why, sizeof why))
                return hs_fail(hs, out, SHOAL_ERANGE, err, "%s", why[0] ? why : "refused");
            if ((rc = hs_send_info(hs, 0, out, err)))
                return rc;
            hs->state = SHOAL_HS_DONE;
            return 1;
        }
    case SHOAL_HS_WAIT_READY: /* connector: the acceptor's info */
        if (f->msg_case != SHOAL__FRAME__MSG_READY)
            break;
        {
            int rc = hs_check_info(hs, f->ready->info, out, err);
            if (rc)
                return rc;
            hs->state = SHOAL_HS_DONE;
            return 1;
        }
    default:
        break;
    }
    return hs_fail(hs, out, SHOAL_EFORMAT, err, "unexpected %s frame during the handshake",
                   shoal_wire_frame_name(f));
}

void shoal_handshake_adopt(struct shoal_handshake *hs, Shoal__Frame *f)
{
    shoal_wire_frame_free(hs->peer_frame);
    hs->peer_frame = f;
    hs->peer_info = f->msg_case == SHOAL__FRAME__MSG_AUTH ? f->auth->info : f->ready->info;
}

/* ---- connections in their handshake ---- */

void shoal_preauth_init(struct shoal_preauth *p, int cap, int per_ip)
{
    memset(p, 0, sizeof *p);
    p->cap = cap > 0 ? cap : 1;
    p->per_ip = per_ip > 0 ? per_ip : 1;
    p->slot = shoal_xcalloc((size_t)p->cap, sizeof *p->slot);
}

void shoal_preauth_free(struct shoal_preauth *p)
{
    free(p->slot);
    memset(p, 0, sizeof *p);
}

char *shoal_wire_peer_group(const char *peer, char *dst, size_t n)
{
    if (n == 0)
        return dst;
    char host[INET6_ADDRSTRLEN + 8];
    const char *h = peer, *end;
    if (peer[0] == '[') {
        /* "[v6]:port" or "[v6]" */
        h = peer + 1;
        end = strchr(h, ']');
        if (!end)
            end = h + strlen(h);
    } else {
        /* "v4:port", "v4", or a bare v6 without a port (more than one colon) */
        const char *colon = strchr(peer, ':');
        end = colon && !strchr(colon + 1, ':') ? colon : peer + strlen(peer);
    }
    size_t len = (size_t)(end - h);
    struct in6_addr a6;
    struct in_addr a4;
    if (len < sizeof host) {
        memcpy(host, h, len);
        host[len] = 0;
        char *pct = strchr(host, '%');   /* a zone ("fe80::1%eth0") is not part of it */
        if (pct)
            *pct = 0;
        if (inet_pton(AF_INET, host, &a4) == 1) {
            inet_ntop(AF_INET, &a4, dst, (socklen_t)n);
            return dst;
        }
        if (inet_pton(AF_INET6, host, &a6) == 1) {
            if (IN6_IS_ADDR_V4MAPPED(&a6)) {
                memcpy(&a4, a6.s6_addr + 12, 4);
                inet_ntop(AF_INET, &a4, dst, (socklen_t)n);
                return dst;
            }
            /* one site usually holds a whole /64: its interface ids are free */
            memset(a6.s6_addr + 8, 0, 8);
            char net[INET6_ADDRSTRLEN];
            inet_ntop(AF_INET6, &a6, net, sizeof net);
            snprintf(dst, n, "%s/64", net);
            return dst;
        }
    }
    /* not an address (a name, "?"): the text before the port, as given */
    if (len >= n)
        len = n - 1;
    memcpy(dst, h, len);
    dst[len] = 0;
    return dst;
}

static void preauth_host(char *dst, size_t n, const char *peer)
{
    shoal_wire_peer_group(peer, dst, n);
}

/* progress: a connection whose hello was read, or that has bytes waiting
 * (the loop accepts before it reads), ranks above a silent one */
static int preauth_progress(const struct shoal_preauth_slot *s)
{
    int avail = 0;
    return s->hs->state != SHOAL_HS_START ||
           (s->fd >= 0 && ioctl(s->fd, FIONREAD, &avail) == 0 && avail > 0);
}

static int preauth_worse(const struct shoal_preauth_slot *a, const struct shoal_preauth_slot *b)
{
    int pa = preauth_progress(a), pb = preauth_progress(b);
    return pa != pb ? pa < pb : a->seq < b->seq;
}

void *shoal_preauth_victim(const struct shoal_preauth *p, const char *peer)
{
    char ip[64];
    preauth_host(ip, sizeof ip, peer);
    int same = 0;
    for (int i = 0; i < p->n; i++)
        same += !strcmp(p->slot[i].ip, ip);
    if (same < p->per_ip && p->n < p->cap)
        return NULL;
    /* the table is full: the victim comes from the address holding the
     * most slots, so addresses that churn connections evict each other,
     * not the one connection of another peer still sending its hello */
    int most = 0, count[p->n > 0 ? p->n : 1];
    for (int i = 0; i < p->n; i++) {
        count[i] = 0;
        for (int j = 0; j < p->n; j++)
            count[i] += !strcmp(p->slot[i].ip, p->slot[j].ip);
        if (count[i] > most)
            most = count[i];
    }
    const struct shoal_preauth_slot *v = NULL;
    for (int i = 0; i < p->n; i++) {
        const struct shoal_preauth_slot *s = &p->slot[i];
        if (same >= p->per_ip ? strcmp(s->ip, ip) != 0 : count[i] < most)
            continue;
        if (!v || preauth_worse(s, v))
            v = s;
    }
    return v ? v->conn : NULL;
}

void shoal_preauth_add(struct shoal_preauth *p, void *conn, const struct shoal_handshake *hs,
                       int fd, const char *peer)
{
    if (p->n >= p->cap)
        return;   /* the caller evicts first; never reached */
    struct shoal_preauth_slot *s = &p->slot[p->n++];
    s->conn = conn;
    s->hs = hs;
    s->fd = fd;
    s->seq = ++p->seq;
    preauth_host(s->ip, sizeof s->ip, peer);
}

void shoal_preauth_remove(struct shoal_preauth *p, const void *conn)
{
    for (int i = 0; i < p->n; i++)
        if (p->slot[i].conn == conn) {
            p->slot[i] = p->slot[--p->n];
            return;
        }
}

/* ---- addresses ---- */

int shoal_wire_parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len,
                          struct shoal_err *err)
{
    char host[256];
    const char *port;
    if (!text || !*text)
        return shoal_err_set(err, SHOAL_EINVAL, "empty address, expected HOST:PORT");
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':' || (size_t)(close - text - 1) >= sizeof host)
            return shoal_err_set(err, SHOAL_EINVAL,
                                 "address '%s': expected [IPV6]:PORT", text);
        memcpy(host, text + 1, (size_t)(close - text - 1));
        host[close - text - 1] = 0;
        port = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || colon == text || (size_t)(colon - text) >= sizeof host)
            return shoal_err_set(err, SHOAL_EINVAL, "address '%s': expected HOST:PORT", text);
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = 0;
        port = colon + 1;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (!*port || *end || p < 0 || p > 65535)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "address '%s': port '%s' is not a number in 0..65535", text, port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0 || !res)
        return shoal_err_set(err, SHOAL_EINVAL, "address '%s': cannot resolve '%s': %s", text,
                             host, gai_strerror(g));
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int shoal_wire_addr_is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
            return 1;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
            return a->sin6_addr.s6_addr[12] == 127;
    }
    return 0;
}

char *shoal_wire_addr_str(const struct sockaddr *sa, char *buf, size_t n)
{
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        port = ntohs(a->sin_port);
        snprintf(buf, n, "%s:%u", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        port = ntohs(a->sin6_port);
        snprintf(buf, n, "[%s]:%u", host, port);
    } else {
        snprintf(buf, n, "?");
    }
    return buf;
}

uint64_t shoal_wire_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- blocking client ---- */

static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = shoal_wire_now_ns();
        if (now >= deadline_ns)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int ms = (int)((deadline_ns - now) / 1000000u) + 1;
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        return r < 0 ? -errno : r;
    }
}

static int send_all(struct shoal_wire_client *c, const uint8_t *p, size_t n,
                    struct shoal_err *err)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(c->fd, POLLOUT, shoal_wire_now_ns() + 30000000000ull) <= 0)
                return shoal_err_set(err, SHOAL_EIO, "send timed out");
            continue;
        }
        if (w < 0)
            return shoal_err_set(err, -errno, "send failed: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
        c->bytes_sent += (uint64_t)w;
    }
    return 0;
}

int shoal_wire_client_send(struct shoal_wire_client *c, const Shoal__Frame *f,
                           struct shoal_err *err)
{
    size_t len;
    uint8_t *b = shoal_wire_pack(f, c->max_frame, &len, err);
    if (!b)
        return err && err->code ? err->code : SHOAL_EINVAL;
    int rc = send_all(c, b, len, err);
    free(b);
    return rc;
}

struct recv_one {
    Shoal__Frame *f;
    struct shoal_err *err;
};

static int recv_on_frame(void *user, const uint8_t *body, size_t len)
{
    struct recv_one *r = user;
    r->f = shoal_wire_unpack(body, len, r->err);
    return r->f ? 1 : SHOAL_EFORMAT;
}

Shoal__Frame *shoal_wire_client_recv(struct shoal_wire_client *c, int timeout_ms,
                                     struct shoal_err *err)
{
    uint64_t deadline = shoal_wire_now_ns() + (uint64_t)timeout_ms * 1000000u;
    struct recv_one r = {.err = err};
    uint8_t buf[16u << 10];
    /* never read past the current frame: the next frame stays in the
     * kernel for the next call; the reader grows with what arrives */
    for (;;) {
        int w = wait_fd(c->fd, POLLIN, deadline);
        if (w == 0) {
            shoal_err_set(err, SHOAL_ECANCELED, "no reply within %d ms", timeout_ms);
            return NULL;
        }
        if (w < 0) {
            shoal_err_set(err, w, "poll failed: %s", strerror(-w));
            return NULL;
        }
        size_t want;
        if (c->reader.len >= 4)
            want = 4 + (size_t)get_le32(c->reader.buf) - c->reader.len;
        else
            want = 4 - c->reader.len;
        if (want > sizeof buf)
            want = sizeof buf;
        ssize_t got = recv(c->fd, buf, want, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0) {
            shoal_err_set(err, SHOAL_EIO, "connection closed by the peer%s%s",
                          got < 0 ? ": " : "", got < 0 ? strerror(errno) : "");
            return NULL;
        }
        c->bytes_received += (uint64_t)got;
        int rc = shoal_frame_reader_feed(&c->reader, buf, (size_t)got, recv_on_frame, &r, err);
        if (rc == 1)
            return r.f;
        if (rc < 0)
            return NULL;
    }
}

int shoal_wire_client_connect(struct shoal_wire_client *c, const char *addr, Shoal__Role role,
                              const struct shoal_wire_key *key, const Shoal__PeerInfo *info,
                              const char *fingerprint, int timeout_ms, struct shoal_err *err)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->max_frame = SHOAL_WIRE_MAX_FRAME_DEFAULT;
    /* the peer has not proven anything yet: handshake-sized frames only */
    shoal_frame_reader_init(&c->reader, SHOAL_WIRE_HANDSHAKE_MAX_FRAME);
    struct sockaddr_storage ss;
    socklen_t len;
    int rc = shoal_wire_parse_addr(addr, &ss, &len, err);
    if (rc)
        return rc;
    uint64_t deadline = shoal_wire_now_ns() + (uint64_t)timeout_ms * 1000000u;
    c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0)
        return shoal_err_set(err, -errno, "%s: socket: %s", addr, strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&ss, len) < 0) {
        if (errno != EINPROGRESS) {
            rc = shoal_err_set(err, -errno, "%s: cannot connect: %s", addr, strerror(errno));
            goto fail;
        }
        int w = wait_fd(c->fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (w <= 0) {
            rc = shoal_err_set(err, SHOAL_ECANCELED, "%s: connect timed out after %d ms",
                               addr, timeout_ms);
            goto fail;
        }
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            rc = shoal_err_set(err, -soerr, "%s: cannot connect: %s", addr, strerror(soerr));
            goto fail;
        }
    }
    shoal_handshake_init(&c->hs, 1, role, key, info, fingerprint, addr);
    struct shoal_wire_buf out = {0};
    if ((rc = shoal_handshake_start(&c->hs, &out, err)) < 0)
        goto fail_out;
    for (;;) {
        if (out.len) {
            if ((rc = send_all(c, out.data, out.len, err)) < 0)
                goto fail_out;
            out.len = 0;
        }
        if (c->hs.state == SHOAL_HS_DONE)
            break;
        uint64_t now = shoal_wire_now_ns();
        int left = now >= deadline ? 0 : (int)((deadline - now) / 1000000u);
        struct shoal_err e2 = {0};
        Shoal__Frame *f = left > 0 ? shoal_wire_client_recv(c, left, &e2) : NULL;
        if (!f) {
            rc = shoal_err_set(err, e2.code ? e2.code : SHOAL_ECANCELED,
                               "%s: handshake did not complete within %d ms%s%s", addr,
                               timeout_ms, e2.code ? ": " : "", e2.code ? e2.msg : "");
            goto fail_out;
        }
        rc = shoal_handshake_on_frame(&c->hs, f, &out, err);
        if (rc == 1) {
            shoal_handshake_adopt(&c->hs, f);
            continue;
        }
        shoal_wire_frame_free(f);
        if (rc < 0) {
            if (out.len)
                (void)send_all(c, out.data, out.len, NULL);
            goto fail_out;
        }
    }
    shoal_wire_buf_free(&out);
    c->reader.max_frame = c->max_frame;
    return 0;
fail_out:
    shoal_wire_buf_free(&out);
fail:
    shoal_wire_client_close(c);
    return rc < 0 ? rc : SHOAL_EIO;
}

void shoal_wire_client_close(struct shoal_wire_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    shoal_frame_reader_free(&c->reader);
    shoal_handshake_free(&c->hs);
}
