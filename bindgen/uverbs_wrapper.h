/*
 * Input for bindgen under the `verbs` feature (see build.rs): the kernel's
 * uverbs command ABI and the rxe and siw driver ABIs, for the queue
 * creation in src/verbs/uverbs.rs (rdma-direct creates the CQs and QPs of
 * these two devices itself, with the legacy write() commands on the
 * context's command fd, so it can map their rings). build.rs allowlists
 * only the command bodies, responses, ring headers and element types used.
 * The headers are the kernel's UAPI export (Debian: linux-libc-dev).
 */
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_ioctl_verbs.h> /* enum ib_uverbs_qp_type */
#include <rdma/rdma_user_rxe.h>
#include <rdma/siw-abi.h>
