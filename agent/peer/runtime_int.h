/* Internal to agent/peer/: what the runtime's files share. Roles do not
 * include it. */
#ifndef AGENT_PEER_RUNTIME_INT_H
#define AGENT_PEER_RUNTIME_INT_H

#include "agent/peer/runtime.h"

/* The probe thread (caps.c), started at PEER_STAGE_PROBES. */
void *peer__probe_main(void *arg);

#endif
