package app

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// writeList prints items as JSON lines, or as a table: header, then one row per item (columns
// separated by tabs), or the line empty when there are none.
func writeList[T any](w io.Writer, asJSON bool, items []T, empty, header string, row func(T) string) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, it := range items {
			if err := enc.Encode(it); err != nil {
				return err
			}
		}
		return nil
	}
	if len(items) == 0 {
		_, err := fmt.Fprintln(w, empty)
		return err
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, it := range items {
		fmt.Fprintln(tw, row(it))
	}
	return tw.Flush()
}
