/* cors: the --cors origins of `shoal serve`, which let a browser front-end
 * on another origin call the API (Cross-Origin Resource Sharing). Checking
 * the flag's value and matching a request's Origin header; no HTTP library
 * here (serve.c adds the headers).
 * Thread: any (no state).
 */
#ifndef SHOAL_SERVE_CORS_H
#define SHOAL_SERVE_CORS_H

#include <stddef.h>

/* Check a --cors value (borrowed): origins separated by commas, each
 * "http://HOST[:PORT]" or "https://HOST[:PORT]" (HOST a name, an IPv4
 * address or a bracketed IPv6 address; PORT 1..65535; no path, no trailing
 * slash), or "*" for any origin. Returns 0, or -1 with msg (cap bytes, one
 * line) naming the item and what was expected. */
int shoal_serve_cors_check(const char *list, char *msg, size_t cap);

/* 1 when origin (a request's Origin header; NULL: none) is one of list's
 * (checked by shoal_serve_cors_check; NULL: CORS off, nothing allowed) or
 * list holds "*"; 0 otherwise. Scheme and host compare case-insensitively,
 * as browsers send them lower-case and without a default port. */
int shoal_serve_cors_allows(const char *list, const char *origin);

/* 1 when v (a preflight's Access-Control-Request-Headers, borrowed) is a
 * plain list of header names (letters, digits, "-", "_", ".", commas and
 * spaces; at most 512 bytes) that may be echoed back; 0 otherwise. */
int shoal_serve_cors_headers_ok(const char *v);

#endif
