// router/body/body_raw.cpp: router/body/body_raw.h with simdjson's On-Demand parser: the body is
// walked once, its fields' values found where they are and never copied into a tree.
#include <simdjson.h>

#include <cstring>
#include <utility>

#include "body_raw.h"

using namespace simdjson;

// The value's JSON text and kind; an object is refused (no field we copy is one).
static error_code raw_of(ondemand::value v, std::string_view *raw, pcr_raw_type_t *type)
{
    ondemand::json_type t;
    error_code e = v.type().get(t);
    if (e != SUCCESS)
        return e;
    switch (t) {
    case ondemand::json_type::array: {
        ondemand::array a;
        *type = PCR_RAW_ARRAY;
        e = v.get_array().get(a);
        return e != SUCCESS ? e : a.raw_json().get(*raw);
    }
    case ondemand::json_type::object:
        return INCORRECT_TYPE;
    case ondemand::json_type::string:
        *type = PCR_RAW_STRING;
        break;
    case ondemand::json_type::boolean:
        *type = PCR_RAW_BOOL;
        break;
    default:
        *type = PCR_RAW_OTHER;
        break;
    }
    *raw = v.raw_json_token();
    return SUCCESS;
}

static int find(const char *json, size_t len, const char *const *names, size_t n,
                pcr_body_raw_t *out)
{
    // One per thread: its buffers grow to the largest body and stay.
    static thread_local ondemand::parser parser;
    padded_string doc(json, len);  // simdjson reads past the end: a padded copy
    ondemand::document d;
    ondemand::object obj;
    if (parser.iterate(doc).get(d) != SUCCESS || d.get_object().get(obj) != SUCCESS)
        return -1;
    for (auto f : obj) {
        ondemand::field field;
        std::string_view key;
        if (std::move(f).get(field) != SUCCESS || field.unescaped_key().get(key) != SUCCESS)
            return -1;
        size_t i = 0;
        while (i < n && key != names[i])
            i++;
        if (i == n)
            continue;  // the iterator skips the value
        std::string_view raw;
        pcr_raw_type_t type = PCR_RAW_OTHER;
        if (raw_of(field.value(), &raw, &type) != SUCCESS)
            return -1;
        out[i] = pcr_body_raw_t{json + (raw.data() - doc.data()), raw.size(), type};
    }
    return 0;
}

extern "C" int pcr_body_raw_fields(const char *json, size_t len, const char *const *names,
                                   size_t n, pcr_body_raw_t *out)
{
    int rc = -1;
    for (size_t i = 0; i < n; i++)
        out[i] = pcr_body_raw_t{nullptr, 0, PCR_RAW_NONE};
    try {
        rc = find(json, len, names, n, out);
    } catch (...) {
        rc = -1;  // nothing may cross into C
    }
    if (rc != 0)
        for (size_t i = 0; i < n; i++)
            out[i] = pcr_body_raw_t{nullptr, 0, PCR_RAW_NONE};
    return rc;
}
