/* What a checkpoint of one expert holds (docs/checkpoints.md, "Expert
 * checkpoints"; seed 002_2b00836ea4b30f79.txt §3.3: an expert server's
 * state must survive the server, or a volunteer leaving loses what its
 * experts learned). The file is an ordinary checkpoint (common/ckpt/ckpt.h):
 *
 *   step     the expert's optimizer steps so far
 *   params   the expert block's flat parameters (kernels/kern_expert.c
 *            order: ln.weight (C), ln.bias (C), fc1.weight (F,C),
 *            fc1.bias (F), fc2.weight (C,F), fc2.bias (C))
 *   opt      "adam.m" and "adam.v", each as many floats (the first and
 *            second moments of AdamW or LAMB, kernels/kern_optim.h)
 *   rng      none
 *   config   {"uid":"ffn.1.2","C":128,"F":256}
 *
 * Shared by the coordinator (which refuses anything else) and expert
 * servers (which load only what passes the same check). Pure. */
#ifndef MOE_CKPT_H
#define MOE_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"

#define MOE_CKPT_OPT_M "adam.m"
#define MOE_CKPT_OPT_V "adam.v"
#define MOE_CKPT_CONFIG_MAX 512 /* bytes of the config section */

/* Parameters of an expert block of width C, hidden F: 3C + 2CF + F; 0 when
 * C or F is outside 1..65536. */
uint64_t moe_ckpt_nparams(int C, int F);
/* The largest file such an expert's checkpoint can be (config at its
 * maximum). */
uint64_t moe_ckpt_max_bytes(int C, int F);

/* The config section for uid (NUL-terminated into out); CM_ETOOBIG when
 * it does not fit. */
int moe_ckpt_config(const char *uid, int C, int F, char *out, size_t cap);

/* Checks a parsed checkpoint against the expert uid of shape (C, F): the
 * parameter count, exactly the two moment buffers of that count, no RNG,
 * a config naming this uid and shape, every value finite and every second
 * moment >= 0. CM_OK, or CM_EINVAL with the reason in why. */
int moe_ckpt_check(const struct cm_ckpt *c, const char *uid, int C, int F, char *why, size_t cap);

#endif
