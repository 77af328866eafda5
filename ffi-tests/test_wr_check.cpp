// rdd_wr_check from C++: the shared cases (wr_check_cases.h), plus a
// check of a std::array of requests through the header's C++ view.
#include <array>
#include <cstdint>

#include "wr_check_cases.h"

int main()
{
    wc_run_cases();
    std::array<rdd_wr, 2> wrs{};
    wrs[0] = wc_wr(RDD_WR_SEND, RDD_SEND_SIGNALED, nullptr, 0);
    wrs[1] = wc_wr(RDD_WR_RDMA_WRITE, 0, wc_sges, 3);
    std::size_t bad = WC_UNTOUCHED;
    CHECK_EQ(rdd_wr_check(&WC_CAPS, wrs.data(), wrs.size(), &bad), RDD_STATUS_TOO_MANY_SGES);
    CHECK_EQ(bad, 1);
    return h_finish("test_wr_check_cpp");
}
