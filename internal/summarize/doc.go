// Package summarize keeps long conversations cheap (seed 001 §2.3, §6): a worker with its own
// durable consumer on the model's decisions asks the LLM, every N messages of a session whose
// conversation is read from the record (POST /v1/chat; a client that sends its history keeps
// it itself), to compress the conversation — the latest summary and the messages since — and
// records the summary as an event (llm_summary.v1 on hermes.event.summary.<session>). The next
// turn's prompt is then the latest summary, the last exchange it covers word for word, and
// the messages since it (Latest, Since, Conversation). Summaries cover whole decisions, each
// of which holds a tool call together with its results, so a call is never parted from its
// result. The messages a summary stands for stay in the record.
//
// A summary that fails leaves the session unsummarized — its conversation goes on, whole —
// and is tried again: the decision that asked for it is redelivered with a growing delay, a
// few times, and after that the session's next decision asks again; a request the model
// refuses (too long, say) is not repeated. Nothing waits for a summary.
package summarize
