/* rdd_wr_check from C: every status, and the same verdict as a post
 * (the cases are in wr_check_cases.h, shared with the C++ test). */
#include "wr_check_cases.h"

int main(void)
{
    wc_run_cases();
    return h_finish("test_wr_check");
}
