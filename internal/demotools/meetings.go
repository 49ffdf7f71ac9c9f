package demotools

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hermesbus/hermes/pkg/hermes"
)

// The seed's meeting tools (seed 001 §4, ../shared/seed-examples/agent-meeting.yaml) are Go
// functions served with the SDK (package pkg/hermes), beside the HTTP tools: both kinds of tool
// run wherever the demo tools do. Their arguments are the seed's; their contracts come from
// the types below and are registered as the tools are served.

// Office hours of the demo calendar, in demoZone.
const (
	dayStartHour = 9
	dayEndHour   = 18
	maxSlots     = 24
)

// FreeSlotsIn is calendar_free_slots' arguments.
type FreeSlotsIn struct {
	UserID          string `json:"user_id" jsonschema:"description=参与者ID（如 zhangwei）,pattern=^[a-z][a-z0-9_.-]*$,maxLength=64,example=zhangwei"`
	Date            string `json:"date" jsonschema:"description=日期，格式YYYY-MM-DD,pattern=^[0-9]{4}-[0-9]{2}-[0-9]{2}$,example=2025-01-15"`
	DurationMinutes int    `json:"duration_minutes,omitempty" jsonschema:"description=会议时长（分钟），默认 60,minimum=15,maximum=480"`
}

// FreeSlotsOut is its answer: the free and busy spans of the day as "HH:MM-HH:MM".
type FreeSlotsOut struct {
	UserID          string   `json:"user_id"`
	Date            string   `json:"date"`
	Timezone        string   `json:"timezone"`
	DurationMinutes int      `json:"duration_minutes"`
	Slots           []string `json:"slots"`
	Busy            []string `json:"busy"`
	Note            string   `json:"note,omitempty"`
}

// MeetingIn is meeting_book's arguments.
type MeetingIn struct {
	Title           string   `json:"title" jsonschema:"description=会议主题,minLength=1,maxLength=200"`
	Attendees       []string `json:"attendees" jsonschema:"description=参与者ID列表,minItems=1,maxItems=50"`
	StartTime       string   `json:"start_time" jsonschema:"description=开始时间，ISO格式（如 2025-01-15T09:00:00，不带时区按 UTC+08:00）,minLength=16,maxLength=40,example=2025-01-15T09:00:00"`
	DurationMinutes int      `json:"duration_minutes,omitempty" jsonschema:"description=时长（分钟），默认 60,minimum=15,maximum=480"`
	Location        string   `json:"location,omitempty" jsonschema:"description=地点（默认分配会议室）,maxLength=200"`
}

// MeetingOut is its answer.
type MeetingOut struct {
	EventID         string   `json:"event_id"`
	Status          string   `json:"status" jsonschema:"enum=created"`
	Title           string   `json:"title"`
	Start           string   `json:"start"`
	End             string   `json:"end"`
	DurationMinutes int      `json:"duration_minutes"`
	Attendees       []string `json:"attendees"`
	Location        string   `json:"location"`
	JoinURL         string   `json:"join_url"`
}

// NotifyIn is notify_send's arguments.
type NotifyIn struct {
	UserIDs []string `json:"user_ids" jsonschema:"description=接收人ID列表,minItems=1,maxItems=100"`
	Message string   `json:"message" jsonschema:"description=通知内容,minLength=1,maxLength=2000"`
	Channel string   `json:"channel,omitempty" jsonschema:"description=渠道，默认 push,enum=push,enum=sms,enum=email"`
}

// NotifyOut is its answer.
type NotifyOut struct {
	MessageID string   `json:"message_id"`
	Status    string   `json:"status" jsonschema:"enum=ok"`
	Channel   string   `json:"channel"`
	SentTo    []string `json:"sent_to"`
}

// Failure codes of the meeting tools.
const (
	codeInvalidDate  = "INVALID_DATE"
	codeInvalidStart = "INVALID_START_TIME"
	codeInvalidUser  = "UNKNOWN_USER"
)

// MeetingTools returns the seed's meeting tools, for hermes.Serve.
func MeetingTools() []*hermes.Def {
	return []*hermes.Def{
		hermes.Tool("calendar_free_slots", "查询某位参与者在指定日期的空闲时间段（工作时间 09:00–18:00，UTC+08:00）", freeSlots,
			hermes.Errors(codeInvalidDate, codeInvalidUser), hermes.Level("L"), hermes.Timeout(3*time.Second), hermes.Effects("none")),
		hermes.Tool("meeting_book", "创建一个会议并邀请参与者，返回会议ID与入会链接", bookMeeting,
			hermes.Errors(codeInvalidStart, codeInvalidUser), hermes.Level("M"), hermes.Timeout(5*time.Second), hermes.Retries(1), hermes.Effects("idempotent")),
		hermes.Tool("notify_send", "向指定用户发送会议通知", sendNotice,
			hermes.Errors(codeInvalidUser), hermes.Level("M"), hermes.Timeout(5*time.Second), hermes.Retries(0), hermes.Effects("side_effects"), hermes.Recipients("user_ids")),
	}
}

// MeetingToolNames are the tools MeetingTools serves.
var MeetingToolNames = []string{"calendar_free_slots", "meeting_book", "notify_send"}

// ServeMeetings serves MeetingTools with cfg until ctx ends (hermes.Serve).
func ServeMeetings(ctx context.Context, cfg hermes.Config) error {
	return hermes.Serve(ctx, cfg, MeetingTools()...)
}

