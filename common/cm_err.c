/* Messages and names for the error codes in cm_err.h. */
#include "cm_err.h"

const char *cm_strerror(int err)
{
    switch (err) {
    case CM_OK:
        return "success";
#define CM__ERR_MSG(name, msg) \
    case CM_E##name:           \
        return msg;
        CM_ERRNO_MAP(CM__ERR_MSG)
#undef CM__ERR_MSG
    default:
        return "unknown error";
    }
}

const char *cm_err_name(int err)
{
    switch (err) {
    case CM_OK:
        return "CM_OK";
#define CM__ERR_NAME(name, msg) \
    case CM_E##name:            \
        return "CM_E" #name;
        CM_ERRNO_MAP(CM__ERR_NAME)
#undef CM__ERR_NAME
    default:
        return "CM_EUNKNOWN";
    }
}
