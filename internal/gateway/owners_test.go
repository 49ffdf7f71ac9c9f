package gateway

import (
	"testing"
)

// An owner record is read from a bucket others may write: whatever it holds, decoding ends
// with an owner or an error, never a panic, and never an empty owner.
func FuzzDecodeOwner(f *testing.F) {
	f.Add([]byte(`{"owner":"key:abc#alice","since":"2026-12-01T00:00:00Z"}`))
	f.Add([]byte(`{"owner":""}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"owner":"x","since":"yesterday"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := decodeOwner(data)
		if err == nil && (rec == nil || rec.Owner == "") {
			t.Fatalf("%q decoded to %+v", data, rec)
		}
	})
}
