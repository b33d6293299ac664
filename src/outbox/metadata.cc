// Metadata: the outbox row's envelope JSON as sorted (key, value) string pairs.
//
// Contract (record.h): the input is what Go's json.Marshal(map[string]string)
// writes. Keys and values are fully unescaped; entries are sorted byte-wise
// by key and unique (last duplicate wins); a JSON null value is "". SQL NULL
// or a `null` document means no entries. Anything else is kPoison. Unpaired
// surrogate escapes, which PostgreSQL's json type accepts and simdjson does
// not, are rewritten to \ufffd in the padded copy first, as Go decodes them.
//
// Why simdjson's DOM API rather than On-Demand: DOM validates the whole
// document (structure, UTF-8, escapes, trailing content) before we look at a
// single value, so "valid" means exactly RFC 8259 and not "valid as far as we
// iterated". For a ~300-byte object of strings the cost difference is small.
//
// Memory: the padded input copy, the simdjson parser and the arena of
// unescaped strings all live in Impl and only grow, so parsing rows of a
// similar size does not allocate. Entries are kept as offsets into the arena
// and the string_view pairs are rebuilt after every change: the arena may
// reallocate when it grows, and views taken before that would dangle.
#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "json_type.h"
#include "outbox_relay/outbox/record.h"
#include "outbox_relay/outbox/watermill.h"
#include "text.h"

namespace outbox_relay::outbox {

namespace {

// Byte-wise order, as Go sorts map keys. Envelope keys mostly differ in their
// first byte, so that byte is compared inline before calling memcmp.
inline bool KeyLess(std::string_view a, std::string_view b) {
  if (!a.empty() && !b.empty() && a[0] != b[0]) {
    return static_cast<unsigned char>(a[0]) < static_cast<unsigned char>(b[0]);
  }
  return a < b;
}

}  // namespace

struct Metadata::Impl {
  // Where a string lives in `arena`.
  struct Span {
    size_t offset = 0;
    size_t size = 0;
  };
  struct Entry {
    Span key;
    Span value;
    size_t order = 0;  // position in the document, for last-wins on duplicates
  };

  simdjson::dom::parser parser;
  // A copy of the input followed by SIMDJSON_PADDING bytes, as simdjson reads
  // in SIMD blocks past the end. Zero-filled when (re)allocated so the padding
  // is never uninitialized memory.
  std::unique_ptr<char[]> input;
  size_t input_capacity = 0;
  std::string arena;           // unescaped keys and values
  std::vector<Entry> entries;  // sorted by key once a Parse or Set completes

  std::string_view View(Span s) const { return std::string_view(arena.data() + s.offset, s.size); }

  // std::less: a total order even for pointers into unrelated objects.
  bool Contains(std::string_view s) const {
    const std::less<const char*> less;
    return !s.empty() && !less(s.data(), arena.data()) &&
           !less(arena.data() + arena.size(), s.data() + s.size());
  }
  Span Reference(std::string_view s) const {
    return Span{static_cast<size_t>(s.data() - arena.data()), s.size()};
  }
  Span Append(std::string_view s) {
    Span span{arena.size(), s.size()};
    arena.append(s);
    return span;
  }

  // Rebuilds the views from the offsets (within capacity: no allocation).
  void PublishTo(std::vector<std::pair<std::string_view, std::string_view>>* out) const {
    out->clear();
    for (const Entry& e : entries) out->emplace_back(View(e.key), View(e.value));
  }

