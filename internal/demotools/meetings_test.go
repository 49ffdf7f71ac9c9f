package demotools

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermesbus/hermes/pkg/contract"
	"github.com/hermesbus/hermes/pkg/worker"
)

// The meeting tools answer the seed's conversation (agent-meeting.yaml): free slots of 张伟 and
// 李娜, a meeting for both, a notice to both.
func TestTheMeetingToolsAnswerTheSeedsConversation(t *testing.T) {
	ctx := context.Background()
	slots, err := freeSlots(ctx, FreeSlotsIn{UserID: "zhangwei", Date: "2025-01-15"})
	if err != nil || slots.DurationMinutes != 60 || len(slots.Slots) == 0 || !slices.Contains(slots.Busy, "12:00-13:00") {
		t.Fatalf("free slots: %+v %v", slots, err)
	}
	for _, sl := range slots.Slots {
		a, b, ok := strings.Cut(sl, "-")
		s, err1 := time.Parse("15:04", a)
		e, err2 := time.Parse("15:04", b)
		if !ok || err1 != nil || err2 != nil || e.Sub(s) != time.Hour || a < "09:00" || b > "18:00" {
			t.Errorf("slot %q is not an hour within office hours", sl)
		}
		for _, bz := range slots.Busy {
			c, d, _ := strings.Cut(bz, "-")
			if a < d && c < b {
				t.Errorf("slot %s overlaps busy %s", sl, bz)
			}
		}
	}
	other, _ := freeSlots(ctx, FreeSlotsIn{UserID: "lina", Date: "2025-01-15"})
	again, _ := freeSlots(ctx, FreeSlotsIn{UserID: "zhangwei", Date: "2025-01-15"})
	if !slices.Equal(again.Slots, slots.Slots) || slices.Equal(other.Busy, slots.Busy) && slices.Equal(other.Slots, slots.Slots) && len(slots.Busy) > 1 {
		t.Logf("zhangwei %v, lina %v", slots.Busy, other.Busy)
	}
	if !slices.Equal(again.Slots, slots.Slots) {
		t.Error("the same question got another answer")
	}

	m, err := bookMeeting(ctx, MeetingIn{Title: "项目讨论会", Attendees: []string{"zhangwei", "lina"}, StartTime: "2025-01-15T09:00:00", DurationMinutes: 60})
	if err != nil || !strings.HasPrefix(m.EventID, "evt_") || m.Status != "created" || m.Start != "2025-01-15T09:00:00+08:00" || m.End != "2025-01-15T10:00:00+08:00" || m.Location == "" {
		t.Fatalf("book: %+v %v", m, err)
	}
	if m2, _ := bookMeeting(ctx, MeetingIn{Title: "项目讨论会", Attendees: []string{"zhangwei", "lina"}, StartTime: "2025-01-15T09:00:00+08:00", DurationMinutes: 60}); m2.EventID != m.EventID {
		t.Errorf("the same booking again is another event: %s, %s", m.EventID, m2.EventID)
	}
	n, err := sendNotice(ctx, NotifyIn{UserIDs: []string{"zhangwei", "lina"}, Message: "会议已创建：项目讨论会，1/15 09:00"})
	if err != nil || n.Status != "ok" || n.Channel != "push" || !slices.Equal(n.SentTo, []string{"zhangwei", "lina"}) || !strings.HasPrefix(n.MessageID, "MSG-") {
		t.Fatalf("notify: %+v %v", n, err)
	}

	// Their declared failures.
	var te *worker.ToolError
	if _, err := freeSlots(ctx, FreeSlotsIn{UserID: "zhangwei", Date: "2025-02-30"}); !errors.As(err, &te) || te.Code != codeInvalidDate {
		t.Errorf("a date that does not exist: %v", err)
	}
	if _, err := bookMeeting(ctx, MeetingIn{Title: "x", Attendees: []string{"a"}, StartTime: "tomorrow morning"}); !errors.As(err, &te) || te.Code != codeInvalidStart {
		t.Errorf("a start that is no time: %v", err)
	}
	if _, err := sendNotice(ctx, NotifyIn{UserIDs: []string{"nobody"}, Message: "x"}); !errors.As(err, &te) || te.Code != codeInvalidUser {
		t.Errorf("an unknown user: %v", err)
	}
}

// Their contracts, derived from the Go types, say what the seed's tools take, and compile.
func TestTheMeetingToolsContracts(t *testing.T) {
	tools := MeetingTools()
	if len(tools) != len(MeetingToolNames) {
		t.Fatalf("%d tools", len(tools))
	}
	for i, d := range tools {
		if d.Err() != nil || d.Name() != MeetingToolNames[i] {
			t.Fatalf("%s: %v", d.Name(), d.Err())
		}
		c := d.Contract()
		k, err := contract.Compile(&c, 1, 1)
		if err != nil {
			t.Fatalf("%s: %v", d.Name(), err)
		}
		for _, cs := range k.Cases() {
			if cs.Kind == contract.CaseValid && k.CheckInput(cs.Arguments) != nil {
				t.Errorf("%s: %s", d.Name(), cs.Name)
			}
		}
	}
	slots := tools[0].Contract()
	k, _ := contract.Compile(&slots, 1, 1)
	if err := k.CheckInput([]byte(`{"user_id":"zhangwei","date":"2025-01-15"}`)); err != nil {
		t.Errorf("the seed's arguments: %v", err)
	}
	if err := k.CheckInput([]byte(`{"user_id":"zhangwei"}`)); err == nil || !strings.Contains(err.Error(), "date") {
		t.Errorf("date missing: %v", err)
	}
	if notify := tools[2].Contract(); notify.EffectsOrDefault() != contract.EffectsSideEffects {
		t.Errorf("notify_send's effects: %s", notify.Effects)
	}
}
