/* hashring/overload.c: the overload actions' thresholds and their hysteresis (pcr/overload.h). */
#include "pcr/overload.h"

static const unsigned thresholds[PCR_OVERLOAD__COUNT] = {800, 900, 950};
static const char *const names[PCR_OVERLOAD__COUNT] = {"shrink_windows", "refuse_requests",
                                                       "stop_accepting"};

unsigned pcr_overload_threshold(pcr_overload_action_t a)
{
    return (unsigned)a < PCR_OVERLOAD__COUNT ? thresholds[a] : 0;
}

const char *pcr_overload_action_name(pcr_overload_action_t a)
{
    return (unsigned)a < PCR_OVERLOAD__COUNT ? names[a] : "unknown";
}

/* accounted >= limit * permille / 1000, without overflow for any 64-bit values. */
static int at_least(uint64_t accounted, uint64_t limit, unsigned permille)
{
    return (unsigned __int128)accounted * 1000 >= (unsigned __int128)limit * permille;
}

unsigned pcr_overload_decide(uint64_t accounted, uint64_t limit, unsigned active)
{
    if (limit == 0)
        return 0;
    unsigned on = 0;
    /* From the top: an action on turns every one below it on too. */
    for (int a = PCR_OVERLOAD__COUNT - 1; a >= 0; a--) {
        unsigned bit = PCR_OVERLOAD_BIT(a);
        unsigned th = thresholds[a];
        unsigned stay = th > PCR_OVERLOAD_MARGIN ? th - PCR_OVERLOAD_MARGIN : 0;
        if (on != 0 || at_least(accounted, limit, th) ||
            ((active & bit) && at_least(accounted, limit, stay)))
            on |= bit;
    }
    return on;
}
