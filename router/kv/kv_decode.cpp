// router/kv/kv_decode.cpp: vLLM's KV-cache event payloads (kv_decode.h), read through
// msgpack-c's event-driven parser (msgpack::parse with a visitor), checked whole, then handed
// out as plain C records.
//
// The visitor keeps a stack of what each open array or map is (the batch, its event list, an
// event, an event's hashes or tokens, or a value being skipped) and where it is in it, so each
// scalar is known by its place: a block hash, a token id, a field of an event. An event's
// fields are collected by name whatever the encoding (position for arrays, key for maps) and
// checked when the event closes.
#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>
#include <xxhash.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "kv_decode.h"
#include "pcr/common.h"

namespace {

enum Field {
    F_IGNORE, F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM, F_GROUP
};

enum Role { R_BATCH, R_BATCH_MAP, R_EVENTS, R_EV_ARRAY, R_EV_MAP, R_HASHES, R_TOKENS, R_SKIP };

// The batch's items by position: [ts, events, data_parallel_rank], or by key when the batch is
// a map ({"ts", "events", "data_parallel_rank"}, vLLM's publisher where EventBatch is not
// array_like); B_OTHER is a key this decoder does not know, skipped.
enum BatchSlot { B_TS = 0, B_EVENTS = 1, B_RANK = 2, B_OTHER = 3 };

struct Frame {
    Role role;
    uint32_t idx;      // items finished (arrays) or pairs finished (maps)
    bool in_key;       // maps: inside a key
    Field field;       // events: the field the next value fills
    BatchSlot slot;    // R_BATCH_MAP: the item the next value is
};

// An event being read; hashes and tokens go straight to the decoder's arrays.
struct Ev {
    int kind;          // pcr_kv_kind_t, 0 not said yet, -1 a type this decoder does not know
    uint32_t h_off, h_n, t_off, t_n;
    bool has_hashes, has_tokens, has_parent, has_lora, has_block_size;
    uint64_t parent;
    int64_t lora_id;
    uint32_t block_size;
    pcr_kv_medium_t medium;
    int32_t group_idx;
};

// Positional fields of the array encoding, after the tag.
const Field stored_pos[] = {F_HASHES, F_PARENT, F_TOKENS, F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM,
                            F_IGNORE /* lora_name */, F_IGNORE /* extra_keys */, F_GROUP};
const Field removed_pos[] = {F_HASHES, F_MEDIUM, F_GROUP};

Field field_named(const char *s, uint32_t n)
{
    // By length first: a map event has a key per field, and this runs for each.
    auto is = [&](const char *name) { return std::memcmp(s, name, n) == 0; };
    switch (n) {
    case 4:
        return is("type") ? F_TYPE : F_IGNORE;
    case 6:
        return is("medium") ? F_MEDIUM : F_IGNORE;
    case 7:
        return is("lora_id") ? F_LORA_ID : F_IGNORE;
    case 9:
        return is("token_ids") ? F_TOKENS : is("group_idx") ? F_GROUP : F_IGNORE;
    case 10:
        return is("block_size") ? F_BLOCK_SIZE : F_IGNORE;
    case 12:
        return is("block_hashes") ? F_HASHES : F_IGNORE;
    case 17:
        return is("parent_block_hash") ? F_PARENT : F_IGNORE;
    default:
        return F_IGNORE;
    }
}

int kind_named(const char *s, uint32_t n)
{
    if (n == 11 && std::memcmp(s, "BlockStored", 11) == 0)
        return PCR_KV_STORED;
    if (n == 12 && std::memcmp(s, "BlockRemoved", 12) == 0)
        return PCR_KV_REMOVED;
    if (n == 16 && std::memcmp(s, "AllBlocksCleared", 16) == 0)
        return PCR_KV_CLEARED;
    return -1;
}

}  // namespace

struct pcr_kv_decoder {
    std::vector<uint64_t> hashes;
    std::vector<uint32_t> tokens;
    std::vector<Ev> evs;
    std::vector<pcr_kv_event_t> out;
};

namespace {

// A scalar, as the visitor saw it.
struct Val {
    enum { NIL, UINT, NEG, FLOAT, STR, BIN, OTHER } t;
    uint64_t u;
    int64_t i;
    double f;
    const char *p;
    uint32_t n;
};

class Visitor : public msgpack::null_visitor {
  public:
    Visitor(pcr_kv_decoder &d) : d_(d) {}