  void Reset() {
    arena.clear();
    entries.clear();
  }
};

Metadata::Metadata() : impl_(new Impl) {}

Metadata::~Metadata() { delete impl_; }

// entries_ views point into *impl_'s arena, which moves with the pointer.
Metadata::Metadata(Metadata&& other) noexcept
    : impl_(std::exchange(other.impl_, nullptr)), entries_(std::move(other.entries_)) {
  other.entries_.clear();
}

Metadata& Metadata::operator=(Metadata&& other) noexcept {
  if (this != &other) {
    std::swap(impl_, other.impl_);
    std::swap(entries_, other.entries_);
  }
  return *this;
}

Status Metadata::Parse(std::optional<std::string_view> json) {
  if (impl_ == nullptr) impl_ = new Impl;  // a moved-from Metadata is usable again
  Impl& im = *impl_;
  im.Reset();
  entries_.clear();
  if (!json) return Ok();

  const size_t needed = json->size() + simdjson::SIMDJSON_PADDING;
  if (needed > im.input_capacity) {
    const size_t capacity = std::max(needed, im.input_capacity * 2);
    im.input = std::make_unique<char[]>(capacity);
    im.input_capacity = capacity;
  }
  if (!json->empty()) std::memcpy(im.input.get(), json->data(), json->size());
  // Go decodes an unpaired surrogate escape as U+FFFD; simdjson rejects it.
  ReplaceLoneSurrogateEscapes(im.input.get(), json->size());

  simdjson::dom::element root;
  if (auto err =
          im.parser.parse(im.input.get(), json->size(), /*realloc_if_needed=*/false).get(root);
      err != simdjson::SUCCESS) {
    return Fail(ErrorCode::kPoison, "metadata is not valid JSON: {}", simdjson::error_message(err));
  }
  const auto root_type = root.type();
  if (root_type == simdjson::dom::element_type::NULL_VALUE) return Ok();
  if (root_type != simdjson::dom::element_type::OBJECT) {
    return Fail(ErrorCode::kPoison, "metadata is {}, expected a JSON object of strings",
                DescribeType(root_type));
  }

  // A named object: ranging over get_object().value_unsafe() would bind to a
  // member of a temporary that dies before the loop runs.
  simdjson::dom::object object;
  if (auto err = root.get_object().get(object); err != simdjson::SUCCESS) {
    return Fail(ErrorCode::kPoison, "metadata: {}", simdjson::error_message(err));
  }
  // Unescaped strings are never longer than their JSON text (quotes and
  // escapes only shrink), so all keys and values fit in json->size() bytes:
  // size the arena once and memcpy into it.
  std::string_view bad_key;
  auto bad_type = simdjson::dom::element_type::NULL_VALUE;
  im.arena.resize_and_overwrite(json->size(), [&](char* buf, size_t) {
    size_t used = 0;
    size_t order = 0;
    for (simdjson::dom::key_value_pair field : object) {
      std::string_view value;
      const auto type = field.value.type();
      if (type == simdjson::dom::element_type::STRING) {
        value = field.value.get_string().value_unsafe();
      } else if (type != simdjson::dom::element_type::NULL_VALUE) {
        bad_key = field.key;
        bad_type = type;
        return size_t{0};
      }
      const Impl::Span key_span{used, field.key.size()};
      if (!field.key.empty()) std::memcpy(buf + used, field.key.data(), field.key.size());
      used += field.key.size();
      const Impl::Span value_span{used, value.size()};
      if (!value.empty()) std::memcpy(buf + used, value.data(), value.size());
      used += value.size();
      im.entries.push_back(Impl::Entry{key_span, value_span, order++});
    }
    return used;
  });
  if (bad_type != simdjson::dom::element_type::NULL_VALUE) {
    im.Reset();
    return Fail(ErrorCode::kPoison, "metadata value for key \"{}{}\" is {}, expected a string",
                Shorten(bad_key), Ellipsis(bad_key), DescribeType(bad_type));
  }

  // Go writes keys sorted and unique, so the common case is one linear check.
  // Otherwise sort by (key, document order) and keep the last of each key.
  // std::sort, unlike std::stable_sort, never allocates.
  auto key_less = [&im](const Impl::Entry& a, const Impl::Entry& b) {
    return KeyLess(im.View(a.key), im.View(b.key));
  };
  bool strictly_sorted = true;
  for (size_t i = 1; i < im.entries.size() && strictly_sorted; ++i) {
    strictly_sorted = key_less(im.entries[i - 1], im.entries[i]);
  }
  if (!strictly_sorted) {
    std::sort(im.entries.begin(), im.entries.end(),
              [&im](const Impl::Entry& a, const Impl::Entry& b) {
                const int c = im.View(a.key).compare(im.View(b.key));
                return c < 0 || (c == 0 && a.order < b.order);
              });
    size_t out = 0;
    for (size_t i = 0; i < im.entries.size(); ++i) {
      const bool last_of_key = i + 1 == im.entries.size() ||
                               im.View(im.entries[i].key) != im.View(im.entries[i + 1].key);
      if (last_of_key) im.entries[out++] = im.entries[i];
    }
    im.entries.resize(out);
  }

  im.PublishTo(&entries_);
  return Ok();
}

void Metadata::Set(std::string_view key, std::string_view value) {
  if (impl_ == nullptr) impl_ = new Impl;
  Impl& im = *impl_;
  // Arguments that already point into the arena (say, a value from Get())
  // are referenced, not copied; they are resolved before anything is
  // appended, since an append can move the arena and them with it.
  const char* const arena_before = im.arena.data();
  const bool key_in_arena = im.Contains(key);
  const bool value_in_arena = im.Contains(value);
  Impl::Span key_span, value_span;
  if (key_in_arena) key_span = im.Reference(key);
  if (value_in_arena) value_span = im.Reference(value);
  if (!key_in_arena) key_span = im.Append(key);
  if (!value_in_arena) value_span = im.Append(value);

  const std::string_view stored_key = im.View(key_span);
  auto it = std::lower_bound(
      im.entries.begin(), im.entries.end(), stored_key,
      [&im](const Impl::Entry& e, std::string_view k) { return KeyLess(im.View(e.key), k); });
  const auto index = static_cast<size_t>(it - im.entries.begin());
  const bool replace = it != im.entries.end() && im.View(it->key) == stored_key;
  if (replace) {
    it->value = value_span;
  } else {
    im.entries.insert(it, Impl::Entry{key_span, value_span, im.entries.size()});
  }

  if (im.arena.data() != arena_before) {  // every view moved: rebuild them all
    im.PublishTo(&entries_);
  } else if (replace) {
    entries_[index].second = im.View(value_span);
  } else {
    entries_.emplace(entries_.begin() + static_cast<std::ptrdiff_t>(index), im.View(key_span),
                     im.View(value_span));
  }
}

std::optional<std::string_view> Metadata::Get(std::string_view key) const {
  // An envelope has a handful of keys: a linear scan comparing lengths first
  // beats a binary search of memcmp calls. Large objects get the search.
  if (entries_.size() <= 16) {
    for (const auto& [k, v] : entries_) {
      if (k == key) return v;
    }
    return std::nullopt;
  }
  auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                             [](const std::pair<std::string_view, std::string_view>& e,
                                std::string_view k) { return KeyLess(e.first, k); });
  if (it == entries_.end() || it->first != key) return std::nullopt;
  return it->second;
}

}  // namespace outbox_relay::outbox
