package demotools

import (
	"fmt"
	"net/http"
	"net/mail"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Office hours of the demo calendar, in demoZone.
const (
	dayStartHour = 9
	dayEndHour   = 18
	maxSlots     = 24
)

// interval is a span of time [Start, End).
type interval struct{ Start, End time.Time }

func (iv interval) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, `{"start":%q,"end":%q}`, iv.Start.Format(time.RFC3339), iv.End.Format(time.RFC3339)), nil
}

// busyBlocks returns the demo calendar's meetings on day, sorted and not overlapping: lunch
// and a few meetings derived from the date.
func busyBlocks(day time.Time) []interval {
	r := seeded("calendar", day.Format(dateLayout))
	at := func(halfHours int) time.Time { return day.Add(time.Duration(halfHours) * 30 * time.Minute) }
	busy := []interval{{at(24), at(26)}} // lunch 12:00–13:00
	for range between(r, 2, 4) {
		start := between(r, 2*dayStartHour, 2*dayEndHour-1)
		iv := interval{at(start), at(start + between(r, 1, 3))}
		if iv.End.After(at(2 * dayEndHour)) {
			iv.End = at(2 * dayEndHour)
		}
		busy = append(busy, iv)
	}
	slices.SortFunc(busy, func(a, b interval) int { return a.Start.Compare(b.Start) })
	merged := busy[:1]
	for _, iv := range busy[1:] {
		last := &merged[len(merged)-1]
		if !iv.Start.After(last.End) {
			if iv.End.After(last.End) {
				last.End = iv.End
			}
			continue
		}
		merged = append(merged, iv)
	}
	return merged
}

// calendarFreeSlots is calendar_free_slots: the free slots of the given length on a date.
func (s *server) calendarFreeSlots(_ *http.Request, a args) (any, error) {
	day, ok, err := a.date("date")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, missingArg("date", "the day to search as YYYY-MM-DD, e.g. \"2026-03-16\"")
	}
	minutes, ok, err := a.integer("duration_minutes", 5, 8*60)
	if err != nil {
		return nil, err
	}
	if !ok {
		minutes = 30
	}
	length := time.Duration(minutes) * time.Minute
	busy := busyBlocks(day)

	slots := []interval{}
	cursor := day.Add(dayStartHour * time.Hour)
	end := day.Add(dayEndHour * time.Hour)
	for _, b := range append(busy, interval{end, end}) {
		for ; !cursor.Add(length).After(b.Start) && len(slots) < maxSlots; cursor = cursor.Add(length) {
			slots = append(slots, interval{cursor, cursor.Add(length)})
		}
		if b.End.After(cursor) {
			cursor = b.End
		}
	}
	out := map[string]any{
		"date":             day.Format(dateLayout),
		"timezone":         demoZoneName,
		"working_hours":    map[string]string{"start": fmt.Sprintf("%02d:00", dayStartHour), "end": fmt.Sprintf("%02d:00", dayEndHour)},
		"duration_minutes": minutes,
		"slots":            slots,
		"busy":             busy,
	}
	if len(slots) == 0 {
		out["note"] = fmt.Sprintf("no free slot of %d minutes on %s; try a shorter duration or another day", minutes, day.Format(dateLayout))
	}
	return out, nil
}

// emailList reads argument field as a list of at least one and at most limit e-mail
// addresses, lower-cased and without display names.
func emailList(a args, field string, limit int) ([]string, error) {
	list, ok, err := a.list(field)
	if err != nil {
		return nil, err
	}
	want := fmt.Sprintf("an array of 1 to %d e-mail addresses, e.g. [\"li.lei@example.com\"]", limit)
	if !ok {
		return nil, missingArg(field, want)
	}
	if len(list) > limit {
		return nil, badArg(field, want, fmt.Sprintf("%d entries", len(list)))
	}
	out := make([]string, len(list))
	for i, s := range list {
		addr, err := mail.ParseAddress(s)
		if err != nil {
			return nil, badArg(fmt.Sprintf("%s[%d]", field, i), "an e-mail address such as \"li.lei@example.com\"",
				quote(s)+" is not an e-mail address")
		}
		out[i] = strings.ToLower(addr.Address)
	}
	return out, nil
}

var meetingRooms = []string{"Room 3A 长城", "Room 5C 黄河", "Room 7B 泰山", "Room 2F 西湖"}

// meetingBook is meeting_book: books a meeting and sends the invitations.
func (s *server) meetingBook(r *http.Request, a args) (any, error) {
	title, ok, err := a.str("title")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, missingArg("title", "the meeting's title, e.g. \"季度复盘\"")
	}
	if utf8.RuneCountInString(title) > 200 {
		return nil, badArg("title", "a title of at most 200 characters", "too long")
	}
	startText, ok, err := a.str("start")
	if err != nil {
		return nil, err
	}
	const startWant = "an RFC 3339 time, e.g. \"2026-03-16T10:00:00+08:00\""
	if !ok {
		return nil, missingArg("start", startWant)
	}
	start, perr := time.Parse(time.RFC3339, startText)
	if perr != nil {
		return nil, badArg("start", startWant, quote(startText)+" is not an RFC 3339 time")
	}
	minutes, ok, err := a.integer("duration_minutes", 5, 8*60)
	if err != nil {
		return nil, err
	}
	if !ok {
		minutes = 30
	}
	attendees, err := emailList(a, "attendees", 50)
	if err != nil {
		return nil, err
	}
	location, _, err := a.str("location")
	if err != nil {
		return nil, err
	}

	seed := []string{"meeting", r.Header.Get("Idempotency-Key"), title, start.UTC().Format(time.RFC3339), fmt.Sprint(minutes)}
	rnd := seeded(append(seed, attendees...)...)
	if location == "" {
		location = pick(rnd, meetingRooms)
	}
	end := start.Add(time.Duration(minutes) * time.Minute)
	invited := make([]map[string]string, len(attendees))
	for i, e := range attendees {
		invited[i] = map[string]string{"email": e, "invitation": "sent"}
	}
	bookingID := fakeID(rnd, "MTG-", 10)
	local := start.In(demoZone)
	return map[string]any{
		"booking_id":       bookingID,
		"status":           "confirmed",
		"title":            title,
		"start":            start.Format(time.RFC3339),
		"end":              end.Format(time.RFC3339),
		"duration_minutes": minutes,
		"location":         location,
		"attendees":        invited,
		"join_url":         "https://meet.example.com/" + strings.ToLower(bookingID),
		"confirmation": fmt.Sprintf("已预订会议「%s」：%s %s–%s（UTC+08:00），地点 %s，已向 %d 位参会人发送邀请。",
			title, local.Format(dateLayout), local.Format("15:04"), end.In(demoZone).Format("15:04"),
			location, len(attendees)),
	}, nil
}
