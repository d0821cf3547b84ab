/* wire_addr: parsing, formatting and grouping addresses (see wire.h and docs/PROTOCOL.md). */
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

unsigned shoal_wire_addr_port(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
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
