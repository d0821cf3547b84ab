#include "err.h"

#include <stdio.h>
#include <string.h>

const char *shoal_strerror(int code)
{
    switch (code) {
    case SHOAL_OK: return "success";
#define XX(name, value, desc) case SHOAL_##name: return desc;
    SHOAL_ERRNO_MAP(XX)
#undef XX
    default:
        if (code < 0 && code > -4000)
            return strerror(-code);
        return "unknown error";
    }
}

const char *shoal_err_name(int code)
{
    switch (code) {
    case SHOAL_OK: return "OK";
#define XX(name, value, desc) case SHOAL_##name: return #name;
    SHOAL_ERRNO_MAP(XX)
#undef XX
    default: return code < 0 && code > -4000 ? "ERRNO" : "UNKNOWN";
    }
}

int shoal_err_set(struct shoal_err *err, int code, const char *fmt, ...)
{
    if (!err || err->code != 0)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    /* Keep messages one line: fold any newline a caller let through. */
    for (char *p = err->msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    return code;
}

int shoal_err_is_bad_input(int code)
{
    return code == SHOAL_EFORMAT || code == SHOAL_EUNSUPPORTED || code == SHOAL_ENOTFOUND ||
           code == SHOAL_ERANGE || code == SHOAL_ESHAPE;
}

void shoal_err_clear(struct shoal_err *err)
{
    if (!err)
        return;
    err->code = 0;
    err->msg[0] = '\0';
}
