#include "outbox_relay/pg/rows.h"

#include <charconv>

namespace outbox_relay::pg {

int Rows::size() const { return res_ != nullptr ? PQntuples(res_) : 0; }

int Rows::columns() const { return res_ != nullptr ? PQnfields(res_) : 0; }

std::optional<std::string_view> Rows::Value(int row, int col) const {
  if (row < 0 || row >= size() || col < 0 || col >= columns()) return std::nullopt;
  return GetValue(res_, row, col);
}

std::optional<std::string> Rows::OptionalText(int row, int col) const {
  auto v = Value(row, col);
  return v ? std::optional<std::string>(std::string(*v)) : std::nullopt;
}

Error Rows::Bad(int row, int col, std::string_view why) const {
  const char* name = col >= 0 && col < columns() ? PQfname(res_, col) : "?";
  return Error{ErrorCode::kProtocol,
               fmt::format("query result row {} column {} ({}): {}", row, col, name, why)};
}

Result<std::string_view> Rows::Text(int row, int col) const {
  if (row < 0 || row >= size() || col < 0 || col >= columns()) {
    return std::unexpected(
        Bad(row, col, fmt::format("not there ({} rows, {} columns)", size(), columns())));
  }
  auto v = GetValue(res_, row, col);
  if (!v) return std::unexpected(Bad(row, col, "NULL"));
  return *v;
}

Result<int64_t> Rows::Int(int row, int col) const {
  auto text = Text(row, col);
  if (!text) return std::unexpected(text.error());
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || end != text->data() + text->size()) {
    return std::unexpected(
        Bad(row, col, fmt::format("'{}' is not an integer", text->substr(0, 40))));
  }
  return v;
}

Result<std::optional<int64_t>> Rows::OptionalInt(int row, int col) const {
  if (!Value(row, col)) return std::optional<int64_t>();
  auto v = Int(row, col);
  if (!v) return std::unexpected(v.error());
  return std::optional<int64_t>(*v);
}

Result<double> Rows::Double(int row, int col) const {
  auto text = Text(row, col);
  if (!text) return std::unexpected(text.error());
  double v = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || end != text->data() + text->size()) {
    return std::unexpected(Bad(row, col, fmt::format("'{}' is not a number", text->substr(0, 40))));
  }
  return v;
}

Result<bool> Rows::Bool(int row, int col) const {
  auto text = Text(row, col);
  if (!text) return std::unexpected(text.error());
  if (*text == "t") return true;
  if (*text == "f") return false;
  return std::unexpected(Bad(row, col, fmt::format("'{}' is not a boolean", text->substr(0, 40))));
}

Result<Lsn> Rows::LsnAt(int row, int col) const {
  auto text = Text(row, col);
  if (!text) return std::unexpected(text.error());
  auto lsn = Lsn::Parse(*text);
  if (!lsn) return std::unexpected(Bad(row, col, lsn.error().message));
  return *lsn;
}

Result<int64_t> Rows::AffectedRows() const {
  std::string_view text = res_ != nullptr ? PQcmdTuples(const_cast<PGresult*>(res_)) : "";
  int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return Fail(ErrorCode::kProtocol, "unexpected command status '{}' (no row count)",
                text.substr(0, 40));
  }
  return n;
}

pgoutput::Relation RelationOf(const PGresult* res) {
  pgoutput::Relation relation;
  const int n = PQnfields(res);
  relation.columns.reserve(static_cast<size_t>(n));
  for (int col = 0; col < n; ++col) {
    relation.columns.push_back(
        {0, PQfname(res, col), static_cast<pgoutput::Oid>(PQftype(res, col)), PQfmod(res, col)});
  }
  return relation;
}

void TupleOf(const PGresult* res, int row, pgoutput::TupleData* out) {
  const int n = PQnfields(res);
  out->values.resize(static_cast<size_t>(n));
  for (int col = 0; col < n; ++col) {
    auto v = GetValue(res, row, col);
    out->values[static_cast<size_t>(col)] =
        v ? pgoutput::TupleValue{pgoutput::TupleValue::Kind::kText, *v} : pgoutput::TupleValue{};
  }
}

}  // namespace outbox_relay::pg