    pcr_kv_batch_t batch{};
    char err[160] = "";
    int code = PCR_ERR_PARSE;

    bool visit_nil() { return scalar({Val::NIL, 0, 0, 0, nullptr, 0}); }
    bool visit_boolean(bool) { return scalar({Val::OTHER, 0, 0, 0, nullptr, 0}); }
    bool visit_positive_integer(uint64_t v) { return scalar({Val::UINT, v, 0, 0, nullptr, 0}); }
    bool visit_negative_integer(int64_t v) { return scalar({Val::NEG, 0, v, 0, nullptr, 0}); }
    bool visit_float32(float v) { return scalar({Val::FLOAT, 0, 0, v, nullptr, 0}); }
    bool visit_float64(double v) { return scalar({Val::FLOAT, 0, 0, v, nullptr, 0}); }
    bool visit_str(const char *v, uint32_t n) { return scalar({Val::STR, 0, 0, 0, v, n}); }
    bool visit_bin(const char *v, uint32_t n) { return scalar({Val::BIN, 0, 0, 0, v, n}); }
    bool visit_ext(const char *, uint32_t) { return scalar({Val::OTHER, 0, 0, 0, nullptr, 0}); }

    bool start_array(uint32_t) { return open(false); }
    bool start_map(uint32_t) { return open(true); }
    bool end_array_item()
    {
        stack_.back().idx++;
        return true;
    }
    bool start_map_key()
    {
        stack_.back().in_key = true;
        return true;
    }
    bool end_map_key()
    {
        stack_.back().in_key = false;
        return true;
    }
    bool end_map_value()
    {
        Frame &f = stack_.back();
        f.idx++;
        if (f.role == R_EV_MAP)
            f.field = F_IGNORE;
        f.slot = B_OTHER;
        return true;
    }
    bool end_array() { return close(); }
    bool end_map() { return close(); }
    void parse_error(size_t, size_t off)
    {
        if (!err[0])
            fail("malformed msgpack at byte %zu", off);
    }
    void insufficient_bytes(size_t, size_t off)
    {
        if (!err[0])
            fail("the payload ends inside a value (byte %zu)", off);
    }

  private:
    pcr_kv_decoder &d_;
    std::vector<Frame> stack_;
    Ev ev_{};
    bool root_done_ = false;
    unsigned batch_keys_ = 0;  // R_BATCH_MAP: the items given (1 << BatchSlot)

