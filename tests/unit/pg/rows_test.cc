// pg::Rows: a bad cell (SQL NULL where a value is required, not a number,
// not a boolean, not there) is reported naming its row and column, never read
// as ""/0/false. Results are built in memory, as libpq would return them.
#include "outbox_relay/pg/rows.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

namespace outbox_relay::pg {
namespace {

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using OwnedResult = std::unique_ptr<PGresult, ResultDeleter>;

// One text column per name; rows of cells, nullptr for SQL NULL.
OwnedResult MakeResult(std::initializer_list<const char*> names,
                       std::initializer_list<std::initializer_list<const char*>> rows) {
  OwnedResult res(PQmakeEmptyPGresult(nullptr, PGRES_TUPLES_OK));
  std::vector<std::string> storage(names.begin(), names.end());
  std::vector<PGresAttDesc> attrs;
  for (std::string& name : storage) attrs.push_back({name.data(), 0, 0, 0, 25, -1, -1});
  EXPECT_TRUE(PQsetResultAttrs(res.get(), static_cast<int>(attrs.size()), attrs.data()));
  int row = 0;
  for (const auto& cells : rows) {
    int col = 0;
    for (const char* v : cells) {
      EXPECT_TRUE(PQsetvalue(res.get(), row, col++, const_cast<char*>(v),
                             v == nullptr ? -1 : static_cast<int>(std::strlen(v))));
    }
    ++row;
  }
  return res;
}

TEST(PgRows, ValidCellsAreRead) {
  auto res =
      MakeResult({"n", "b", "lsn", "s"}, {{"-42", "t", "0/16B3748", ""}, {"7", "f", "1/0", "x"}});
  Rows rows(res.get());
  EXPECT_EQ(rows.size(), 2);
  EXPECT_EQ(rows.columns(), 4);
  EXPECT_EQ(rows.Int(0, 0).value(), -42);
  EXPECT_EQ(rows.Int(1, 0).value(), 7);
  EXPECT_TRUE(rows.Bool(0, 1).value());
  EXPECT_FALSE(rows.Bool(1, 1).value());
  EXPECT_EQ(rows.LsnAt(0, 2).value(), Lsn(0x16B3748));
  EXPECT_EQ(rows.Text(0, 3).value(), "");  // an empty string is a value, not NULL
  EXPECT_EQ(rows.Value(1, 3), std::optional<std::string_view>("x"));
}

TEST(PgRows, NullCellIsReportedNotReadAsEmptyZeroOrFalse) {
  auto res = MakeResult({"count", "flag"}, {{nullptr, nullptr}});
  Rows rows(res.get());
  EXPECT_EQ(rows.Value(0, 0), std::nullopt);  // where NULL is expected
  for (Error e : {rows.Text(0, 0).error(), rows.Int(0, 0).error()}) {
    EXPECT_EQ(e.code, ErrorCode::kProtocol);
    EXPECT_EQ(e.message, "query result row 0 column 0 (count): NULL");
  }
  auto flag = rows.Bool(0, 1);
  ASSERT_FALSE(flag.has_value());
  EXPECT_EQ(flag.error().message, "query result row 0 column 1 (flag): NULL");
  EXPECT_FALSE(rows.LsnAt(0, 1).has_value());
}

TEST(PgRows, NonNumberIsReportedNotReadAsZero) {
  auto res = MakeResult({"n"}, {{"12abc"}, {"abc"}, {""}, {"1.5"}, {"99999999999999999999"}});
  Rows rows(res.get());
  for (int i = 0; i < rows.size(); ++i) {
    auto n = rows.Int(i, 0);
    ASSERT_FALSE(n.has_value()) << "row " << i << " read as " << *n;
    EXPECT_NE(n.error().message.find(fmt::format("row {} column 0 (n)", i)), std::string::npos)
        << n.error().message;
    EXPECT_NE(n.error().message.find("is not an integer"), std::string::npos);
  }
}

TEST(PgRows, NonBooleanAndBadLsnAreReported) {
  auto res = MakeResult({"b", "lsn"}, {{"true", "16B3748"}});
  Rows rows(res.get());
  auto b = rows.Bool(0, 0);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().message, "query result row 0 column 0 (b): 'true' is not a boolean");
  auto lsn = rows.LsnAt(0, 1);
  ASSERT_FALSE(lsn.has_value());
  EXPECT_NE(lsn.error().message.find("row 0 column 1 (lsn)"), std::string::npos);
}

TEST(PgRows, MissingRowOrColumnIsReported) {
  auto res = MakeResult({"a"}, {});
  Rows rows(res.get());
  EXPECT_EQ(rows.size(), 0);
  EXPECT_EQ(rows.Value(0, 0), std::nullopt);
  auto text = rows.Text(0, 0);
  ASSERT_FALSE(text.has_value());
  EXPECT_EQ(text.error().message, "query result row 0 column 0 (a): not there (0 rows, 1 columns)");
  EXPECT_FALSE(rows.Bool(0, 3).has_value());
  EXPECT_FALSE(Rows(nullptr).Int(0, 0).has_value());
}

TEST(PgRows, AffectedRowsWithoutACountIsAnError) {
  // A result built in memory has no command status, like a SELECT's.
  auto res = MakeResult({"a"}, {{"1"}});
  auto n = Rows(res.get()).AffectedRows();
  ASSERT_FALSE(n.has_value()) << "read as " << *n;
  EXPECT_NE(n.error().message.find("unexpected command status"), std::string::npos);
  EXPECT_FALSE(Rows(nullptr).AffectedRows().has_value());
}

TEST(PgRows, OptionalIntAndDouble) {
  auto res = MakeResult({"n", "x"}, {{nullptr, "12.5"}, {"7", "ten"}, {"seven", nullptr}});
  Rows rows(res.get());
  auto null_int = rows.OptionalInt(0, 0);
  ASSERT_TRUE(null_int.has_value());
  EXPECT_EQ(*null_int, std::nullopt);
  auto seven = rows.OptionalInt(1, 0);
  ASSERT_TRUE(seven.has_value());
  EXPECT_EQ(*seven, std::optional<int64_t>(7));
  auto bad_int = rows.OptionalInt(2, 0);
  ASSERT_FALSE(bad_int.has_value());
  EXPECT_NE(bad_int.error().message.find("'seven' is not an integer"), std::string::npos);
  EXPECT_EQ(rows.Double(0, 1), 12.5);
  EXPECT_EQ(rows.Double(1, 0), 7.0);
  auto bad = rows.Double(1, 1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("row 1 column 1 (x): 'ten' is not a number"),
            std::string::npos)
      << bad.error().message;
  EXPECT_FALSE(rows.Double(2, 1).has_value()) << "NULL is not 0";
}

TEST(PgRows, FirstErrorNamesTheFirstBadCellOfSeveral) {
  auto res = MakeResult({"a", "b", "c"}, {{"1", nullptr, "x"}});
  Rows rows(res.get());
  auto a = rows.Int(0, 0);
  auto b = rows.Bool(0, 1);
  auto c = rows.Int(0, 2);
  const Error* e = FirstError(a, b, c);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->message, "query result row 0 column 1 (b): NULL");
  auto t = rows.Text(0, 2);
  EXPECT_EQ(FirstError(a, t), nullptr);
}

}  // namespace
}  // namespace outbox_relay::pg
