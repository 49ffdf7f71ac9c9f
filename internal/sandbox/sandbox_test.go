package sandbox

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/protocol"
)

// What each result of a case means, for valid and invalid cases.
func TestJudgeCase(t *testing.T) {
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	ok := protocol.ToolResult{Status: protocol.ResultOK, Content: json.RawMessage(`{}`)}
	violation := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeContractViolation, ErrorOrigin: protocol.OriginTool, Content: str("failure.error_code: is \"X \"")}
	declared := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: "ORDER_NOT_FOUND", ToolErrorCode: "ORDER_NOT_FOUND", ErrorOrigin: protocol.OriginTool, ContractVersion: 1}
	http4xx := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeToolHTTP4xx, ErrorOrigin: protocol.OriginTool, RecoveryHint: "HTTP 404: not found"}
	http5xx := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeToolHTTP5xx, ErrorOrigin: protocol.OriginTool, RecoveryHint: "HTTP 500: boom"}
	noRoute := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeNoRoute, ErrorOrigin: protocol.OriginHermes, Content: str("no route")}
	badArgs := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeBadArguments, ErrorOrigin: protocol.OriginHermes, Content: str("path parameter")}
	cancelled := protocol.ToolResult{Status: protocol.ResultError, ErrorCode: protocol.CodeCancelled, ErrorOrigin: protocol.OriginHermes}
	for _, tc := range []struct {
		kind contract.CaseKind
		r    protocol.ToolResult
		want string
	}{
		{contract.CaseValid, ok, CasePassed},
		{contract.CaseValid, declared, CasePassed},
		{contract.CaseValid, violation, CaseViolation},
		{contract.CaseBoundary, http5xx, CaseViolation},
		{contract.CaseValid, http4xx, CaseWarning},
		{contract.CaseValid, noRoute, CaseViolation},
		{contract.CaseValid, cancelled, CaseUnfinished},
		{contract.CaseInvalid, ok, CaseWarning},
		{contract.CaseInvalid, violation, CaseWarning},
		{contract.CaseInvalid, http4xx, CasePassed},
		{contract.CaseInvalid, declared, CasePassed},
		{contract.CaseInvalid, badArgs, CasePassed},
		{contract.CaseInvalid, cancelled, CaseUnfinished},
	} {
		cr := CaseResult{Kind: tc.kind}
		judgeCase(&cr, &tc.r)
		if cr.Outcome != tc.want {
			t.Errorf("%s case, %s: %s (%s); want %s", tc.kind, tc.r.ErrorCode, cr.Outcome, cr.Detail, tc.want)
		}
	}
}

// A report kept with a contract stays within its bound, dropping passed cases first.
func TestAReportKeptIsBounded(t *testing.T) {
	rep := &Report{Tool: "t", Verdict: Refused}
	big := strings.Repeat("x", 400)
	for i := range 200 {
		outcome := CasePassed
		if i%10 == 0 {
			outcome = CaseViolation
		}
		rep.Cases = append(rep.Cases, CaseResult{ID: "c", Kind: contract.CaseValid, Name: big, Arguments: json.RawMessage(`{}`), Outcome: outcome, Detail: big})
	}
	kept := rep.Kept()
	var back Report
	if err := json.Unmarshal(kept, &back); err != nil || len(kept) > MaxKeptBytes || back.Left == 0 || len(back.Cases)+back.Left != 200 {
		t.Fatalf("%d bytes, %d cases, %d left: %v", len(kept), len(back.Cases), back.Left, err)
	}
	for _, c := range back.Cases {
		if c.Outcome == CasePassed {
			t.Fatal("a passed case kept before a violation")
		}
	}
}
