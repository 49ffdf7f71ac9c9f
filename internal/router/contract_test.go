package router

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// A sandbox request's calls run under the candidate it names only while that candidate is the
// one kept: one replayed or forged after its sandbox ended (or naming another revision) is
// answered CONTRACT_UNAVAILABLE, never dispatched; while it is kept, the calls skip the input
// check (some cases are invalid on purpose).
func TestASandboxRequestRunsOnlyWhileItsCandidateIsKept(t *testing.T) {
	t.Parallel()
	var c contract.Contract
	if err := json.Unmarshal([]byte(`{"name":"pay","input_schema":{"amount":{"type":"integer","required":true,"minimum":1}}}`), &c); err != nil {
		t.Fatal(err)
	}
	k, err := contract.Compile(&c, 1, 7)
	if err != nil {
		t.Fatal(err)
	}
	kept := uint64(7)
	stage := &ContractStage{
		Contracts: func(string) (*contract.Compiled, error) { return nil, nil },
		Versions: func(_ context.Context, key string, rev uint64) (*contract.Compiled, error) {
			if key != protocol.SandboxKey("pay") || rev != 7 {
				t.Errorf("read %s at %d", key, rev)
			}
			return k, nil
		},
		Candidate: func(context.Context, string) (uint64, error) { return kept, nil },
	}
	sandboxJob := func() *Job {
		j := job(t, "sandbox-pay-7-x", "sandbox-pay", false, "pay", "c")
		j.Req.Sandbox = &protocol.Sandbox{Tool: "pay", Revision: 7}
		j.Calls[0].Call.Arguments = json.RawMessage(`{"amount":-5}`)
		return j
	}
	j := sandboxJob()
	if _, err := stage.Process(t.Context(), j); err != nil || !j.Calls[0].Pending() || j.Calls[0].Contract != k {
		t.Fatalf("while kept: %+v %v", j.Calls[0], err)
	}
	for _, now := range []uint64{0, 8} { // deleted, or another try's since
		kept = now
		j = sandboxJob()
		if _, err := stage.Process(t.Context(), j); err != nil || j.Calls[0].Result == nil || j.Calls[0].Result.ErrorCode != protocol.CodeContractUnavailable {
			t.Fatalf("candidate now at %d: %+v %v", now, j.Calls[0], err)
		}
	}
}
