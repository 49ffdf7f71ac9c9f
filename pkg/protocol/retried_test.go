package protocol

import "testing"

func TestRetriedBefore(t *testing.T) {
	codes := []string{"A", "B"}
	for attempt, want := range map[int]string{0: "", 1: "", 2: "A", 3: "B", 4: ""} {
		if got := RetriedBefore(codes, attempt); got != want {
			t.Errorf("RetriedBefore(%q, %d) = %q, want %q", codes, attempt, got, want)
		}
	}
}