// checkUsers refuses the demo directory's reserved ids (so the tools have a declared failure
// to show): "nobody" and ids starting "unknown".
func checkUsers(ids ...string) error {
	for _, id := range ids {
		if strings.TrimSpace(id) == "" || id == "nobody" || strings.HasPrefix(id, "unknown") {
			return hermes.Fail(codeInvalidUser, "check the participant ids against the directory", fmt.Errorf("no user %q", id))
		}
	}
	return nil
}

// busyBlocks returns the demo calendar's meetings of user on day, sorted and not overlapping:
// lunch and a few meetings derived from the date and the user.
func busyBlocks(user string, day time.Time) [][2]time.Time {
	r := seeded("calendar", user, day.Format(dateLayout))
	at := func(halfHours int) time.Time { return day.Add(time.Duration(halfHours) * 30 * time.Minute) }
	busy := [][2]time.Time{{at(24), at(26)}} // lunch 12:00–13:00
	for range between(r, 1, 3) {
		start := between(r, 2*dayStartHour, 2*dayEndHour-1)
		end := min(start+between(r, 1, 4), 2*dayEndHour)
		busy = append(busy, [2]time.Time{at(start), at(end)})
	}
	slices.SortFunc(busy, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	merged := busy[:1]
	for _, iv := range busy[1:] {
		last := &merged[len(merged)-1]
		if !iv[0].After(last[1]) {
			if iv[1].After(last[1]) {
				last[1] = iv[1]
			}
			continue
		}
		merged = append(merged, iv)
	}
	return merged
}

func span(iv [2]time.Time) string { return iv[0].Format("15:04") + "-" + iv[1].Format("15:04") }

// freeSlots is calendar_free_slots: the free slots of the given length in the user's day.
func freeSlots(_ context.Context, in FreeSlotsIn) (FreeSlotsOut, error) {
	if err := checkUsers(in.UserID); err != nil {
		return FreeSlotsOut{}, err
	}
	day, err := time.ParseInLocation(dateLayout, in.Date, demoZone)
	if err != nil {
		return FreeSlotsOut{}, hermes.Fail(codeInvalidDate, `give a real date as YYYY-MM-DD, e.g. "2026-03-16"`, err)
	}
	minutes := in.DurationMinutes
	if minutes == 0 {
		minutes = 60
	}
	length := time.Duration(minutes) * time.Minute
	busy := busyBlocks(in.UserID, day)
	out := FreeSlotsOut{UserID: in.UserID, Date: day.Format(dateLayout), Timezone: demoZoneName, DurationMinutes: minutes, Slots: []string{}, Busy: []string{}}
	cursor, end := day.Add(dayStartHour*time.Hour), day.Add(dayEndHour*time.Hour)
	for _, b := range append(busy, [2]time.Time{end, end}) {
		for ; !cursor.Add(length).After(b[0]) && len(out.Slots) < maxSlots; cursor = cursor.Add(length) {
			out.Slots = append(out.Slots, span([2]time.Time{cursor, cursor.Add(length)}))
		}
		if b[1].After(cursor) {
			cursor = b[1]
		}
	}
	for _, b := range busy {
		out.Busy = append(out.Busy, span(b))
	}
	if len(out.Slots) == 0 {
		out.Note = fmt.Sprintf("no free slot of %d minutes on %s; try a shorter duration or another day", minutes, out.Date)
	}
	return out, nil
}

var meetingRooms = []string{"Room 3A 长城", "Room 5C 黄河", "Room 7B 泰山", "Room 2F 西湖"}

// startTime reads an ISO time: RFC 3339, or without a zone (then UTC+08:00), seconds optional.
func startTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04Z07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04"} {
		if t, err := time.ParseInLocation(layout, s, demoZone); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an ISO time such as 2025-01-15T09:00:00", s)
}

// bookMeeting is meeting_book. The same booking asked again (a retry) gets the same event id.
func bookMeeting(_ context.Context, in MeetingIn) (MeetingOut, error) {
	if err := checkUsers(in.Attendees...); err != nil {
		return MeetingOut{}, err
	}
	start, err := startTime(in.StartTime)
	if err != nil {
		return MeetingOut{}, hermes.Fail(codeInvalidStart, `give start_time as an ISO time, e.g. "2025-01-15T09:00:00"`, err)
	}
	minutes := in.DurationMinutes
	if minutes == 0 {
		minutes = 60
	}
	r := seeded(append([]string{"meeting", in.Title, start.UTC().Format(time.RFC3339), fmt.Sprint(minutes), in.Location}, in.Attendees...)...)
	location := in.Location
	if location == "" {
		location = pick(r, meetingRooms)
	}
	id := "evt_" + strings.ToLower(fakeID(r, "", 10))
	local := start.In(demoZone)
	return MeetingOut{EventID: id, Status: "created", Title: in.Title, Start: local.Format(time.RFC3339),
		End: local.Add(time.Duration(minutes) * time.Minute).Format(time.RFC3339), DurationMinutes: minutes,
		Attendees: in.Attendees, Location: location, JoinURL: "https://meet.example.com/" + id}, nil
}

// sendNotice is notify_send (nothing is sent anywhere: a demo).
func sendNotice(_ context.Context, in NotifyIn) (NotifyOut, error) {
	if err := checkUsers(in.UserIDs...); err != nil {
		return NotifyOut{}, err
	}
	channel := in.Channel
	if channel == "" {
		channel = "push"
	}
	r := seeded(append([]string{"notify", channel, in.Message}, in.UserIDs...)...)
	return NotifyOut{MessageID: fakeID(r, "MSG-", 12), Status: "ok", Channel: channel, SentTo: in.UserIDs}, nil
}
