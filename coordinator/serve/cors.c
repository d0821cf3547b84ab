/* cors: --cors origins (see cors.h). */
#include "cors.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One origin s [n] (not "*"): 0, or -1 with msg saying what is wrong. */
static int check_origin(const char *s, size_t n, char *msg, size_t cap)
{
    const char *what = NULL;
    size_t at = 0;
    if (n >= 7 && !strncasecmp(s, "http://", 7))
        at = 7;
    else if (n >= 8 && !strncasecmp(s, "https://", 8))
        at = 8;
    else
        what = "it does not start with http:// or https://";
    size_t host = at;
    if (!what && at < n && s[at] == '[') {   /* [IPv6] */
        at++;
        while (at < n && (isxdigit((unsigned char)s[at]) || s[at] == ':' || s[at] == '.'))
            at++;
        if (at >= n || s[at] != ']')
            what = "its bracketed IPv6 host has no closing ']'";
        else
            at++;
    } else if (!what) {
        while (at < n && (isalnum((unsigned char)s[at]) || s[at] == '-' || s[at] == '.'))
            at++;
    }
    if (!what && at == host)
        what = "it names no host";
    if (!what && at < n && s[at] == ':') {
        size_t p = ++at;
        long port = 0;
        while (at < n && isdigit((unsigned char)s[at]) && at - p < 6)
            port = port * 10 + (s[at++] - '0');
        if (at == p || port < 1 || port > 65535)
            what = "its port is not a number from 1 to 65535";
    }
    if (!what && at < n)
        what = s[at] == '/' ? "it has a path (an origin ends after the host or port)"
                            : "it holds a character not allowed in a host";
    if (!what)
        return 0;
    snprintf(msg, cap, "--cors: '%.*s' is not an origin: %s; expected http://HOST[:PORT], "
             "https://HOST[:PORT] or *", (int)(n > 200 ? 200 : n), s, what);
    return -1;
}

int shoal_serve_cors_check(const char *list, char *msg, size_t cap)
{
    if (!list || !*list) {
        snprintf(msg, cap, "--cors: the value is empty; expected origins such as "
                 "http://localhost:3000 separated by commas, or *");
        return -1;
    }
    for (const char *s = list;;) {
        const char *comma = strchr(s, ',');
        const size_t n = comma ? (size_t)(comma - s) : strlen(s);
        if (n == 0) {
            snprintf(msg, cap, "--cors: '%.200s' holds an empty origin (two commas, or one "
                     "at an end); expected origins separated by single commas", list);
            return -1;
        }
        if (!(n == 1 && *s == '*') && check_origin(s, n, msg, cap))
            return -1;
        if (!comma)
            return 0;
        s = comma + 1;
    }
}

int shoal_serve_cors_allows(const char *list, const char *origin)
{
    if (!list || !origin || !*origin)
        return 0;
    const size_t len = strlen(origin);
    for (const char *s = list;;) {
        const char *comma = strchr(s, ',');
        const size_t n = comma ? (size_t)(comma - s) : strlen(s);
        if ((n == 1 && *s == '*') || (n == len && !strncasecmp(s, origin, n)))
            return 1;
        if (!comma)
            return 0;
        s = comma + 1;
    }
}

int shoal_serve_cors_headers_ok(const char *v)
{
    if (!v || strlen(v) > 512)
        return 0;
    for (; *v; v++)
        if (!isalnum((unsigned char)*v) && !strchr("-_., ", *v))
            return 0;
    return 1;
}
