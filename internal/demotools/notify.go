package demotools

import (
	"fmt"
	"net/http"
	"net/mail"
	"regexp"
	"strings"
	"unicode/utf8"
)

const (
	maxRecipients     = 100
	maxMessageRunes   = 2000
	smsSegmentRunes   = 70
	recipientsExample = `e.g. ["li.lei@example.com"] for email, ["+8613800138000"] for sms, ["user-42"] for push`
)

var (
	phonePattern     = regexp.MustCompile(`^\+?[0-9][0-9 -]{5,18}[0-9]$`)
	pushTokenPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
)

// notifySend is notify_send: sends a message to recipients over email, sms or push.
func (s *server) notifySend(r *http.Request, a args) (any, error) {
	channel, ok, err := a.str("channel")
	if err != nil {
		return nil, err
	}
	const channelWant = `one of "email", "sms", "push"`
	if !ok {
		return nil, missingArg("channel", channelWant)
	}
	channel = strings.ToLower(channel)
	if channel != "email" && channel != "sms" && channel != "push" {
		return nil, badArg("channel", channelWant, quote(channel)+" is not a channel")
	}
	recipients, ok, err := a.list("recipients")
	if err != nil {
		return nil, err
	}
	want := fmt.Sprintf("an array of 1 to %d recipients, %s", maxRecipients, recipientsExample)
	if !ok {
		return nil, missingArg("recipients", want)
	}
	if len(recipients) > maxRecipients {
		return nil, badArg("recipients", want, fmt.Sprintf("%d recipients", len(recipients)))
	}
	for i, rc := range recipients {
		field := fmt.Sprintf("recipients[%d]", i)
		switch channel {
		case "email":
			addr, err := mail.ParseAddress(rc)
			if err != nil {
				return nil, badArg(field, "an e-mail address for channel email", quote(rc)+" is not an e-mail address")
			}
			recipients[i] = strings.ToLower(addr.Address)
		case "sms":
			if !phonePattern.MatchString(rc) {
				return nil, badArg(field, "a phone number such as \"+8613800138000\" for channel sms", quote(rc)+" is not a phone number")
			}
		case "push":
			if !pushTokenPattern.MatchString(rc) {
				return nil, badArg(field, "a user or device id of letters, digits, '_', '.', ':', '-' for channel push", quote(rc)+" is not a push target")
			}
		}
	}
	message, ok, err := a.str("message")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, missingArg("message", "the text to send")
	}
	runes := utf8.RuneCountInString(message)
	if runes > maxMessageRunes {
		return nil, badArg("message", fmt.Sprintf("a text of at most %d characters", maxMessageRunes), fmt.Sprintf("%d characters", runes))
	}
	subject, _, err := a.str("subject")
	if err != nil {
		return nil, err
	}

	seed := append([]string{"notify", r.Header.Get("Idempotency-Key"), channel, message}, recipients...)
	rnd := seeded(seed...)
	messageID := fakeID(rnd, "MSG-", 12)
	results := make([]map[string]string, len(recipients))
	for i, rc := range recipients {
		results[i] = map[string]string{"recipient": rc, "status": "delivered"}
	}
	out := map[string]any{
		"message_id": messageID,
		"channel":    channel,
		"status":     "delivered",
		"delivered":  len(recipients),
		"failed":     0,
		"recipients": results,
		"sent_at":    s.now().In(demoZone).Format("2006-01-02T15:04:05Z07:00"),
	}
	switch channel {
	case "sms":
		out["segments"] = (runes + smsSegmentRunes - 1) / smsSegmentRunes
	case "email":
		if subject == "" {
			subject = firstRunes(message, 30)
		}
		out["subject"] = subject
	}
	return out, nil
}

// firstRunes returns s cut to at most n runes, marking a cut with "…".
func firstRunes(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
