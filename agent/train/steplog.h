/* Per-step log shared by `train --local` and `join` (--step-log FILE): one
 * JSON object per line, so tests and tools compare runs step by step (loss
 * curves, parameter hashes across peers). Fields are documented in
 * docs/training.md, "Step log". */
#ifndef AGENT_STEPLOG_H
#define AGENT_STEPLOG_H

#include <stdio.h>

#include "kern_model.h"

/* SHA-256 of the model's parameters (fp32, little-endian as stored), hex. */
int agent_param_hash(const struct kern_model *m, char hex[65]);

/* Appends `json_line` (one object, no newline) to f and flushes it, so a
 * killed process loses at most the line being written. NULL f: nothing. */
void agent_steplog_write(FILE *f, const char *json_line);

#endif
