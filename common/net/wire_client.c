/* wire_client: a blocking client for tools (shoal status, the wire probe) (see wire.h and docs/PROTOCOL.md). */
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
