/*
 * spm_shim.cc - spm_shim.h over Debian's libsentencepiece (C++): the only C++ file of the
 * tool, built when meson's 'sentencepiece' feature finds the library. No C++ exception or
 * object crosses the interface: every call catches what the library or the standard
 * library may throw (std::bad_alloc becomes -3).
 *
 * Layout: the processor, the decoded text of every piece in one string with offsets (so
 * spm_token_bytes hands out stable pointers), and the control/unknown pieces' texts for
 * the specials cut, longest first.
 */
#include "spm_shim.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

struct spm {
    sentencepiece::SentencePieceProcessor proc;
    std::string dec;                 /* decoded pieces, concatenated */
    std::vector<uint32_t> off;       /* by id: start in dec; off[id + 1] its end */
    std::vector<std::pair<std::string, uint32_t>> specials; /* longest first */
    std::string bos, eos;
};

extern "C" bool spm_available(void)
{
    return true;
}

static std::string decode_piece(const sentencepiece::SentencePieceProcessor &p, int id)
{
    const std::string &s = p.IdToPiece(id);
    if (p.IsByte(id) && s.size() == 6)
        return std::string(1, (char)std::strtoul(s.c_str() + 3, nullptr, 16));
    if (p.IsControl(id) || p.IsUnknown(id))
        return s;
    std::string out;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 3, "\xe2\x96\x81") == 0) {
            out += ' ';
            i += 3;
        } else {
            out += s[i++];
        }
    }
    return out;
}

extern "C" int spm_load(const char *path, spm **out, char *err, size_t err_size)
{
    try {
        spm *t = new spm;
        auto st = t->proc.Load(path);
        if (!st.ok()) {
            std::snprintf(err, err_size, "%s: not a SentencePiece model: %s", path,
                          st.ToString().c_str());
            delete t;
            return -1;
        }
        int n = t->proc.GetPieceSize();
        t->off.reserve((size_t)n + 1);
        for (int id = 0; id < n; id++) {
            t->off.push_back((uint32_t)t->dec.size());
            t->dec += decode_piece(t->proc, id);
            if ((t->proc.IsControl(id) || t->proc.IsUnknown(id)) && !t->proc.IdToPiece(id).empty())
                t->specials.emplace_back(t->proc.IdToPiece(id), (uint32_t)id);
        }
        t->off.push_back((uint32_t)t->dec.size());
        std::stable_sort(t->specials.begin(), t->specials.end(),
                         [](const auto &a, const auto &b) { return a.first.size() > b.first.size(); });
        if (t->proc.bos_id() >= 0)
            t->bos = t->proc.IdToPiece(t->proc.bos_id());
        if (t->proc.eos_id() >= 0)
            t->eos = t->proc.IdToPiece(t->proc.eos_id());
        *out = t;
        return 0;
    } catch (const std::bad_alloc &) {
        std::snprintf(err, err_size, "%s: out of memory", path);
        return -3;
    } catch (...) {
        std::snprintf(err, err_size, "%s: the SentencePiece library failed", path);
        return -1;
    }
}

extern "C" void spm_free(spm *t)
{
    delete t;
}

extern "C" size_t spm_n_pieces(const spm *t)
{
    return t->off.size() - 1;
}

extern "C" const char *spm_bos(const spm *t)
{
    return t->bos.c_str();
}

extern "C" const char *spm_eos(const spm *t)
{
    return t->eos.c_str();
}

extern "C" bool spm_special(const spm *t, const char *text, size_t len, uint32_t *id)
{
    for (const auto &s : t->specials)
        if (s.first.size() == len && std::memcmp(s.first.data(), text, len) == 0) {
            if (id != nullptr)
                *id = s.second;
            return true;
        }
    return false;
}

static bool push(uint32_t **ids, uint32_t **offs, size_t *n, size_t *cap, uint32_t id, uint32_t o)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        uint32_t *a = (uint32_t *)std::realloc(*ids, c * sizeof *a);
        if (a == nullptr)
            return false;
        *ids = a;
        uint32_t *b = (uint32_t *)std::realloc(*offs, c * sizeof *b);
        if (b == nullptr)
            return false;
        *offs = b;
        *cap = c;
    }
    (*ids)[*n] = id;
    (*offs)[*n] = o;
    (*n)++;
    return true;
}

/* Encode text[from, to) with the processor. */
static bool encode_stretch(spm *t, const char *text, size_t from, size_t to, uint32_t base,
                           uint32_t **ids, uint32_t **offs, size_t *n, size_t *cap)
{
    if (to == from)
        return true;
    auto r = t->proc.EncodeAsImmutableProto(std::string_view(text + from, to - from));
    for (size_t i = 0; i < r.pieces_size(); i++) {
        auto p = r.pieces((int)i);
        if (!push(ids, offs, n, cap, p.id(), base + (uint32_t)(from + p.begin())))
            return false;
    }
    return true;
}

extern "C" int spm_encode(spm *t, const char *text, size_t len, bool specials, uint32_t base,
                          uint32_t **ids, uint32_t **offs, size_t *n, size_t *cap, char *err,
                          size_t err_size)
{
    try {
        size_t from = 0;
        for (size_t i = 0; specials && i < len; i++) {
            for (const auto &s : t->specials) {
                if (s.first.size() > len - i || std::memcmp(text + i, s.first.data(), s.first.size()))
                    continue;
                if (!encode_stretch(t, text, from, i, base, ids, offs, n, cap) ||
                    !push(ids, offs, n, cap, s.second, base + (uint32_t)i))
                    throw std::bad_alloc();
                i += s.first.size() - 1;
                from = i + 1;
                break;
            }
        }
        if (!encode_stretch(t, text, from, len, base, ids, offs, n, cap))
            throw std::bad_alloc();
        return 0;
    } catch (...) {
        std::snprintf(err, err_size, "out of memory");
        return -3;
    }
}

extern "C" bool spm_token_bytes(const spm *t, uint32_t id, const char **p, size_t *len)
{
    if ((size_t)id + 1 >= t->off.size())
        return false;
    *p = t->dec.data() + t->off[id];
    *len = t->off[id + 1] - t->off[id];
    return true;
}
