/* Helpers shared by the transport's files (p2p_transport.c, p2p_addr.c,
 * p2p_stream.c); not part of the public API. */
#ifndef P2P_INTERNAL_H
#define P2P_INTERNAL_H

#include <stdint.h>
#include <sys/socket.h>

int p2p__addr_equal(const struct sockaddr_storage *a, const struct sockaddr *b);
socklen_t p2p__addr_len(const struct sockaddr *a);
void p2p__addr_set_port(struct sockaddr_storage *a, uint16_t port);

#endif
