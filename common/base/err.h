/* err: shoal's status codes and the error-context object.
 *
 * Every function that can fail returns int: 0 on success, a negative
 * SHOAL_E* code (or -errno for OS errors) on failure, and fills an optional
 * trailing `struct shoal_err *err` with a one-line message that says what,
 * which, and expected vs found. The first error wins: later calls to
 * shoal_err_set on an already-set err keep the first message (curl style).
 * Messages carry no trailing newline.
 *
 * Thread: any (an err object belongs to one thread at a time).
 */
#ifndef SHOAL_ERR_H
#define SHOAL_ERR_H

#include <stdarg.h>

/* XX(name, value, description) */
#define SHOAL_ERRNO_MAP(XX)                                        \
    XX(EINVAL,       -4001, "invalid argument")                    \
    XX(ENOMEM,       -4002, "out of memory")                       \
    XX(EIO,          -4003, "input/output error")                  \
    XX(EFORMAT,      -4004, "malformed input")                     \
    XX(EUNSUPPORTED, -4005, "unsupported")                         \
    XX(ENOTFOUND,    -4006, "not found")                           \
    XX(ERANGE,       -4007, "value out of range")                  \
    XX(ECANCELED,    -4008, "operation canceled")                  \
    XX(ESHAPE,       -4009, "tensor shape mismatch")

enum shoal_status {
    SHOAL_OK = 0,
#define XX(name, value, desc) SHOAL_##name = (value),
    SHOAL_ERRNO_MAP(XX)
#undef XX
};

#define SHOAL_ERR_MSG_MAX 512

struct shoal_err {
    int  code;                    /* 0 while unset, else a negative status */
    char msg[SHOAL_ERR_MSG_MAX];  /* one line, no trailing newline */
};

/* Human-readable description of a status code (SHOAL_E* or -errno).
 * Returns a static string. Thread: any. */
const char *shoal_strerror(int code);

/* Symbolic name of a status code ("EINVAL", "EFORMAT", ...). Static string. */
const char *shoal_err_name(int code);

/* Record an error in err (may be NULL) unless one is already recorded.
 *   code  negative status; fmt printf-style message, no trailing newline.
 * Returns code, so callers can write `return shoal_err_set(err, ...)`.
 * Thread: any. */
int shoal_err_set(struct shoal_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Whether code says the input itself is wrong, not the machine: malformed
 * (EFORMAT), unsupported type or architecture (EUNSUPPORTED), a missing key
 * or tensor (ENOTFOUND), a value out of range (ERANGE) or a wrong shape
 * (ESHAPE). A model file that fails so is bad input, exit status 2 in every
 * command (DESIGN contract 3); I/O, memory and OS errors (-errno) return 0
 * (exit 1). Thread: any. */
int shoal_err_is_bad_input(int code);

/* Reset err to "no error". err may be NULL. */
void shoal_err_clear(struct shoal_err *err);

#endif