    bool fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)))
    {
        if (err[0])
            return false;
        va_list ap;
        va_start(ap, fmt);
        char msg[128];
        std::vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        uint32_t n = static_cast<uint32_t>(d_.evs.size() + batch.unknown);
        bool in_event = false;
        for (const Frame &f : stack_)
            in_event |= f.role == R_EV_ARRAY || f.role == R_EV_MAP;
        if (in_event)
            std::snprintf(err, sizeof(err), "event %u: %s", n, msg);
        else
            std::snprintf(err, sizeof(err), "%s", msg);
        return false;
    }

    bool too_large(unsigned limit, const char *what)
    {
        code = PCR_ERR_TOO_LARGE;
        return fail("more than %u %s", limit, what);
    }

    // The field an event's next value fills: by position in the array encoding.
    Field positional(const Frame &f) const
    {
        uint32_t i = f.idx - 1;  // after the tag
        if (ev_.kind == PCR_KV_STORED)
            return i < PCR_ARRAY_SIZE(stored_pos) ? stored_pos[i] : F_IGNORE;
        if (ev_.kind == PCR_KV_REMOVED)
            return i < PCR_ARRAY_SIZE(removed_pos) ? removed_pos[i] : F_IGNORE;
        return F_IGNORE;
    }

    // What the value about to open or arrive is: the field of the innermost event.
    Field value_field(const Frame &f) const
    {
        return f.role == R_EV_ARRAY ? (f.idx == 0 ? F_TYPE : positional(f)) : f.field;
    }

    bool open(bool is_map)
    {
        if (stack_.size() >= PCR_KV_MAX_DEPTH)
            return too_large(PCR_KV_MAX_DEPTH, "levels of nesting");
        Role role;
        if (stack_.empty()) {
            if (root_done_)
                return fail("the payload is not an array [ts, events, rank]");
            role = is_map ? R_BATCH_MAP : R_BATCH;
        } else {
            Frame &p = stack_.back();
            switch (p.role) {
            case R_BATCH:
                if (p.idx != 1 || is_map)
                    return fail("batch item %u must be %s", p.idx,
                                p.idx == 1 ? "an array of events" : "a scalar");
                role = R_EVENTS;
                break;
            case R_BATCH_MAP:
                if (p.in_key)
                    return fail("a map key must be a string");
                if (p.slot == B_OTHER) {
                    role = R_SKIP;
                    break;
                }
                if (p.slot != B_EVENTS || is_map)
                    return fail("the batch's %s must be %s", p.slot == B_EVENTS ? "events" : "ts or rank",
                                p.slot == B_EVENTS ? "an array" : "a scalar");
                role = R_EVENTS;
                break;
            case R_EVENTS:
                if (d_.evs.size() + batch.unknown >= PCR_KV_MAX_EVENTS)
                    return too_large(PCR_KV_MAX_EVENTS, "events in a batch");
                ev_ = Ev{};
                ev_.h_off = static_cast<uint32_t>(d_.hashes.size());
                ev_.t_off = static_cast<uint32_t>(d_.tokens.size());
                ev_.group_idx = -1;
                role = is_map ? R_EV_MAP : R_EV_ARRAY;
                break;
            case R_EV_ARRAY:
            case R_EV_MAP: {
                if (p.role == R_EV_MAP && p.in_key)
                    return fail("a map key must be a string");
                Field f = value_field(p);
                if (f == F_IGNORE) {
                    role = R_SKIP;
                } else if ((f == F_HASHES || f == F_TOKENS) && !is_map) {
                    bool &seen = f == F_HASHES ? ev_.has_hashes : ev_.has_tokens;
                    if (seen)
                        return fail("%s given twice", f == F_HASHES ? "block_hashes" : "token_ids");
                    seen = true;
                    role = f == F_HASHES ? R_HASHES : R_TOKENS;
                } else {
                    return fail("a field that takes a scalar holds a %s", is_map ? "map" : "array");
                }
                break;
            }
            case R_SKIP:
                role = R_SKIP;
                break;
            default:
                return fail("%s hold a nested %s", p.role == R_HASHES ? "block_hashes" : "token_ids",
                            is_map ? "map" : "array");
            }
        }
        stack_.push_back(Frame{role, 0, false, F_IGNORE, B_OTHER});
        return true;
    }

    bool close()
    {
        Frame f = stack_.back();
        if ((f.role == R_EV_ARRAY || f.role == R_EV_MAP) && !finish_event())
            return false; /* checked while still inside the event, for the message */
        stack_.pop_back();
        if (f.role == R_BATCH) {
            root_done_ = true;
            if (f.idx < 2 || f.idx > 3)
                return fail("a batch is [ts, events, rank], not %u items", f.idx);
        }
        if (f.role == R_BATCH_MAP) {
            root_done_ = true;
            if (!(batch_keys_ & (1u << B_EVENTS)))
                return fail("a batch map without \"events\"");
        }
        return true;
    }

    bool finish_event()
    {
        Ev &e = ev_;
        e.h_n = static_cast<uint32_t>(d_.hashes.size()) - e.h_off;
        e.t_n = static_cast<uint32_t>(d_.tokens.size()) - e.t_off;
        if (e.kind == 0)
            return fail("an event without its type");
        if (e.kind < 0) {
            d_.hashes.resize(e.h_off);  // its values are not kept
            d_.tokens.resize(e.t_off);
            batch.unknown++;
            return true;
        }
        if (e.kind != PCR_KV_CLEARED && !e.has_hashes)
            return fail("no block_hashes");
        if (e.kind == PCR_KV_STORED) {
            if (!e.has_tokens || !e.has_block_size)
                return fail("BlockStored without %s", e.has_tokens ? "block_size" : "token_ids");
            if (e.h_n == 0)
                return fail("BlockStored with no block");
            if (static_cast<uint64_t>(e.h_n) * e.block_size != e.t_n)
                return fail("BlockStored: %u tokens for %u blocks of %u", e.t_n, e.h_n,
                            e.block_size);
        } else if (e.t_n != 0) {
            return fail("token_ids on an event that takes none");
        }
        d_.evs.push_back(e);
        return true;
    }

    bool hash_of(const Val &v, uint64_t *h)
    {
        switch (v.t) {
        case Val::UINT:
            *h = v.u;
            return true;
        case Val::NEG:
            *h = static_cast<uint64_t>(v.i);
            return true;
        case Val::BIN:
            if (v.n == 0 || v.n > 64)
                return fail("a block hash of %u bytes", v.n);
            *h = XXH3_64bits(v.p, v.n);
            return true;
        default:
            return fail("a block hash must be an integer or bytes");
        }
    }

    bool set_field(Field f, const Val &v)
    {
        Ev &e = ev_;
        switch (f) {
        case F_IGNORE:
            return true;
        case F_TYPE:
            if (v.t != Val::STR)
                return fail("the event type must be a string");
            if (e.kind != 0)
                return fail("the event type given twice");
            e.kind = kind_named(v.p, v.n);
            return true;
        case F_HASHES:
        case F_TOKENS:
            return fail("%s must be an array", f == F_HASHES ? "block_hashes" : "token_ids");
        case F_PARENT:
            if (v.t == Val::NIL)
                return true;
            e.has_parent = true;
            return hash_of(v, &e.parent);
        case F_BLOCK_SIZE:
            if (v.t != Val::UINT || v.u == 0 || v.u > 65536)
                return fail("block_size must be an integer from 1 to 65536");
            e.block_size = static_cast<uint32_t>(v.u);
            e.has_block_size = true;
            return true;
        case F_LORA_ID:
            if (v.t == Val::NIL)
                return true;
            if (v.t != Val::UINT && v.t != Val::NEG)
                return fail("lora_id must be an integer");
            e.has_lora = true;
            e.lora_id = v.t == Val::UINT ? static_cast<int64_t>(v.u) : v.i;
            return true;
        case F_MEDIUM:
            if (v.t == Val::NIL)
                return true;
            if (v.t != Val::STR)
                return fail("medium must be a string");
            e.medium = v.n == 3 && std::memcmp(v.p, "GPU", 3) == 0   ? PCR_KV_MEDIUM_GPU
                       : v.n == 3 && std::memcmp(v.p, "CPU", 3) == 0 ? PCR_KV_MEDIUM_CPU
                                                                     : PCR_KV_MEDIUM_OTHER;
            return true;
        case F_GROUP:
            if (v.t == Val::NIL)
                return true;
            if (v.t != Val::UINT || v.u > INT32_MAX)
                return fail("group_idx must be a small non-negative integer");
            e.group_idx = static_cast<int32_t>(v.u);
            return true;
        }
        return true;
    }

    bool batch_key(Frame &f, const Val &v)
    {
        if (v.t != Val::STR)
            return fail("a map key must be a string");
        auto is = [&](const char *name) {
            return v.n == std::strlen(name) && std::memcmp(v.p, name, v.n) == 0;
        };
        f.slot = is("ts") ? B_TS : is("events") ? B_EVENTS : is("data_parallel_rank") ? B_RANK
                                                                                       : B_OTHER;
        if (f.slot != B_OTHER && (batch_keys_ & (1u << f.slot)))
            return fail("the batch's \"%.*s\" given twice", static_cast<int>(v.n), v.p);
        batch_keys_ |= 1u << f.slot;
        return true;
    }

    bool scalar(const Val &v)
    {
        if (stack_.empty())
            return fail("the payload is not an array [ts, events, rank]");
        Frame &f = stack_.back();
        uint32_t item = f.idx;
        if (f.role == R_BATCH_MAP) {
            if (f.in_key)
                return batch_key(f, v);
            if (f.slot == B_OTHER)
                return true;
            item = f.slot; /* then read as the array's item of the same place */
        }
        switch (f.role) {
        case R_BATCH:
        case R_BATCH_MAP:
            if (item == 0) {
                if (v.t == Val::FLOAT)
                    batch.ts = v.f;
                else if (v.t == Val::UINT)
                    batch.ts = static_cast<double>(v.u);
                else
                    return fail("the batch's ts must be a number");
                return true;
            }
            if (item == 2) {
                if (v.t == Val::NIL)
                    return true;
                if (v.t != Val::UINT)
                    return fail("the data-parallel rank must be a non-negative integer");
                batch.has_rank = 1;
                batch.dp_rank = static_cast<int64_t>(v.u > INT64_MAX ? INT64_MAX : v.u);
                return true;
            }
            return fail("batch item %u must be %s", item,
                        item == 1 ? "an array of events" : "absent");
        case R_EVENTS:
            return fail("an event must be an array or a map");
        case R_EV_MAP:
            if (f.in_key) {
                if (v.t != Val::STR)
                    return fail("a map key must be a string");
                f.field = field_named(v.p, v.n);
                return true;
            }
            return set_field(f.field, v);
        case R_EV_ARRAY:
            if (f.idx == 0 && v.t != Val::STR)
                return fail("an event array must start with its type");
            return set_field(value_field(f), v);
        case R_HASHES: {
            uint64_t h;
            if (!hash_of(v, &h))
                return false;
            d_.hashes.push_back(h);
            return true;
        }
        case R_TOKENS:
            if (v.t != Val::UINT || v.u > UINT32_MAX)
                return fail("a token id must be an integer from 0 to 2^32-1");
            d_.tokens.push_back(static_cast<uint32_t>(v.u));
            return true;
        case R_SKIP:
            return true;
        }
        return true;
    }
};

}  // namespace

