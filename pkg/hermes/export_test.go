package hermes

import (
	"context"
	"encoding/json"
)

// Call runs d's function as a worker would, for tests.
func Call(d *Def, ctx context.Context, args json.RawMessage) (any, error) { return d.fn(ctx, args) }
