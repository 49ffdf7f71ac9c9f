package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// Contracts gives a worker the version of a tool's contract a call was routed under
// (registry.Live). An error wrapping contract.ErrUnavailable says that version cannot be had
// (no longer kept, or damaged); any other is passing (the bucket out of reach).
type Contracts interface {
	// At reads the version kept under key (protocol.ContractRef.Key) at revision.
	At(ctx context.Context, key string, revision uint64) (*contract.Compiled, error)
}

// Answered says what part of an Outcome the tool itself said, for its contract to judge.
type Answered int

const (
	// NotAnswered: Hermes' verdict on a try that got no answer (a timeout, a refusal, an
	// unreachable tool); no contract judges it.
	NotAnswered Answered = iota
	// AnsweredBody: Content is the tool's whole answer as given (an HTTP body), under a
	// success or an error status (Result.Status).
	AnsweredBody
	// AnsweredValue: Content is a value the tool returned (a Go function's result), or the
	// failure it reported (Result.ToolErrorCode and RecoveryHint).
	AnsweredValue
)

// CheckContracts judges every answer of a call routed under a contract (Dispatch.Contract)
// against that version of it, whatever was registered since: the answer as given when it keeps
// the contract; a declared failure's error_code and recovery_hint made the result's (origin
// tool); CONTRACT_VIOLATION (origin tool, not retried) saying what was wrong when it breaks it,
// the answer kept in the result's rejected_content for whoever debugs the tool and never
// delivered. The version is read before the tool is called: a call whose version cannot be had
// is answered CONTRACT_UNAVAILABLE without calling the tool (its answer could not be judged).
// With contracts nil, every call routed under a contract is answered so.
func CheckContracts(contracts Contracts) Middleware {
	return func(next Executor) Executor {
		return wrap(next, func(ctx context.Context, call *Call) (Outcome, error) {
			ref := call.Dispatch.Contract
			if ref == nil {
				return next.Execute(ctx, call)
			}
			if contracts == nil {
				return unavailable(ref, errors.New("this worker reads no contracts")), nil
			}
			k, err := contracts.At(ctx, ref.Key(), ref.Revision)
			switch {
			case errors.Is(err, contract.ErrUnavailable):
				return unavailable(ref, err), nil
			case err != nil:
				return Outcome{}, fmt.Errorf("worker: read the contract of %s (version %d): %w", ref.Name, ref.Version, err)
			}
			out, err := next.Execute(ctx, call)
			if err != nil {
				return out, err
			}
			return judge(k, out), nil
		})
	}
}

func unavailable(ref *protocol.ContractRef, err error) Outcome {
	out := Failed(protocol.CodeContractUnavailable, protocol.OriginHermes,
		fmt.Sprintf("version %d of the contract of %s cannot be read, so the tool was not called; send the call again to have it routed under the current version", ref.Version, ref.Name),
		err.Error(), false)
	out.Result.ContractVersion = ref.Version
	return out
}

// maxRejectedBytes bounds the rejected answer kept in a result: the reason and the answer must
// fit one bus message together.
const maxRejectedBytes = 64 << 10

