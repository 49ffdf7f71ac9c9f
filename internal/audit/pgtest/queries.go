package pgtest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// readmeQuery is an audit query of the README: its marker names it, a sql block follows.
var readmeQuery = regexp.MustCompile("(?s)<!-- audit-query: ([^>]+?) -->\n```sql\n(.*?)```")

// READMEQueries returns the audit queries of the README at path, by the name in their marker;
// it fails t unless there are the five the README promises.
func READMEQueries(t testing.TB, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range readmeQuery.FindAllStringSubmatch(string(data), -1) {
		out[m[1]] = m[2]
	}
	if len(out) != 5 {
		names := slices.Sorted(func(yield func(string) bool) {
			for k := range out {
				if !yield(k) {
					return
				}
			}
		})
		t.Fatalf("%s has %d audit queries, want 5: %q", path, len(out), names)
	}
	return out
}

// Rows runs sql and returns its rows as text, one line per row, its cells joined by " | "
// (numerics as floats, intervals as durations).
func Rows(t testing.TB, db *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		cells := make([]string, 0, len(vals))
		for _, v := range vals {
			switch v := v.(type) {
			case pgtype.Numeric:
				f, _ := v.Float64Value()
				cells = append(cells, fmt.Sprint(f.Float64))
			case pgtype.Interval:
				cells = append(cells, (time.Duration(v.Microseconds) * time.Microsecond).String())
			default:
				cells = append(cells, fmt.Sprint(v))
			}
		}
		out = append(out, strings.Join(cells, " | "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
