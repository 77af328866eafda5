/* C11: the cross-process fabric cases of fabric_cases.h. */
#define _POSIX_C_SOURCE 200809L
#include "fabric_cases.h"

int main(void)
{
    return run_fabric_tests("test_fabric");
}