// judge applies the contract's verdict on one outcome. A value a Go function returned under a
// shaped contract is passed on as {"success": value}. Whatever an executor says of its own
// outcome, a success is judged (as the tool's whole answer when the executor does not say it is
// a value), and so is a failure carrying a code that is not Hermes' own; only Hermes' verdicts on
// tries that got no answer (timeouts, refusals, unreachable tools) pass as they are.
func judge(k *contract.Compiled, out Outcome) Outcome {
	out.Result.ContractVersion = k.Version
	res := &out.Result
	errorStatus := res.Status == protocol.ResultError
	var v contract.Verdict
	switch {
	case out.Answered == AnsweredValue && !errorStatus:
		v = k.CheckValue(res.Content)
		if v.Violation == "" && k.Shaped() {
			// One success shape whatever kind of tool answered: a shaped contract's
			// {"success": …}, as an HTTP tool under it answers.
			res.Content = append(append(json.RawMessage(`{"success":`), res.Content...), '}')
		}
	case out.Answered == AnsweredValue:
		v = k.CheckFailure(res.ToolErrorCode, res.RecoveryHint)
	case out.Answered == AnsweredBody || !errorStatus:
		v = k.CheckOutput(res.Content, errorStatus)
		if errorStatus && v == (contract.Verdict{}) && k.Shaped() {
			// An error status without the contract's shape (a proxy's page, say): Hermes'
			// verdict stands (retried as such), but nothing the contract does not declare is
			// passed on as the tool's: not its body, not its hint, not a code of its own.
			withhold(res, "the tool answered an error status without its contract's shape")
			if res.ToolErrorCode != "" && k.CheckFailure(res.ToolErrorCode, res.RecoveryHint).Violation != "" {
				res.ToolErrorCode = ""
			}
			if res.ToolErrorCode == "" {
				res.RecoveryHint = "the tool answered an error without its contract's shape (kept in the record); "
				if out.Retryable {
					res.RecoveryHint += "the call may succeed later"
				} else {
					res.RecoveryHint += "check the arguments against the tool's contract"
				}
			}
			return out
		}
	case res.ErrorOrigin == protocol.OriginTool && !protocol.IsHermesCode(res.ErrorCode):
		// A failure the executor gives as the tool's, with a code of the tool's own.
		v = k.CheckFailure(res.ErrorCode, res.RecoveryHint)
	default:
		return out
	}
	switch {
	case v.Violation != "":
		bad := Failed(protocol.CodeContractViolation, protocol.OriginTool,
			fmt.Sprintf("%s answered outside version %d of its contract, so its answer is not passed on; its owner must fix the tool (the answer is kept in the record)", k.Name, k.Version),
			v.Violation, false)
		bad.Result.ExecutionTimeMS, bad.Result.ContractVersion = res.ExecutionTimeMS, k.Version
		bad.Result.Rejected = rejected(res.Content)
		return bad
	case v.Failure:
		declared := protocol.ErrorResult(v.Code, protocol.OriginTool, v.Hint, res.Content)
		declared.ToolErrorCode, declared.ExecutionTimeMS, declared.ContractVersion = v.Code, res.ExecutionTimeMS, k.Version
		out.Result = declared
		out.Retryable = out.Retryable && errorStatus
	case errorStatus && res.ErrorCode != "" && !protocol.IsHermesCode(res.ErrorCode):
		// A code the contract does not judge (a plain contract's failure, an executor's own)
		// is not declared: the tool's word, in tool_error_code, as without a contract.
		if res.ToolErrorCode == "" {
			res.ToolErrorCode = protocol.ToolCode(res.ErrorCode)
		}
		res.ErrorCode = protocol.CodeToolFailed
	}
	return out
}

// withhold keeps r's content in Rejected only, with reason in its place.
func withhold(r *protocol.ToolResult, reason string) {
	if len(r.Content) == 0 {
		return
	}
	r.Rejected = rejected(r.Content)
	r.Content, _ = json.Marshal(reason)
}

// rejected is content as kept beside a refusal: as it is, or cut (as a JSON string) when it would
// not fit one bus message with the reason.
func rejected(content json.RawMessage) json.RawMessage {
	if len(content) <= maxRejectedBytes {
		return content
	}
	cut, _ := json.Marshal(protocol.Shorten(string(content), maxRejectedBytes) + "…")
	return cut
}

// declaredCode reports whether r's error_code is a tool's own code its contract declared
// (judge made it so): kept as it is rather than folded into TOOL_FAILED.
func declaredCode(r *protocol.ToolResult) bool {
	return r.ContractVersion > 0 && r.ErrorOrigin == protocol.OriginTool && r.ToolErrorCode == r.ErrorCode && protocol.ToolCode(r.ErrorCode) == r.ErrorCode
}
