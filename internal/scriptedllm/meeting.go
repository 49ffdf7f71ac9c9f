package scriptedllm

import _ "embed"

//go:embed meeting.yaml
var meetingYAML []byte

// Meeting is the scripted meeting assistant of seed 001 §4 (meeting.yaml): the seed's flow
// (calendar_free_slots ×2 → meeting_book → notify_send → the answer), and a variant in which
// a tool fails and the model recovers.
func Meeting() *Script {
	s, err := Parse(meetingYAML)
	if err != nil {
		panic("scriptedllm: meeting.yaml: " + err.Error())
	}
	return s
}