extern "C" pcr_kv_decoder_t *pcr_kv_decoder_new(void)
{
    return new (std::nothrow) pcr_kv_decoder();
}

extern "C" void pcr_kv_decoder_free(pcr_kv_decoder_t *d) { delete d; }

extern "C" int pcr_kv_decode(pcr_kv_decoder_t *d, const void *payload, size_t len,
                             pcr_kv_batch_t *out, char *err, size_t errlen)
{
    std::memset(out, 0, sizeof(*out));
    if (errlen)
        err[0] = '\0';
    d->hashes.clear();
    d->tokens.clear();
    d->evs.clear();
    d->out.clear();
    int rc = 0;
    try {
        Visitor v(*d);
        size_t off = 0;
        bool ok = msgpack::parse(static_cast<const char *>(payload), len, off, v);
        if (ok && off != len)
            ok = false, std::snprintf(v.err, sizeof(v.err), "%zu bytes after the batch", len - off);
        if (!ok) {
            if (!v.err[0])
                std::snprintf(v.err, sizeof(v.err), "malformed msgpack");
            rc = v.code;
            if (errlen)
                std::snprintf(err, errlen, "%s", v.err);
        } else {
            *out = v.batch;
            d->out.reserve(d->evs.size());
            for (const Ev &e : d->evs) {
                pcr_kv_event_t o{};
                o.kind = static_cast<pcr_kv_kind_t>(e.kind);
                o.medium = e.medium;
                o.hashes = e.h_n ? d->hashes.data() + e.h_off : nullptr;
                o.nhashes = e.h_n;
                o.block_size = e.block_size;
                o.tokens = e.t_n ? d->tokens.data() + e.t_off : nullptr;
                o.ntokens = e.t_n;
                o.has_parent = e.has_parent;
                o.parent = e.parent;
                o.has_lora = e.has_lora;
                o.lora_id = e.lora_id;
                o.group_idx = e.group_idx;
                d->out.push_back(o);
            }
            out->nevents = static_cast<uint32_t>(d->out.size());
        }
    } catch (const std::bad_alloc &) {
        rc = PCR_ERR_NOMEM;
        if (errlen)
            std::snprintf(err, errlen, "out of memory");
    } catch (...) {
        rc = PCR_ERR_PARSE;
        if (errlen)
            std::snprintf(err, errlen, "malformed msgpack");
    }
    if (rc != 0) {
        d->evs.clear();
        d->out.clear();
        std::memset(out, 0, sizeof(*out));
    }
    return rc;
}

extern "C" const pcr_kv_event_t *pcr_kv_decoded_event(const pcr_kv_decoder_t *d, uint32_t i)
{
    return i < d->out.size() ? &d->out[i] : nullptr;
}

extern "C" int pcr_kv_seq(const void *frame, size_t len, int64_t *seq)
{
    if (len != 8)
        return PCR_ERR_PARSE;
    const unsigned char *b = static_cast<const unsigned char *>(frame);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    *seq = static_cast<int64_t>(v);
    return 0;
}
