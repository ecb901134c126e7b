/* hashring/hold.c: the order in which held requests go to their pod (pcr/hold.h). */
#include "pcr/hold.h"

double pcr_hold_rank(uint64_t waited_us, uint64_t prefill_tokens)
{
    return (double)waited_us / ((double)prefill_tokens + PCR_HOLD_BASE_TOKENS);
}
