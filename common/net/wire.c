/* wire: the cluster key and frames: length-prefixed protobuf-c messages with a
 * maximum, the streaming frame reader (see wire.h and docs/PROTOCOL.md). */
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

static int sodium_ready(struct shoal_err *err)
{
    if (sodium_init() < 0)
        return shoal_err_set(err, SHOAL_EIO, "libsodium could not be initialised");
    return 0;
}

/* ---- key ---- */

static int key_load(const char *path, struct shoal_wire_key *key, int warn,
                    struct shoal_err *err);

int shoal_wire_key_load(const char *path, struct shoal_wire_key *key, struct shoal_err *err)
{
    return key_load(path, key, 1, err);
}

int shoal_wire_key_check(const char *path, struct shoal_err *err)
{
    struct shoal_wire_key key;
    const int rc = key_load(path, &key, 0, err);
    sodium_memzero(&key, sizeof key);
    return rc;
}

static int key_load(const char *path, struct shoal_wire_key *key, int warn,
                    struct shoal_err *err)
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
    if (warn && stat(path, &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)))
        shoal_log(SHOAL_LOG_WARN, "wire", "key file '%s' is readable by group or others "
                       "(mode %03o); chmod 600 it", path, (unsigned)(st.st_mode & 0777));
    return 0;
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
