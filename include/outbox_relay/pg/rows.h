// Reading query results: a typed, checked view of a PGresult, and the
// conversion of SQL rows into the pgoutput structures RecordMapper reads (the
// backfill and replay publish table rows exactly as streamed ones).
//
// Every getter says which row and column it could not read, and why (SQL
// NULL, out of range, not a number), instead of handing out a raw pointer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/core/lsn.h"
#include "outbox_relay/core/result.h"
#include "outbox_relay/pg/connection.h"
#include "outbox_relay/pgoutput/messages.h"

namespace outbox_relay::pg {

class Rows {
 public:
  explicit Rows(const PGresult* res) : res_(res) {}

  int size() const;
  int columns() const;
  // nullopt for SQL NULL (or a cell that is not there).
  std::optional<std::string_view> Value(int row, int col) const;
  // Value, copied: for a cell kept past the result (NULL in some states).
  std::optional<std::string> OptionalText(int row, int col) const;
  Result<std::string_view> Text(int row, int col) const;  // error on NULL
  Result<int64_t> Int(int row, int col) const;
  // A column that may be NULL: nullopt for NULL, an error for a non-number.
  Result<std::optional<int64_t>> OptionalInt(int row, int col) const;
  Result<double> Double(int row, int col) const;  // numeric or float text
  Result<bool> Bool(int row, int col) const;      // 't' / 'f'
  Result<Lsn> LsnAt(int row, int col) const;      // "X/Y"
  // The rows an INSERT, UPDATE or DELETE touched (PQcmdTuples); an error
  // when the command status carries no count.
  Result<int64_t> AffectedRows() const;

 private:
  Error Bad(int row, int col, std::string_view why) const;
  const PGresult* res_;
};

// The first error among cells read with the getters above, nullptr when all
// were read: for code that reads a row's cells into locals, then reports one
// failure (as it reports a failed query) before using any of them.
template <typename... Cells>
const Error* FirstError(const Cells&... cells) {
  const Error* first = nullptr;
  auto note = [&first](const auto& cell) {
    if (first == nullptr && !cell.has_value()) first = &cell.error();
  };
  (note(cells), ...);
  return first;
}

// The result's columns as a Relation (names, type OIDs and modifiers).
pgoutput::Relation RelationOf(const PGresult* res);
// Row `row` as text-format TupleData (views into `res`).
void TupleOf(const PGresult* res, int row, pgoutput::TupleData* out);

}  // namespace outbox_relay::pg
