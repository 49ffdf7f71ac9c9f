package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/hermesbus/hermes/internal/registry"
	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// ContractStage checks each pending call against its tool's contract, as registered now: a
// call whose arguments break the input schema is answered BAD_ARGUMENTS (origin hermes, naming
// the field and the rule, with a hint the caller can act on) and never reaches the tool; the
// others carry their contract on to the route stage, which applies its execution policy and
// reach and names its version in the dispatch (the worker checks the answer under that
// version). A tool whose contract record cannot be read is answered CONTRACT_UNAVAILABLE rather
// than called unchecked. Tools without a contract pass as they are.
type ContractStage struct {
	// Contracts returns a tool's contract now (registry.Live.Current): nil when it has none.
	Contracts func(tool string) (*contract.Compiled, error)
}

// Name is "contract".
func (s *ContractStage) Name() string { return "contract" }

// Process checks job's pending calls.
func (s *ContractStage) Process(_ context.Context, job *Job) (Verdict, error) {
	for _, c := range job.Calls {
		if !c.Pending() {
			continue
		}
		k, err := s.Contracts(c.Call.Name)
		if errors.Is(err, registry.ErrNotFollowing) {
			// Not known for the moment (the watch is being made again): tried again later.
			return Continue(), fmt.Errorf("contract stage: %w", err)
		}
		if err != nil {
			job.Log.Warn("the tool's contract cannot be read; call refused", "tool", c.Call.Name, "tool_call_id", c.Call.ToolCallID, "err", err)
			c.Decide(protocol.ErrorResult(protocol.CodeContractUnavailable, protocol.OriginHermes,
				"the tool's contract cannot be read; an operator must register it again (hermes tools register)", "the contract of "+c.Call.Name+" cannot be read"), "")
			continue
		}
		if k == nil {
			continue
		}
		c.Contract = k
		if err := k.CheckInput(c.Call.Arguments); err != nil {
			hint := "call " + c.Call.Name + " again with arguments that follow its input_schema"
			var ae *contract.ArgumentsError
			if errors.As(err, &ae) {
				hint = ae.Hint
			}
			job.Log.Info("arguments break the tool's contract; not dispatched", "tool", c.Call.Name, "tool_call_id", c.Call.ToolCallID, "contract_version", k.Version, "problems", err.Error())
			r := protocol.ErrorResult(protocol.CodeBadArguments, protocol.OriginHermes, hint, err.Error())
			r.ContractVersion = k.Version
			c.Decide(r, "")
		}
	}
	return Continue(), nil
}
