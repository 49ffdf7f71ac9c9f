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
//
// A sandbox request's calls go under the candidate it names instead (read by revision from
// Versions), unchecked: the sandbox sends invalid arguments on purpose, and judges what the
// tool makes of them itself.
type ContractStage struct {
	// Contracts returns a tool's contract now (registry.Live.Current): nil when it has none.
	Contracts func(tool string) (*contract.Compiled, error)
	// Versions reads the candidates sandbox requests name (contract.Versions.At).
	Versions func(ctx context.Context, key string, revision uint64) (*contract.Compiled, error)
	// Candidate returns the revision of tool's candidate kept now (0: none). A sandbox request
	// runs only while the candidate it names is the one kept: a request replayed (or forged)
	// after its sandbox ended finds it gone.
	Candidate func(ctx context.Context, tool string) (uint64, error)
}

// Name is "contract".
func (s *ContractStage) Name() string { return "contract" }

// Process checks job's pending calls.
func (s *ContractStage) Process(ctx context.Context, job *Job) (Verdict, error) {
	if sb := job.Req.Sandbox; sb != nil {
		return s.candidate(ctx, job, sb)
	}
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

// candidate gives a sandbox request's calls the candidate contract they try.
func (s *ContractStage) candidate(ctx context.Context, job *Job, sb *protocol.Sandbox) (Verdict, error) {
	var k *contract.Compiled
	var err error
	var kept uint64
	switch {
	case s.Versions == nil || s.Candidate == nil:
		err = fmt.Errorf("%w: this router reads no candidates", contract.ErrUnavailable)
	default:
		if kept, err = s.Candidate(ctx, sb.Tool); err != nil {
			return Continue(), fmt.Errorf("contract stage: read the candidate of %s: %w", sb.Tool, err)
		}
		if kept != sb.Revision {
			err = fmt.Errorf("%w: the candidate of %s at revision %d is no longer the one tried", contract.ErrUnavailable, sb.Tool, sb.Revision)
		} else {
			k, err = s.Versions(ctx, protocol.SandboxKey(sb.Tool), sb.Revision)
		}
	}
	if err != nil && !errors.Is(err, contract.ErrUnavailable) {
		return Continue(), fmt.Errorf("contract stage: read the candidate of %s: %w", sb.Tool, err)
	}
	for _, c := range job.Calls {
		switch {
		case !c.Pending():
		case err != nil:
			job.Log.Info("the candidate a sandbox request tries cannot be read", "tool", sb.Tool, "revision", sb.Revision, "err", err)
			c.Decide(protocol.ErrorResult(protocol.CodeContractUnavailable, protocol.OriginHermes,
				"the sandbox's candidate contract is gone (the sandbox ended); run the sandbox again", err.Error()), "")
		default:
			c.Contract = k
		}
	}
	return Continue(), nil
}
