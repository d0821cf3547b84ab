/* wire_handshake: the mutual HMAC challenge-response handshake as a
 * state machine (see wire.h and docs/PROTOCOL.md). */
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

static const char LABEL_ACCEPTOR[] = "shoal-acceptor-v1";
static const char LABEL_CONNECTOR[] = "shoal-connector-v1";

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
