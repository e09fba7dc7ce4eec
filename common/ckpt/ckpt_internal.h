/* Helpers shared by the files of common/ckpt/ (not part of the public API). */
#ifndef CM_CKPT_INTERNAL_H
#define CM_CKPT_INTERNAL_H

/* fsync()s the directory holding path, so a rename() into it is durable. */
int cm_ckpt__fsync_dir(const char *path);

#endif
