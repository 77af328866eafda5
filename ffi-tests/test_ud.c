/*
 * C11: the object-level unreliable datagrams (ud_cases.h): ping-pong
 * between two UD QPs, sixteen destinations from one QP, the 40-byte GRH
 * area, src_qp/slid/sl in the completion, SEND_WITH_IMM and inline
 * datagrams, drops counted by reason, a UD QP on an SRQ, and every
 * refusal typed and writing nothing.
 */
#include "ud_cases.h"

_Static_assert(sizeof(rdd_ah_attr) == 32, "rdd_ah_attr");
_Static_assert(sizeof(rdd_ud_drops) == 40, "rdd_ud_drops");
_Static_assert(sizeof(rdd_ud_send) == 80, "rdd_ud_send");
_Static_assert(sizeof(rdd_wc) == 48, "rdd_wc");

int main(void)
{
    return run_ud_tests("test_ud");
}
